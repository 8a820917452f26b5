"""Where a table on an object store keeps the sink's ledger (DeltaSink's and IcebergSink's): an
:class:`~connectors.core.ledgers.object_ledger.ObjectStore` over obstore (Rust's ``object_store``).

One API over the three stores, each through its own atomic primitive: ``create`` is
obstore's ``mode="create"`` (S3 and Azure ``If-None-Match: *``, GCS
``ifGenerationMatch=0``), ``replace`` is ``mode={"e_tag": ...}`` (S3/Azure ``If-Match``,
GCS the generation).

The store's settings come from where the user already gave them to Spark, so a sink on
``s3a://`` needs nothing more: the ``spark.hadoop.fs.s3a.*`` confs (endpoint, keys, path
style, region, per-bucket ``fs.s3a.bucket.<bucket>.*`` overrides first), read from the
batch's session; keys not given there fall back to obstore's own environment variables
(``AWS_*``, ``GOOGLE_*``, ``AZURE_*``) and instance credentials. ``storage_options`` (the
sink's option, delta-rs's names: ``AWS_ENDPOINT_URL``, ``AZURE_STORAGE_ACCOUNT_KEY``, ...)
override both.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from connectors.core.errors import ConfigurationError, DependencyError, TransientError
from connectors.core.ledgers.object_ledger import ObjectStore, Versioned

__all__ = [
    "OBJECT_SCHEMES",
    "ObstoreStore",
    "is_secret_option",
    "local_path",
    "options_for",
    "s3a_options",
    "spark_conf",
    "store_url",
]

logger = logging.getLogger(__name__)

#: URI schemes of tables whose ledger lives in the object store beside them. Not
#: ``wasb(s)://``: obstore and delta-rs reach Azure through ``abfss://``; a wasb table
#: needs ``ledger_path``.
OBJECT_SCHEMES = ("s3", "s3a", "s3n", "gs", "abfs", "abfss", "az", "azure")

# fs.s3a.<name> -> obstore's S3 config key.
_S3A: dict[str, str] = {
    "endpoint": "endpoint",
    "access.key": "access_key_id",
    "secret.key": "secret_access_key",
    "session.token": "session_token",
    "endpoint.region": "region",
}



# delta-rs's own storage options (its S3 log locking), which obstore does not know.
_DELTA_RS_ONLY = ("aws_s3_allow_unsafe_rename", "aws_s3_locking_provider", "dynamo",
                  "delta_dynamo")


def is_secret_option(name: str) -> bool:
    """Whether a storage option (or environment variable) of this name holds a secret:
    its name says SECRET, PASSWORD, TOKEN or KEY (``..._KEY_ID``, an id, does not count).
    Such values are masked in messages, and refused on a command line."""
    upper = name.upper()
    if any(word in upper for word in ("SECRET", "PASSWORD", "TOKEN")):
        return True
    return "KEY" in upper and not upper.endswith("_ID")


def local_path(location: str) -> Path | None:
    """A local path for ``location`` (a plain path or ``file:`` URI), else ``None``."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else location).resolve()
    return None


def store_url(location: str, sink_id: str) -> str | None:
    """The URL of the sink's ledger prefix beside a table on an object store, or ``None``
    for a table that is not on one."""
    scheme = urlparse(location).scheme.lower()
    if scheme not in OBJECT_SCHEMES:
        return None
    return f"{location.rstrip('/')}/_connectors/{sink_id}"


def s3a_options(bucket: str, conf: Callable[[str], str | None]) -> dict[str, Any]:
    """obstore's S3 settings from the s3a confs Spark was given (``conf(key)`` reads one;
    ``fs.s3a.bucket.<bucket>.<name>`` wins over ``fs.s3a.<name>``)."""

    def s3a(name: str) -> str | None:
        for key in (f"spark.hadoop.fs.s3a.bucket.{bucket}.{name}", f"spark.hadoop.fs.s3a.{name}"):
            value = conf(key)
            if value not in (None, ""):
                return value
        return None

    options: dict[str, Any] = {}
    for name, key in _S3A.items():
        value = s3a(name)
        if value is not None:
            options[key] = value
    endpoint = options.get("endpoint")
    if endpoint is not None and "://" not in endpoint:
        ssl = (s3a("connection.ssl.enabled") or "true").lower() != "false"
        options["endpoint"] = f"{'https' if ssl else 'http'}://{endpoint}"
    path_style = s3a("path.style.access")
    if path_style is not None:
        options["virtual_hosted_style_request"] = path_style.lower() != "true"
    return options


