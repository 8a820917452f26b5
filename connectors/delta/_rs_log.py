"""Reading a Delta table's log through delta-rs (``deltalake.DeltaTable``), on any store
delta-rs reads: a local path, ``s3a://`` / ``s3://``, ``gs://``, ``abfss://`` / ``abfs://``
/ ``az://``.

Public delta-rs API only: ``version()``, ``transaction_version(app_id)`` (Delta's txn ids;
delta-rs drops the ids older than ``delta.setTransactionRetentionDuration`` as Delta does),
``metadata().configuration`` and ``history()`` (each commit's ``commitInfo``, with the
sink's ``userMetadata`` tag). Checked against deltalake 1.6 on tables written by Spark 4.2
with Delta 4.4 (``tests/delta/test_rs_log.py`` has the delta-rs-written cases): classic,
multi-part and V2 checkpoints (JSON and Parquet), the JSON commits before a checkpoint
removed, transaction ids expired by the retention, and the reader features
``deletionVectors``, ``columnMapping``, ``typeWidening``, ``variantType``,
``timestampNtz``. A table whose protocol delta-rs refuses is refused (no guess).

Only where deltalake is not installed (it comes with the ``[delta]`` extra, the operator
CLI does not need it otherwise) is a local table read with
:class:`~connectors.delta._log.LocalDeltaLog` instead.

Store settings: ``storage_options`` by delta-rs's names (see
:func:`connectors.delta._rs_options.delta_rs_options`), else delta-rs's own environment variables
(``AWS_*``, ``GOOGLE_*``, ``AZURE_*``) and instance credentials. Errors name the table and
the settings to check, never a secret value.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlparse

from connectors.core.errors import ConfigurationError, DependencyError, TransientError
from connectors.delta._log import LocalDeltaLog, LogState
from connectors.delta._table import local_path
from connectors.lake.store import is_secret_option

__all__ = ["DeltaRsLog", "StoreRefusedError", "delta_rs_uri", "redact_uri"]

logger = logging.getLogger(__name__)

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_HTTP_STATUS = re.compile(r"\b([45]\d\d [A-Z][A-Za-z ]*[a-z])")
_S3_CODE = re.compile(r"<Code>([A-Za-z]+)</Code>")
_REFUSED = re.compile(
    r"\b(40[13]|404 Not Found)\b|privileges|credential|unauthenticated|unauthorized|"
    r"forbidden|access ?denied|InvalidAccessKeyId|SignatureDoesNotMatch|NoSuchBucket|"
    r"AuthorizationFailure|AuthenticationFailed",
    re.IGNORECASE,
)

# What to check, per store, when the store refused or could not be reached.
_SETTINGS = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (AWS_SESSION_TOKEN), AWS_REGION, "
          "AWS_ENDPOINT_URL (and AWS_ALLOW_HTTP=true for an http:// endpoint)",
    "gs": "GOOGLE_SERVICE_ACCOUNT (a service account key file) or "
          "GOOGLE_APPLICATION_CREDENTIALS",
    "azure": "AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_KEY "
             "or AZURE_CLIENT_ID / AZURE_CLIENT_SECRET / AZURE_TENANT_ID",
}
_STORE_OF = {"s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "abfs": "azure",
             "abfss": "azure", "az": "azure", "azure": "azure", "adl": "azure"}


class StoreRefusedError(ConfigurationError):
    """The table's store refused the reader (credentials, permissions, no such bucket).
    The operator CLI exits with "unreachable" (3) for it, as for a database that refused."""

    #: Read by the operator CLI (exit 3, not 2).
    cannot_connect = True


def redact_uri(location: str) -> str:
    """``location`` without a user or password it may carry (for messages)."""
    parsed = urlparse(location)
    if parsed.username is None and parsed.password is None:
        return location
    return parsed._replace(netloc=parsed.hostname or "").geturl()


def delta_rs_uri(location: str) -> str:
    """The URI delta-rs opens for ``location``: a local path resolved, ``s3n://`` as
    ``s3a://``; ``wasb(s)://`` and credentials in the URI are refused."""
    local = local_path(location)
    if local is not None:
        return str(local)
    parsed = urlparse(location)
    if parsed.password is not None:
        raise ConfigurationError(
            f"the table URI {redact_uri(location)} carries a password: give the store's "
            "credentials in its environment variables instead (AWS_SECRET_ACCESS_KEY, ...)")
    scheme = parsed.scheme.lower()
    if scheme in ("wasb", "wasbs"):
        raise ConfigurationError(
            f"delta-rs does not read {scheme}:// URIs ({location}): name the table "
            "abfss://<container>@<account>.dfs.core.windows.net/<path>")
    if scheme == "s3n":
        return parsed._replace(scheme="s3a").geturl()
    return location


