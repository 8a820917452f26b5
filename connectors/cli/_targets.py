"""The targets the operator commands inspect and settle, one class per participant.

Each target answers the same four questions for the sinks that write into it: which
sinks it knows, a sink's ledger (binding, decisions), the transactions it left open or
prepared, and how to settle them. Settling uses the sinks' own recovery code and the same
ledger serialization (the per-sink lease), so it can never race a live driver: an abort
records "this run may never decide this batch" under the lease before rolling back, and a
live driver then fails that batch (and retries it) instead of committing half of it.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence

from connectors.cli._model import Lingering, RecoverReport, SinkStatus
from connectors.core.driver.operator import PreparedAdmin
from connectors.core.ledgers.ledger import Ledger, LedgerEntry, lineage_chain
from connectors.core.naming import TransactionId
from connectors.core.protocol.fanout_program import TARGET_PREFIX, parts_of
from connectors.core.states import BatchState

__all__ = ["MariaDBTarget", "PostgresTarget", "PreparedTarget", "Target"]

logger = logging.getLogger(__name__)


class Target(ABC):
    """One participant (a database, a broker, a table) as the operator tools see it."""

    #: "postgres", "mariadb", "kafka", "delta" or "iceberg".
    kind: str

    @abstractmethod
    def describe(self) -> str:
        """The target for humans, secrets redacted."""

    @abstractmethod
    def sink_ids(self) -> list[str]:
        """Every sink id this target has a ledger or transactions for."""

    @abstractmethod
    def ledger(self, sink_id: str) -> Ledger:
        """The sink's ledger (read-only use by ``status`` and ``doctor``)."""

    @abstractmethod
    def lingering(self, sink_id: str) -> list[Lingering]:
        """Transactions of the sink that are open or prepared right now."""

    @abstractmethod
    def recover(
        self, sink_id: str, *, commit_decided: bool, abort_undecided: bool, min_age_s: float
    ) -> RecoverReport:
        """Settle what dead drivers left: commit decided, roll back undecided."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    def status(self, sink_id: str) -> SinkStatus:
        """The sink's ledger and lingering transactions."""
        ledger = self.ledger(sink_id)
        try:
            entries = ledger.entries()
            status = SinkStatus(sink_id, self.describe(), query_id=ledger.bound_query())
            status.lineage = [link.to_json()
                              for link in lineage_chain(ledger.lineage(), status.query_id)]
        finally:
            ledger.close()
        committed = [e.batch_id for e in entries if e.state is BatchState.COMMITTED]
        status.last_committed = max(committed) if committed else None
        status.unfinished = [e.batch_id for e in entries if e.state is BatchState.DECIDED]
        status.lingering = self.lingering(sink_id)
        status.fan_out_targets = fan_out_targets(entries, sink_id)
        if status.lineage:
            status.notes.append("lineage: " + describe_lineage(status.lineage))
        if status.fan_out_targets:
            status.notes.append(
                f"a fan-out (connectors.FanOut) of {', '.join(status.fan_out_targets)}: one "
                "decision per batch, each target's own state listed under its sink id"
                + ("; an unfinished batch is decided and not yet in every target: the "
                   "query finishes it when it runs again" if status.unfinished else ""))
        return status

    def fan_out_parts(self, sink_id: str) -> list[LedgerEntry]:
        """``sink_id``'s parts of the unfinished decisions of the fan-outs whose ledgers
        are in this target: its prepared transactions there are decided (a fan-out's run
        start adopts them, and so does ``recover``)."""
        parts: list[LedgerEntry] = []
        for other in self.sink_ids():
            if other == sink_id:
                continue
            ledger = self.ledger(other)
            try:
                parts += [part for decision in ledger.unfinished()
                          if (part := parts_of(decision, sink_id)) is not None]
            finally:
                ledger.close()
        return parts


def describe_lineage(links: Sequence[dict[str, object]]) -> str:
    """``query A -> savepoint at batch N -> query B -> ...`` for people."""
    parts = [f"query {links[0]['from_query_id']}"]
    for link in links:
        parts += [f"savepoint at batch {link['batch_id']}", f"query {link['query_id']}"]
    return " -> ".join(parts)


def fan_out_targets(entries: Sequence[LedgerEntry], sink_id: str) -> list[str]:
    """The targets a fan-out's decisions name (none: the ledger is a sink's own)."""
    names: set[str] = set()
    for entry in entries:
        for commit in entry.commits:
            tid = commit.transaction_id
            if tid.startswith(TARGET_PREFIX):
                names.add(tid[len(TARGET_PREFIX):])
                continue
            parsed = TransactionId.parse(tid)
            if parsed is not None and parsed.sink_id != sink_id:
                names.add(parsed.sink_id)
    return sorted(names)


