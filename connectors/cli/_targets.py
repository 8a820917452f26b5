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
from typing import Any

from connectors.cli._model import Lingering, RecoverReport, SinkStatus
from connectors.core.fanout_program import TARGET_PREFIX, parts_of
from connectors.core.ledger import Ledger, LedgerEntry
from connectors.core.naming import TransactionId
from connectors.core.protocol import BatchState

__all__ = ["PostgresTarget", "Target"]

logger = logging.getLogger(__name__)


class Target(ABC):
    """One participant (a database, a broker, a table) as the operator tools see it."""

    #: "postgres", "kafka" or "delta".
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
        finally:
            ledger.close()
        committed = [e.batch_id for e in entries if e.state is BatchState.COMMITTED]
        status.last_committed = max(committed) if committed else None
        status.unfinished = [e.batch_id for e in entries if e.state is BatchState.DECIDED]
        status.lingering = self.lingering(sink_id)
        status.fan_out_targets = fan_out_targets(entries, sink_id)
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


class PostgresTarget(Target):
    """A PostgreSQL database: the ledger tables and ``pg_prepared_xacts``."""

    kind = "postgres"

    def __init__(self, conninfo: str, ledger_table: str = "public.eos_ledger") -> None:
        from connectors.postgres._config import Conninfo, TableName
        from connectors.postgres._ledger import DriverConnection
        from connectors.postgres._ledger_sql import LEDGER_NAME_RESERVE

        self.conninfo = Conninfo(conninfo)
        self.table = TableName.parse(ledger_table, what="--ledger-table",
                                     reserve=LEDGER_NAME_RESERVE)
        self._db = DriverConnection(self.conninfo, 10, "operator")

    def describe(self) -> str:
        return f"postgres {self.conninfo.redacted()} ledger {self.table}"

    def _rows(self, query: Any, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        with self._db.lock:
            try:
                return list(self._db.get().execute(query, params).fetchall())
            except psycopg.Error as exc:
                raise self._db.error(exc, "reading the sinks' state") from None

    def _prepared(self) -> list[tuple[TransactionId, float]]:
        from connectors.postgres._gid import XID_FORMAT_ID, decode_gid

        found = []
        for gid, age in self._rows(
            "SELECT gid, extract(epoch FROM now() - prepared) FROM pg_prepared_xacts "
            "WHERE database = current_database()"
        ):
            xid = decode_gid(gid)  # None for another application's gid
            if xid is None or xid[0] != XID_FORMAT_ID:
                continue
            tid = TransactionId.from_xid_parts(xid[1], xid[2])
            if tid is not None:
                found.append((tid, float(age)))
        return found

    def sink_ids(self) -> list[str]:
        from psycopg import sql

        names = {tid.sink_id for tid, _ in self._prepared()}
        exists = self._rows(
            "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s",
            (self.table.schema, self.table.name + "_bindings"),
        )
        if exists:
            names |= {r[0] for r in self._rows(
                sql.SQL("SELECT sink_id FROM {}").format(self.table.sql("_bindings")))}
        return sorted(names)

    def ledger(self, sink_id: str) -> Ledger:
        from connectors.postgres._ledger import DriverConnection, PostgresLedger

        return PostgresLedger(DriverConnection(self.conninfo, 10, sink_id), self.table,
                              sink_id=sink_id)

    def lingering(self, sink_id: str) -> list[Lingering]:
        mine = sorted(((tid, age) for tid, age in self._prepared() if tid.sink_id == sink_id),
                      key=lambda p: str(p[0]))
        if not mine:
            return []
        ledger = self.ledger(sink_id)
        try:
            decided = {c.transaction_id for e in ledger.entries() for c in e.commits}
        finally:
            ledger.close()
        decided |= {c.transaction_id for part in self.fan_out_parts(sink_id)
                    for c in part.commits}
        return [Lingering(str(tid), tid.batch_id, round(age, 1), str(tid) in decided,
                          "prepared") for tid, age in mine]

    def recover(
        self, sink_id: str, *, commit_decided: bool, abort_undecided: bool, min_age_s: float
    ) -> RecoverReport:
        from connectors.postgres._sink import PostgresSink

        report = RecoverReport(sink_id, self.describe())
        sink = PostgresSink.operator(self.conninfo.secret, sink_id=sink_id,
                                     ledger_table=(self.table.schema, self.table.name))
        ledger = sink.create_ledger()
        try:
            lingering = self.lingering(sink_id)
            young = [item for item in lingering if not item.decided and item.age_s is not None
                     and item.age_s < min_age_s]
            done, _ = sink.driver.settle(
                [item.transaction for item in lingering], commit_decided=commit_decided,
                abort_undecided=abort_undecided,
                keep=frozenset(item.transaction for item in young),
                adopt=self.fan_out_parts(sink_id) if lingering else (),  # never rolled back
                ledger=ledger)
            report.committed += done.committed
            report.aborted += done.aborted
            left = set(done.left)
            report.left += [item for item in lingering if item.transaction in left]
            if abort_undecided:
                report.notes += [
                    f"{item.transaction} is {item.age_s:.0f} s old (< --min-age "
                    f"{min_age_s:.0f} s): a live driver may be about to decide it"
                    for item in young if item.age_s is not None]
        finally:
            ledger.close()
            sink.close()
        return report

    def close(self) -> None:
        self._db.close()
