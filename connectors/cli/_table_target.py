"""What the operator tools see of a table format's sinks (Delta, Iceberg): one class for both.

A table format's commit is atomic, so nothing stays open or prepared: ``recover`` has
nothing to roll back. What can be unfinished is the ledger beside the table: a batch the
table committed (its commit carries the sink's tag) that the ledger does not record yet
(the driver died between the two); the sink's next run records it without writing it
again. ``status`` shows that gap: the ledger's last committed batch beside the last batch
the table's own history holds for the sink (:meth:`TableTarget.last_batch_in_table`, each
format's admin module).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from connectors.cli._model import Lingering, RecoverReport, SinkStatus
from connectors.cli._targets import Target
from connectors.core.ledgers.ledger import Ledger

__all__ = ["TableTarget"]


class TableTarget(Target):
    """A table with the sinks' ledgers beside it, through its format's admin object
    (``describe``, ``sink_ids``, ``ledger``)."""

    #: How messages name the format's commit ("Delta", "Iceberg").
    format_name: str
    #: How the ``status`` note names the table's history ("Delta log", "Iceberg snapshots").
    history: str
    admin: Any

    @abstractmethod
    def last_batch_in_table(self, sink_id: str) -> int | None:
        """The last batch the sink committed, as the table's history says."""

    def describe(self) -> str:
        return str(self.admin.describe())

    def sink_ids(self) -> list[str]:
        return list(self.admin.sink_ids())

    def ledger(self, sink_id: str) -> Ledger:
        return self.admin.ledger(sink_id)  # type: ignore[no-any-return]

    def lingering(self, sink_id: str) -> list[Lingering]:
        return []  # a table's commit is atomic: nothing stays open or prepared

    def status(self, sink_id: str) -> SinkStatus:
        status = super().status(sink_id)
        in_table = self.last_batch_in_table(sink_id)
        status.notes.append(f"{self.history}: last batch committed by this sink = {in_table}")
        if in_table is not None and (status.last_committed is None
                                     or in_table > status.last_committed):
            status.unfinished.append(in_table)
            status.notes.append(
                f"batch {in_table} is committed in the {self.format_name} table but not yet "
                "recorded in the ledger: the sink's next run records it without writing it "
                "again")
        return status

    def recover(
        self, sink_id: str, *, commit_decided: bool, abort_undecided: bool, min_age_s: float
    ) -> RecoverReport:
        report = RecoverReport(sink_id, self.describe())
        report.notes.append(f"{self.format_name} commits are atomic: nothing to commit or roll "
                            "back; a batch committed but not recorded is recorded by the "
                            "sink's next run")
        return report