class PreparedTarget(Target):
    """A database of prepared transactions, through its admin
    (:class:`~connectors.core.driver.operator.PreparedAdmin`): the ledger tables and the
    transactions the sinks prepared there.

    ``recover`` leaves an undecided transaction alone while a live driver may still
    decide it: when it is younger than ``--min-age``; and, when the database gives no age
    (MariaDB), unless the ledger holds a decision of its batch or a later one (its run can
    no longer decide it) or ``--min-age`` is 0 (the operator says no driver runs). Even
    then a roll-back is safe: it is recorded in the ledger first."""

    def __init__(self, admin: PreparedAdmin) -> None:
        self.admin = admin

    def describe(self) -> str:
        return self.admin.describe()

    def sink_ids(self) -> list[str]:
        return self.admin.sink_ids()

    def ledger(self, sink_id: str) -> Ledger:
        return self.admin.ledger(sink_id)

    def lingering(self, sink_id: str) -> list[Lingering]:
        return self._lingering(sink_id)[0]

    def _lingering(self, sink_id: str) -> tuple[list[Lingering], int | None]:
        """The sink's prepared transactions, and the last batch its ledger decided."""
        mine = sorted(self.admin.prepared(sink_id), key=lambda p: str(p.transaction_id))
        if not mine:
            return [], None
        ledger = self.ledger(sink_id)
        try:
            entries = ledger.entries()
        finally:
            ledger.close()
        decided = {c.transaction_id for e in entries for c in e.commits}
        decided |= {c.transaction_id for part in self.fan_out_parts(sink_id)
                    for c in part.commits}
        last = max((e.batch_id for e in entries), default=None)
        return [Lingering(str(p.transaction_id), p.transaction_id.batch_id,
                          None if p.age_s is None else round(p.age_s, 1),
                          str(p.transaction_id) in decided, "prepared") for p in mine], last

    def recover(
        self, sink_id: str, *, commit_decided: bool, abort_undecided: bool, min_age_s: float
    ) -> RecoverReport:
        report = RecoverReport(sink_id, self.describe())
        lingering, last = self._lingering(sink_id)
        young = [item for item in lingering
                 if not item.decided and _may_be_decided(item, min_age_s, last)]
        done = self.admin.settle(
            sink_id, [item.transaction for item in lingering], commit_decided=commit_decided,
            abort_undecided=abort_undecided, keep=frozenset(item.transaction for item in young),
            adopt=self.fan_out_parts(sink_id) if lingering else ())  # never rolled back
        report.committed += done.committed
        report.aborted += done.aborted
        left = set(done.left)
        report.left += [item for item in lingering if item.transaction in left]
        if abort_undecided:
            report.notes += [_why_kept(item, min_age_s) for item in young]
        return report

    def close(self) -> None:
        self.admin.close()


def _may_be_decided(item: Lingering, min_age_s: float, last_decided: int | None) -> bool:
    """Whether a live driver may still decide the undecided ``item`` (see
    :class:`PreparedTarget`)."""
    if item.age_s is not None:
        return item.age_s < min_age_s
    past = (last_decided is not None and item.batch_id is not None
            and last_decided >= item.batch_id)
    return min_age_s > 0 and not past


def _why_kept(item: Lingering, min_age_s: float) -> str:
    if item.age_s is None:
        return (f"{item.transaction}: its age is unknown (the database does not tell) and "
                "no decision of its batch or a later one is in the ledger: a live driver may "
                "be about to decide it; once no driver of the sink runs, --min-age 0 rolls "
                "it back")
    return (f"{item.transaction} is {item.age_s:.0f} s old (< --min-age {min_age_s:.0f} s): "
            "a live driver may be about to decide it")


class PostgresTarget(PreparedTarget):
    """A PostgreSQL database (:class:`connectors.postgres.admin.PostgresAdmin`)."""

    kind = "postgres"

    def __init__(self, conninfo: str, ledger_table: str = "public.eos_ledger") -> None:
        from connectors.postgres.admin import PostgresAdmin

        super().__init__(PostgresAdmin(conninfo, ledger_table, what="--ledger-table"))


class MariaDBTarget(PreparedTarget):
    """A MariaDB database: its XA branches (``XA RECOVER``: no age)
    (:class:`connectors.mariadb.admin.MariaDBAdmin`)."""

    kind = "mariadb"

    def __init__(self, url: str, ledger_table: str | None = None) -> None:
        from connectors.mariadb.admin import DEFAULT_LEDGER_TABLE, MariaDBAdmin

        super().__init__(MariaDBAdmin(url, ledger_table or DEFAULT_LEDGER_TABLE,
                                      what="--mariadb-ledger-table"))
