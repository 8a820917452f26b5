"""The operator tools' view of a Delta table: ledgers next to it, the sink's commits in its
log.

A Delta commit is atomic, so nothing stays open or prepared: ``recover`` has nothing to
roll back. What can be unfinished is the ledger: a batch Delta committed (its commit carries
the sink's ``userMetadata`` tag, and on the ``delta_txn_id`` path a ``txn`` action) that the
ledger does not record yet (the driver died between the two); the sink's next run records it
without writing it again. ``status`` shows that gap, read from the log through delta-rs
(:class:`~connectors.delta._rs_log.DeltaRsLog`: no Spark needed).

The table is a local path or a URI on an object store (``s3a://``, ``s3://``, ``gs://``,
``abfss://``). Beside a local table the ledgers are directories
(:class:`~connectors.core.file_ledger.FileLedger`), beside one on an object store they are
objects (:class:`~connectors.core.object_ledger.ObjectLedger` over
:class:`~connectors.delta._store.ObstoreStore`), read only: the tools never take a sink's
lease, so they can never fence a live driver. The store's settings come from the
environment (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``) or ``storage_options`` (no secrets: the
command line refuses those).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from connectors.cli._model import Lingering, RecoverReport, SinkStatus
from connectors.cli._targets import Target
from connectors.core.errors import ConfigurationError
from connectors.core.file_ledger import FileLedger
from connectors.core.ledger import Ledger
from connectors.core.object_ledger import ObjectLedger
from connectors.delta._rs_log import DeltaRsLog, redact_uri
from connectors.delta._store import OBJECT_SCHEMES, ObstoreStore, delta_rs_options, options_for
from connectors.delta._table import local_path

__all__ = ["DeltaTarget"]


def _no_conf(key: str) -> str | None:
    """No Spark session here: no s3a confs (the environment gives the settings)."""
    return None


def _on_object_store(location: str) -> bool:
    return urlparse(location).scheme.lower() in OBJECT_SCHEMES


class DeltaTarget(Target):
    """A Delta table (a local path or an object-store URI), with ledgers under
    ``_connectors/`` beside it (or under ``ledger_root``)."""

    kind = "delta"

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
        self.ledger_root = Path(root) if self._root_url is None else None

    def describe(self) -> str:
        return f"delta {redact_uri(self.location)}"

    def _store(self, suffix: str) -> ObstoreStore:
        assert self._root_url is not None
        options = options_for(self._root_url, _no_conf, self._options)
        return ObstoreStore(f"{self._root_url.rstrip('/')}{suffix}", options)

    def sink_ids(self) -> list[str]:
        if self.ledger_root is None:
            names = {key.split("/", 1)[0] for key in self._store("").keys("")
                     if "/" in key}
            return sorted(names)
        if not self.ledger_root.is_dir():
            return []
        return sorted(p.name for p in self.ledger_root.iterdir() if p.is_dir())

    def ledger(self, sink_id: str) -> Ledger:
        return self._ledger(sink_id)

    def _ledger(self, sink_id: str) -> FileLedger | ObjectLedger:
        """The sink's ledger, read only (the plain ledger classes: no lease is taken)."""
        if self.ledger_root is None:
            return ObjectLedger(self._store(f"/{sink_id}"), sink_id=sink_id)
        return FileLedger(self.ledger_root / sink_id, sink_id=sink_id)

    def lingering(self, sink_id: str) -> list[Lingering]:
        return []  # a Delta commit is atomic: nothing stays open or prepared

    def _log_version(self, sink_id: str, generation: int) -> int | None:
        from connectors.core.batch import BatchContext
        from connectors.delta._meta import parse_user_metadata

        app_id = BatchContext(sink_id, 0, "00000000", generation).app_id  # Delta's txnAppId
        found = [self._log.read([app_id]).version(app_id)]  # the txn path's txn action
        for _version, info in self._log.commit_infos():  # every path's userMetadata tag
            tag = parse_user_metadata(info.get("userMetadata"))
            if tag is not None and tag.app_id == app_id:
                found.append(tag.batch_id)
        known = [v for v in found if v is not None]
        return max(known) if known else None

    def status(self, sink_id: str) -> SinkStatus:
        status = super().status(sink_id)
        ledger = self._ledger(sink_id)
        try:
            generation = ledger.generation()  # the reset_binding count: part of the app id
        finally:
            ledger.close()
        in_log = self._log_version(sink_id, generation)
        status.notes.append(f"Delta log: last batch committed by this sink = {in_log}")
        if in_log is not None and (status.last_committed is None
                                   or in_log > status.last_committed):
            status.unfinished.append(in_log)
            status.notes.append(
                f"batch {in_log} is committed in Delta but not yet recorded in the ledger: "
                "the sink's next run records it without writing it again")
        return status

    def recover(
        self, sink_id: str, *, commit_decided: bool, abort_undecided: bool, min_age_s: float
    ) -> RecoverReport:
        report = RecoverReport(sink_id, self.describe())
        report.notes.append("Delta commits are atomic: nothing to commit or roll back; a batch "
                            "committed but not recorded is recorded by the sink's next run")
        return report

