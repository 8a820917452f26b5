"""The operator tools' view of an Iceberg table: ledgers next to it, the sink's commits in its
snapshots.

An Iceberg commit is atomic, so nothing stays open or prepared: ``recover`` has nothing to
roll back. What can be unfinished is the ledger: a batch the table committed (its snapshot
carries the sink's ``connectors.*`` summary tag) that the ledger does not record yet (the
driver died between the two); the sink's next run records it without writing it again.
``status`` shows that gap, read from the table's metadata file (no Spark, no catalog
client). All of it is :mod:`connectors.iceberg.admin`'s; here it becomes what the commands
report.
"""

from __future__ import annotations

from connectors.cli._model import Lingering, RecoverReport, SinkStatus
from connectors.cli._targets import Target
from connectors.core.ledgers.ledger import Ledger

__all__ = ["IcebergTarget"]


class IcebergTarget(Target):
    """An Iceberg table by its location, with ledgers under ``_connectors/`` beside it (or
    under ``ledger_root``): :class:`connectors.iceberg.admin.IcebergAdmin`."""

    kind = "iceberg"

    def __init__(self, location: str, ledger_root: str | None = None,
                 storage_options: dict[str, str] | None = None,
                 metadata_location: str | None = None) -> None:
        from connectors.iceberg.admin import IcebergAdmin

        self.admin = IcebergAdmin(location, ledger_root, storage_options,
                                  metadata_location=metadata_location)

    def describe(self) -> str:
        return self.admin.describe()

    def sink_ids(self) -> list[str]:
        return self.admin.sink_ids()

    def ledger(self, sink_id: str) -> Ledger:
        return self.admin.ledger(sink_id)

    def lingering(self, sink_id: str) -> list[Lingering]:
        return []  # an Iceberg commit is atomic: nothing stays open or prepared

    def status(self, sink_id: str) -> SinkStatus:
        status = super().status(sink_id)
        in_table = self.admin.last_batch_in_table(sink_id)
        status.notes.extend(self.admin.notes)
        status.notes.append(f"Iceberg snapshots: last batch committed by this sink = {in_table}")
        if in_table is not None and (status.last_committed is None
                                     or in_table > status.last_committed):
            status.unfinished.append(in_table)
            status.notes.append(
                f"batch {in_table} is committed in the Iceberg table but not yet recorded in "
                "the ledger: the sink's next run records it without writing it again")
        return status

    def recover(
        self, sink_id: str, *, commit_decided: bool, abort_undecided: bool, min_age_s: float
    ) -> RecoverReport:
        report = RecoverReport(sink_id, self.describe())
        report.notes.append("Iceberg commits are atomic: nothing to commit or roll back; a "
                            "batch committed but not recorded is recorded by the sink's next "
                            "run")
        return report
