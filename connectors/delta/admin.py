"""Operating DeltaSinks from outside their queries: their ledgers, and their commits in the log.

The operator tools (``connectors status``, ``doctor``) read a Delta table through this
module, and so can a script. :class:`DeltaAdmin` is one table, a local path or a URI on an
object store (``s3a://``, ``s3://``, ``gs://``, ``abfss://``), with the sinks' ledgers
under ``_connectors/`` beside it (or under another root):

- :meth:`~DeltaAdmin.sink_ids`: every sink with a ledger there;
- :meth:`~DeltaAdmin.ledger`: a sink's ledger, read only (a directory of files beside a
  local table, objects beside one on a store; no lease is taken, so reading never fences
  a live driver);
- :meth:`~DeltaAdmin.last_batch_in_log`: the last batch the sink committed according to
  the table's log, read through delta-rs (no Spark needed): every commit of the sink
  carries its ``userMetadata`` tag, and on the ``delta_txn_id`` path a ``txn`` action.

There is nothing to settle: a Delta commit is atomic, so nothing stays open or prepared.
What can be unfinished is the ledger: a batch Delta committed that the ledger does not
record yet (the driver died between the two), which the sink's next run records without
writing it again; :meth:`~DeltaAdmin.last_batch_in_log` beside the ledger shows that gap.

The store's settings come from the environment (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``) or
``storage_options``; :func:`is_secret_option` says which of those hold a secret (a command
line refuses them). :meth:`DeltaAdmin.describe` and the errors show a URI without its
credentials.

Example (``path``: a Delta table; on a store, ``DeltaAdmin("s3a://bucket/events")`` with
the ``AWS_*`` variables set)::

    import deltalake
    import pyarrow as pa

    from connectors.delta.admin import DeltaAdmin

    deltalake.write_deltalake(path, pa.table({"id": [1, 2]}))
    table = DeltaAdmin(path)
    for sink_id in table.sink_ids():  # none yet: no sink wrote here
        print(sink_id, table.last_batch_in_log(sink_id))
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from connectors.core.batch import BatchContext
from connectors.core.errors import ConfigurationError
from connectors.core.ledgers.file_ledger import FileLedger
from connectors.core.ledgers.object_ledger import ObjectLedger
from connectors.delta._meta import parse_user_metadata
from connectors.delta._rs_log import DeltaRsLog, redact_uri
from connectors.delta._rs_options import delta_rs_options
from connectors.lake.store import (
    OBJECT_SCHEMES,
    ObstoreStore,
    is_secret_option,
    local_path,
    options_for,
)

__all__ = ["DeltaAdmin", "is_secret_option"]


def _no_conf(key: str) -> str | None:
    """No Spark session here: no s3a confs (the environment gives the settings)."""
    return None


def _on_object_store(location: str) -> bool:
    return urlparse(location).scheme.lower() in OBJECT_SCHEMES


class DeltaAdmin:
    """A Delta table (a local path or an object-store URI), with the sinks' ledgers under
    ``_connectors/`` beside it, or under ``ledger_root`` (the parent of DeltaSink's
    ``ledger_path``). Refuses a location that is not a Delta table."""

    def __init__(self, location: str, ledger_root: str | None = None,
                 storage_options: dict[str, str] | None = None) -> None:
        self.location = location
        self._options = dict(storage_options or {})
        self._log = DeltaRsLog(location, delta_rs_options(location, _no_conf, self._options))
        local = local_path(location)
        if local is not None:
            if not (local / "_delta_log").is_dir():
                raise ConfigurationError(
                    f"{location} is not a Delta table (no _delta_log directory)")
        elif not self._log.exists():  # opens the table: a store's refusal is said here
            raise ConfigurationError(
                f"{redact_uri(location)} is not a Delta table (delta-rs finds no commit in "
                "its _delta_log)")
        root = ledger_root or (str(local / "_connectors") if local is not None
                               else f"{location.rstrip('/')}/_connectors")
        self._root_url = root if _on_object_store(root) else None
        #: The ledgers' local directory (``None``: they are on an object store).
        self.ledger_root = Path(root) if self._root_url is None else None

    def describe(self) -> str:
        """The table for humans, its URI without credentials."""
        return f"delta {redact_uri(self.location)}"

    def _store(self, suffix: str) -> ObstoreStore:
        assert self._root_url is not None
        options = options_for(self._root_url, _no_conf, self._options)
        return ObstoreStore(f"{self._root_url.rstrip('/')}{suffix}", options)

    def sink_ids(self) -> list[str]:
        """Every sink id with a ledger under the ledger root."""
        if self.ledger_root is None:
            names = {key.split("/", 1)[0] for key in self._store("").keys("")
                     if "/" in key}
            return sorted(names)
        if not self.ledger_root.is_dir():
            return []
        return sorted(p.name for p in self.ledger_root.iterdir() if p.is_dir())

    def ledger(self, sink_id: str) -> FileLedger | ObjectLedger:
        """The sink's ledger, read only (the plain ledger classes: no lease is taken); the
        caller closes it."""
        if self.ledger_root is None:
            return ObjectLedger(self._store(f"/{sink_id}"), sink_id=sink_id)
        return FileLedger(self.ledger_root / sink_id, sink_id=sink_id)

    def last_batch_in_log(self, sink_id: str) -> int | None:
        """The last batch the sink committed to the table according to its log (its
        ``txn`` action or its commits' ``userMetadata`` tags), under the ledger's current
        generation (the count of ``reset_binding``, part of Delta's app id); ``None``
        when the log has none."""
        ledger = self.ledger(sink_id)
        try:
            generation = ledger.generation()
        finally:
            ledger.close()
        app_id = BatchContext(sink_id, 0, "00000000", generation).app_id  # Delta's txnAppId
        found = [self._log.read([app_id]).version(app_id)]  # the txn path's txn action
        for _version, info in self._log.commit_infos():  # every path's userMetadata tag
            tag = parse_user_metadata(info.get("userMetadata"))
            if tag is not None and tag.app_id == app_id:
                found.append(tag.batch_id)
        known = [v for v in found if v is not None]
        return max(known) if known else None

    def __repr__(self) -> str:
        return f"DeltaAdmin({redact_uri(self.location)!r})"
