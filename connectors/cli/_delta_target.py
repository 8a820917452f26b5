"""The operator tools' view of a Delta table: ledgers next to it, the sink's commits in its
log.

A Delta commit is atomic, so nothing stays open or prepared: ``recover`` has nothing to
roll back. What can be unfinished is the ledger: a batch Delta committed (its commit carries
the sink's ``userMetadata`` tag, and on the ``delta_txn_id`` path a ``txn`` action) that the
ledger does not record yet (the driver died between the two); the sink's next run records it
without writing it again. ``status`` shows that gap, read from the log in pure Python (no
Spark needed).
"""

from __future__ import annotations

from pathlib import Path

from connectors.cli._model import Lingering, RecoverReport, SinkStatus
from connectors.cli._targets import Target
from connectors.core.errors import ConfigurationError
from connectors.core.file_ledger import FileLedger
from connectors.core.ledger import Ledger

__all__ = ["DeltaTarget"]


class DeltaTarget(Target):
    """A Delta table on a local file system, with ledgers under ``_connectors/``."""

    kind = "delta"

    def __init__(self, path: str, ledger_root: str | None = None) -> None:
        self.path = Path(path)
        if not (self.path / "_delta_log").is_dir():
            raise ConfigurationError(f"{path} is not a Delta table (no _delta_log directory)")
        self.ledger_root = Path(ledger_root) if ledger_root else self.path / "_connectors"

    def describe(self) -> str:
        return f"delta {self.path}"

    def sink_ids(self) -> list[str]:
        if not self.ledger_root.is_dir():
            return []
        return sorted(p.name for p in self.ledger_root.iterdir() if p.is_dir())

    def ledger(self, sink_id: str) -> Ledger:
        return FileLedger(self.ledger_root / sink_id, sink_id=sink_id)

    def lingering(self, sink_id: str) -> list[Lingering]:
        return []  # a Delta commit is atomic: nothing stays open or prepared

    def _log_version(self, sink_id: str, generation: int) -> int | None:
        from connectors.core.batch import BatchContext
        from connectors.delta._log import LocalDeltaLog
        from connectors.delta._meta import parse_user_metadata

        app_id = BatchContext(sink_id, 0, "00000000", generation).app_id  # Delta's txnAppId
        log = LocalDeltaLog(self.path)
        found = [log.read().version(app_id)]  # the txn path's txn action
        for _version, info in log.commit_infos():  # every path's userMetadata tag
            tag = parse_user_metadata(info.get("userMetadata"))
            if tag is not None and tag.app_id == app_id:
                found.append(tag.batch_id)
        known = [v for v in found if v is not None]
        return max(known) if known else None

    def status(self, sink_id: str) -> SinkStatus:
        status = super().status(sink_id)
        ledger = FileLedger(self.ledger_root / sink_id, sink_id=sink_id)
        try:
            generation = _generation(ledger)
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


def _generation(ledger: FileLedger) -> int:
    """The sink's binding generation (``reset_binding`` count) from its ledger."""
    return ledger.generation()