class DeltaRsLog:
    """The facts the sink and the operator tools read from a table's log, through delta-rs.

    Example::

        log = DeltaRsLog(path)       # or "s3a://bucket/events": settings from AWS_* variables
        log.read(["events-delta"]).version("events-delta")   # last batch of that app id
    """

    def __init__(self, location: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.location = location
        self._uri = delta_rs_uri(location)
        self._options = {str(k): str(v) for k, v in (storage_options or {}).items()}
        self._table: Any = None  # the DeltaTable, loaded once
        self._local: LocalDeltaLog | None = None  # deltalake missing, local table

    def __repr__(self) -> str:
        return f"DeltaRsLog({redact_uri(self.location)!r})"  # never the options: keys

    def read(self, app_ids: Iterable[str]) -> LogState:
        """The table's version, the txn versions of ``app_ids`` and its configuration;
        ``exists=False`` when there is no table there yet."""
        ids = list(app_ids)
        table = self._load()
        if table is None:
            if self._local is None:
                return LogState(exists=False)
            state = self._local.read()
            return LogState(state.exists, {a: v for a, v in state.versions.items() if a in ids},
                            state.configuration, state.table_version)
        versions: dict[str, int] = {}
        for app_id in ids:
            found = self._call("reading the transaction ids of", table.transaction_version,
                               app_id)
            if found is not None:
                versions[app_id] = int(found)
        metadata = self._call("reading the metadata of", table.metadata)
        configuration = {str(k): str(v) for k, v in (metadata.configuration or {}).items()
                         if v is not None}
        return LogState(True, versions, configuration, int(table.version()))

    def exists(self) -> bool:
        """Whether there is a Delta table at the location (the store refusing is an error)."""
        return self._load() is not None or (
            self._local is not None and self._local.read().exists)

    def commit_infos(self) -> list[tuple[int, dict[str, Any]]]:
        """``(version, commitInfo)`` of every commit the log still holds, oldest first."""
        table = self._load()
        if table is None:
            return self._local.commit_infos() if self._local is not None else []
        rows = self._call("reading the history of", table.history)
        infos = [(int(row["version"]), dict(row)) for row in rows if "version" in row]
        return sorted(infos, key=lambda pair: pair[0])

    # ---- internals ----
    def _load(self) -> Any:
        if self._table is not None:
            return self._table
        if self._local is not None:
            return None
        try:
            from deltalake import DeltaTable
            from deltalake.exceptions import TableNotFoundError
        except ImportError:
            local = local_path(self.location)
            if local is None:
                raise DependencyError(
                    f"reading the Delta table at {redact_uri(self.location)} takes delta-rs: "
                    "pip install 'spark-exactly-once[delta]'") from None
            logger.info("deltalake is not installed: reading %s with LocalDeltaLog", local)
            self._local = LocalDeltaLog(local)
            return None
        try:
            self._table = self._call("opening", DeltaTable, self._uri,
                                     storage_options=self._options or None)
        except TableNotFoundError as exc:
            if "unknown scheme" in str(exc).lower():
                raise ConfigurationError(
                    f"delta-rs cannot open {redact_uri(self.location)}: "
                    f"{self._summary(exc)}") from None
            return None
        return self._table

    def _call(self, doing: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from deltalake.exceptions import DeltaProtocolError, TableNotFoundError

        where = redact_uri(self.location)
        try:
            return fn(*args, **kwargs)
        except TableNotFoundError:
            raise
        except DeltaProtocolError as exc:
            raise ConfigurationError(
                f"delta-rs cannot read the Delta table at {where} ({self._summary(exc)}): "
                "read it with Spark (classic, with a JVM gateway) instead") from None
        except OSError as exc:
            summary = self._summary(exc)
            settings = _SETTINGS.get(_STORE_OF.get(urlparse(self._uri).scheme.lower(), ""))
            hint = f": check {settings}" if settings else ""
            if _REFUSED.search(str(exc)):
                raise StoreRefusedError(
                    f"{doing} the Delta table at {where} was refused by its store "
                    f"({summary}){hint}") from None
            raise TransientError(
                f"{doing} the Delta table at {where} failed ({summary}){hint}") from None

    def _summary(self, exc: BaseException) -> str:
        """The error's first line, its HTTP status and S3 error code; secrets masked."""
        text = _ANSI.sub("", str(exc))
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        first = first.removeprefix("Kernel error -> ").strip()
        extra = [m.group(1) for m in (_HTTP_STATUS.search(text), _S3_CODE.search(text)) if m]
        summary = f"{first} ({', '.join(extra)})" if extra else first
        return _mask(summary[:400], self._options)


def _mask(text: str, options: Mapping[str, str]) -> str:
    """``text`` with every secret value of ``options`` and of the environment masked."""
    secrets = [v for k, v in options.items() if is_secret_option(k)]
    secrets += [v for k, v in os.environ.items() if is_secret_option(k)]
    for value in sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True):
        text = text.replace(value, "***")
    return text
