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

from connectors.cli._model import SinkStatus
from connectors.cli._table_target import TableTarget

__all__ = ["IcebergTarget"]


class IcebergTarget(TableTarget):
    """An Iceberg table by its location, with ledgers under ``_connectors/`` beside it (or
    under ``ledger_root``): :class:`connectors.iceberg.admin.IcebergAdmin`."""

    kind = "iceberg"
    format_name = "Iceberg"
    history = "Iceberg snapshots"

    def __init__(self, location: str, ledger_root: str | None = None,
                 storage_options: dict[str, str] | None = None,
                 metadata_location: str | None = None) -> None:
        from connectors.iceberg.admin import IcebergAdmin

        self.admin = IcebergAdmin(location, ledger_root, storage_options,
                                  metadata_location=metadata_location)

    def last_batch_in_table(self, sink_id: str) -> int | None:
        return self.admin.last_batch_in_table(sink_id)  # type: ignore[no-any-return]

    def status(self, sink_id: str) -> SinkStatus:
        status = super().status(sink_id)
        status.notes[:0] = self.admin.notes  # which metadata file was read, when in doubt
        return status
