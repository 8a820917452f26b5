"""delta-rs's storage options for reading a Delta table on an object store: the same
settings the sink's ledger client takes (:mod:`connectors.lake.store`), by delta-rs's names."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from urllib.parse import urlparse

from connectors.lake.store import s3a_options

__all__ = ["delta_rs_options"]

# obstore's S3 config key (as s3a_options gives it) -> delta-rs's storage option name.
_DELTA_RS_NAMES: dict[str, str] = {
    "endpoint": "AWS_ENDPOINT_URL",
    "access_key_id": "AWS_ACCESS_KEY_ID",
    "secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "session_token": "AWS_SESSION_TOKEN",
    "region": "AWS_REGION",
    "virtual_hosted_style_request": "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
}


def delta_rs_options(location: str, conf: Callable[[str], str | None],
                     storage_options: Mapping[str, str] | None) -> dict[str, str]:
    """delta-rs's storage options for *reading* the table at ``location``: the same
    settings as :func:`~connectors.lake.store.options_for` (on S3 the s3a confs, with an
    ``http://`` endpoint allowed), then ``storage_options`` (already delta-rs's names) over
    them. What neither gives, delta-rs takes from its environment variables (``AWS_*``,
    ``GOOGLE_*``, ``AZURE_*``) and instance credentials. Reads only: a write on S3 would also need
    ``AWS_S3_ALLOW_UNSAFE_RENAME`` or a locking provider."""
    parsed = urlparse(location)
    out: dict[str, str] = {}
    if parsed.scheme.lower() in ("s3", "s3a", "s3n") and parsed.netloc:
        for key, value in s3a_options(parsed.netloc, conf).items():
            out[_DELTA_RS_NAMES[key]] = str(value).lower() if isinstance(value, bool) else str(
                value)
    given = {str(k): str(v) for k, v in (storage_options or {}).items()}
    for key in given:  # the caller's names win, whatever their case
        for name in [n for n in out if n.lower() == key.lower()]:
            del out[name]
    out.update(given)
    lower = {k.lower(): v for k, v in out.items()}
    endpoint = lower.get("aws_endpoint_url", lower.get("endpoint", ""))
    if endpoint.startswith("http://") and not {"aws_allow_http", "allow_http"} & set(lower):
        out["AWS_ALLOW_HTTP"] = "true"  # as ObstoreStore does for an http:// endpoint
    return out
