"""The operator tools' view of a Delta table: ledgers next to it, the sink's commits in its
log.

A Delta commit is atomic, so nothing stays open or prepared: ``recover`` has nothing to
roll back. What can be unfinished is the ledger: a batch Delta committed (its commit carries
the sink's ``userMetadata`` tag, and on the ``delta_txn_id`` path a ``txn`` action) that the
ledger does not record yet (the driver died between the two); the sink's next run records it
without writing it again. ``status`` shows that gap, read from the log through delta-rs
(no Spark needed).

The table is a local path or a URI on an object store (``s3a://``, ``s3://``, ``gs://``,
``abfss://``). Beside a local table the ledgers are directories
(:class:`~connectors.core.ledgers.file_ledger.FileLedger`), beside one on an object store they are
objects (:class:`~connectors.core.ledgers.object_ledger.ObjectLedger`), read only: the tools never
take a sink's lease, so they can never fence a live driver. The store's settings come
from the environment (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``) or ``storage_options`` (no
secrets: the command line refuses those). All of it is :mod:`connectors.delta.admin`'s;
here it becomes what the commands report.
"""

from __future__ import annotations

from connectors.cli._table_target import TableTarget

__all__ = ["DeltaTarget"]


class DeltaTarget(TableTarget):
    """A Delta table (a local path or an object-store URI), with ledgers under
    ``_connectors/`` beside it (or under ``ledger_root``):
    :class:`connectors.delta.admin.DeltaAdmin`."""

    kind = "delta"
    format_name = "Delta"
    history = "Delta log"

    def __init__(self, location: str, ledger_root: str | None = None,
                 storage_options: dict[str, str] | None = None) -> None:
        from connectors.delta.admin import DeltaAdmin

        self.admin = DeltaAdmin(location, ledger_root, storage_options)

    def last_batch_in_table(self, sink_id: str) -> int | None:
        return self.admin.last_batch_in_log(sink_id)  # type: ignore[no-any-return]