class ObstoreStore(ObjectStore):
    """An :class:`ObjectStore` at ``url`` (``s3a://bucket/table/_connectors/sink``) through
    obstore; ``options`` are obstore's config keys or delta-rs's storage option names."""

    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        self.url = url
        try:
            import obstore  # noqa: F401
            from obstore.store import from_url
        except ImportError as exc:  # pragma: no cover - part of the [delta] and [iceberg] extras
            raise DependencyError(
                "a table on an object store keeps the sink's ledger through obstore: "
                "pip install 'spark-exactly-once[delta]' (or [iceberg])") from exc
        parsed = urlparse(url)
        scheme = {"s3a": "s3", "s3n": "s3"}.get(parsed.scheme.lower(), parsed.scheme.lower())
        #: Requests made (``lease_requests``: those of the lease object), for metrics.
        self.requests = 0
        self.lease_requests = 0
        self._obstore_url = parsed._replace(scheme=scheme).geturl()
        config = {k.lower(): v for k, v in dict(options or {}).items()
                  if not k.lower().startswith(_DELTA_RS_ONLY)}
        endpoint = str(config.get("endpoint") or config.get("aws_endpoint_url") or "")
        client: dict[str, Any] = {}
        allow_http = {str(config.pop(k, "")).lower() for k in ("aws_allow_http", "allow_http")}
        if endpoint.startswith("http://") or "true" in allow_http:
            client["allow_http"] = True  # a client option, not a store key
        try:
            self._store = from_url(self._obstore_url, config=config or None,  # type: ignore[arg-type]
                                   client_options=client or None)  # type: ignore[arg-type]
        except Exception as exc:
            raise ConfigurationError(
                f"cannot reach the object store of the sink's ledger at {url}: "
                f"{type(exc).__name__}: {_safe(exc)}") from None

    def __repr__(self) -> str:
        return f"ObstoreStore({self.url!r})"  # never the options: they hold keys

    def where(self, key: str = "") -> str:
        return f"{self.url}/{key}" if key else self.url

    def _call(self, what: str, key: str, fn: Callable[[], Any]) -> Any:
        import obstore.exceptions as oe

        if key != "lease":  # the lease's renewals are counted apart
            self.requests += 1
        else:
            self.lease_requests += 1
        try:
            return fn()
        except (oe.AlreadyExistsError, oe.PreconditionError, oe.NotFoundError,
                FileNotFoundError):
            raise
        except (oe.PermissionDeniedError, oe.UnauthenticatedError,
                oe.UnknownConfigurationKeyError, oe.InvalidPathError) as exc:
            raise ConfigurationError(
                f"{what} {self.where(key)} was refused: {type(exc).__name__}: {_safe(exc)}. "
                "The sink keeps its ledger beside the table: give the driver read, write, "
                "list and delete on that prefix") from None
        except Exception as exc:  # network, 5xx, timeouts: worth a retry
            raise TransientError(
                f"{what} {self.where(key)} failed: {type(exc).__name__}: {_safe(exc)}"
            ) from None

    def read(self, key: str) -> Versioned | None:
        import obstore
        import obstore.exceptions as oe

        def get() -> Versioned | None:
            try:
                result = obstore.get(self._store, key)
            except (oe.NotFoundError, FileNotFoundError):  # obstore raises the latter
                return None
            return bytes(result.bytes()), str(result.meta["e_tag"] or "")

        return self._call("reading", key, get)  # type: ignore[no-any-return]

    def create(self, key: str, data: bytes) -> str | None:
        import obstore
        import obstore.exceptions as oe

        def put() -> str | None:
            try:
                return str(obstore.put(self._store, key, data, mode="create")["e_tag"])
            except (oe.AlreadyExistsError, oe.PreconditionError):
                return None

        return self._call("creating", key, put)  # type: ignore[no-any-return]

    def replace(self, key: str, data: bytes, version: str) -> str | None:
        import obstore
        import obstore.exceptions as oe

        def put() -> str | None:
            try:
                return str(obstore.put(self._store, key, data,
                                       mode={"e_tag": version})["e_tag"])
            except (oe.PreconditionError, oe.NotFoundError, oe.AlreadyExistsError,
                    FileNotFoundError):
                return None

        return self._call("replacing", key, put)  # type: ignore[no-any-return]

    def put(self, key: str, data: bytes) -> None:
        import obstore

        self._call("writing", key, lambda: obstore.put(self._store, key, data))

    def keys(self, prefix: str) -> list[str]:
        import obstore

        def listed() -> list[str]:
            return [str(meta["path"]) for batch in obstore.list(self._store, prefix)
                    for meta in batch]

        return self._call("listing", prefix, listed)  # type: ignore[no-any-return]

    def delete(self, key: str) -> None:
        import obstore
        import obstore.exceptions as oe

        def delete() -> None:
            with contextlib.suppress(oe.NotFoundError, FileNotFoundError):
                obstore.delete(self._store, key)

        self._call("deleting", key, delete)


def _safe(exc: BaseException) -> str:
    """The first line of an obstore error (its debug dump follows), at most 300 chars."""
    return str(exc).splitlines()[0][:300] if str(exc) else ""


def spark_conf(session: Any) -> Callable[[str], str | None]:
    """A reader of ``spark.hadoop.*`` confs: the session's conf (classic and Spark Connect),
    then, in classic PySpark, the Hadoop configuration itself (``core-site.xml``, confs set
    on ``sparkContext._jsc.hadoopConfiguration()``)."""

    def read(key: str) -> str | None:
        try:
            value = session.conf.get(key, None)
        except Exception:  # a conf Connect refuses to show: not given
            value = None
        if value is None and key.startswith("spark.hadoop."):
            try:
                hadoop = session.sparkContext._jsc.hadoopConfiguration()
                value = hadoop.get(key[len("spark.hadoop."):])
            except Exception:  # Spark Connect: no JVM gateway
                value = None
        return None if value is None else str(value)

    return read


def options_for(location: str, conf: Callable[[str], str | None],
                storage_options: Mapping[str, str] | None) -> dict[str, Any]:
    """The store's settings for a table at ``location``: the s3a confs for S3, then the
    sink's ``storage_options`` over them."""
    parsed = urlparse(location)
    options: dict[str, Any] = {}
    if parsed.scheme.lower() in ("s3", "s3a", "s3n") and parsed.netloc:
        options = s3a_options(parsed.netloc, conf)
    for key, value in (storage_options or {}).items():
        if not key.lower().startswith(_DELTA_RS_ONLY):
            options[key.lower()] = value
    if str(options.get("aws_endpoint_url", "")):
        options["endpoint"] = options.pop("aws_endpoint_url")
    return options
