"""What an Iceberg table has committed for a sink: its snapshots and their tags (driver side).

The rule that settles a batch whose outcome is unknown (the ledger holds its intent and no
decision: the driver died, or a commit failed with an unknown state), from the snapshots
the table retains (``docs/design/iceberg.md``):

1. walk the ancestors of the current snapshot, newest first: a snapshot tagged with the
   batch's app id and batch id means committed; one tagged with the same app id and an
   *earlier* batch means not committed (the sink commits its batches in order, so the
   batch's commit would be a descendant of it);
2. the walk reaches the table's first snapshot (no parent) without either: not committed;
3. the walk reaches a parent the table no longer has (``expire_snapshots`` removed it):
   every retained snapshot is searched for the tag; found: committed. Not found: the sink
   cannot prove either way, and raises :class:`~connectors.core.errors.DataLossError`
   naming the expired history and the fix; it never guesses.

Another writer's commits, Iceberg's retries of an optimistic commit on a newer base and
compactions (``rewrite_data_files``: ``replace`` snapshots) all stay on the ancestor chain
and carry no tag of this app id, so the walk passes them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from connectors.core.errors import DataLossError
from connectors.iceberg._tag import PREFIX, SnapshotTag

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Snapshot", "TableSnapshots"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    """One retained snapshot: its id, parent, operation, and the sink's tag if any."""

    snapshot_id: int
    parent_id: int | None
    operation: str
    tag: SnapshotTag | None


@dataclass(frozen=True)
class TableSnapshots:
    """The table's retained snapshots and its current one, as read once."""

    table: str
    current: int | None
    by_id: dict[int, Snapshot]

    @classmethod
    def read(cls, session: SparkSession, table: str) -> TableSnapshots:
        """Two metadata-table reads (``<table>.refs``, ``<table>.snapshots``; only the
        ``connectors.*`` summary keys are collected)."""
        # The table's name is the sink's configuration (a multi-part identifier), no data.
        refs = session.sql(f"SELECT snapshot_id FROM {table}.refs "  # noqa: S608
                           "WHERE name = 'main'").collect()
        rows = session.sql(
            f"SELECT snapshot_id, parent_id, operation, "  # noqa: S608
            f"map_filter(summary, (k, v) -> startswith(k, '{PREFIX}')) AS tag "
            f"FROM {table}.snapshots").collect()
        by_id = {int(r["snapshot_id"]): Snapshot(
            int(r["snapshot_id"]),
            None if r["parent_id"] is None else int(r["parent_id"]),
            str(r["operation"] or ""), SnapshotTag.parse(r["tag"])) for r in rows}
        current = int(refs[0]["snapshot_id"]) if refs else None
        return cls(table, current, by_id)

    def ancestors(self) -> tuple[list[Snapshot], bool]:
        """The current snapshot's ancestors, newest first, and whether the chain is whole
        (it ends at the table's first snapshot, not at an expired parent)."""
        chain: list[Snapshot] = []
        at = self.current
        while at is not None:
            snap = self.by_id.get(at)
            if snap is None:
                return chain, False
            chain.append(snap)
            at = snap.parent_id
        return chain, True

    def last_batch(self, app_id: str) -> int | None:
        """The newest batch of ``app_id`` among the retained snapshots (a probe of a table
        whose ledger is empty)."""
        batches = [s.tag.batch_id for s in self.by_id.values()
                   if s.tag is not None and s.tag.app_id == app_id]
        return max(batches) if batches else None

    def find(self, app_id: str, batch_id: int) -> Snapshot | None:
        """The retained snapshot tagged ``(app_id, batch_id)``, if any."""
        for snap in self.by_id.values():
            if snap.tag is not None and (snap.tag.app_id, snap.tag.batch_id) == (app_id,
                                                                                 batch_id):
                return snap
        return None

    def settle(self, app_id: str, batch_id: int, *, sink_id: str, intent: str) -> bool:
        """Whether ``(app_id, batch_id)`` is committed, by the rule of the module docstring
        (``intent``: where the ledger keeps the batch's intent, for the error's fix)."""
        chain, whole = self.ancestors()
        for snap in chain:
            tag = snap.tag
            if tag is None or tag.app_id != app_id:
                continue
            if tag.batch_id == batch_id:
                return True
            if tag.batch_id < batch_id:
                return False
        if whole:
            return False
        if self.find(app_id, batch_id) is not None:
            return True
        raise DataLossError(
            f"the outcome of batch {batch_id} in the Iceberg table {self.table} cannot be "
            f"proved: the driver stopped while committing it, and the table's snapshots "
            f"since the sink's previous commit were expired (expire_snapshots) before the "
            f"sink restarted, so neither its commit nor its absence can be seen. Nothing was "
            f"written. Check whether the table holds the batch's rows: if it does not, "
            f"delete the batch's intent ({intent}) and restart (the batch is then written); "
            f"if it does, delete those rows first. Keep snapshot expiry's retention longer "
            f"than a restart takes (docs/iceberg.md)", sink_id=sink_id)
