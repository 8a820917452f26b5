"""Driver side of :class:`~connectors.postgres.PostgresSink`: settle prepared transactions.

After the template recorded the decision in the ledger, :meth:`Committer.commit` runs
``COMMIT PREPARED`` for exactly the ids Spark returned (a gid no longer prepared is proved
committed by its receipt, else the rows are lost and it says so); :meth:`Committer.abort`
runs ``ROLLBACK PREPARED``; :meth:`Committer.list_prepared` lists this sink's prepared
transactions in this database so the template's sweeps roll back everything else.
All of it on the driver's one connection (:class:`~connectors.postgres._ledger.DriverConnection`).
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from connectors.core.errors import DataLossError
from connectors.core.ledgers.ledger import TaskCommit
from connectors.core.naming import TransactionId
from connectors.postgres._config import TableName
from connectors.postgres._errors import raise_translated
from connectors.postgres._gid import gid_of, transaction_id_of
from connectors.postgres._ledger import DriverConnection, PostgresLedger

__all__ = ["Committer"]


class Committer:
    """Commits, rolls back and finds one sink's prepared transactions by gid."""

    def __init__(self, db: DriverConnection, ledger_table: TableName, *, sink_id: str) -> None:
        self.db = db
        self.ledger_table = ledger_table
        self.sink_id = sink_id

    def _settle(self, verb: str, transaction_id: str, tid: TransactionId) -> bool:
        """``COMMIT PREPARED`` / ``ROLLBACK PREPARED`` the gid; False if it is not prepared."""
        statement = sql.SQL(verb + " {}").format(sql.Literal(gid_of(tid)))
        db = self.db
        with db.lock:
            conn = db.get()

            def run() -> bool:
                try:
                    conn.execute(statement)
                except psycopg.errors.UndefinedObject:  # SQLSTATE 42704: no such gid
                    return False
                return True

            return raise_translated(run, lambda exc: db.error(
                exc, verb, batch_id=tid.batch_id, transaction_id=transaction_id))

    def commit(self, commit: TaskCommit) -> None:
        """``COMMIT PREPARED``; idempotent: a receipt proves an earlier commit."""
        tid = TransactionId.parse(commit.transaction_id)
        if tid is None:
            raise DataLossError("not a transaction id of this library", sink_id=self.sink_id,
                                transaction_id=commit.transaction_id)
        if self._settle("COMMIT PREPARED", commit.transaction_id, tid):
            return
        # Not prepared (any more): committed before, or lost.
        ledger = PostgresLedger(self.db, self.ledger_table, sink_id=self.sink_id)
        if ledger.receipt(commit.transaction_id):
            return  # committed before: its receipt is the proof
        raise DataLossError(
            "a decided transaction is neither prepared nor committed (no receipt): it was "
            "rolled back outside this sink (ROLLBACK PREPARED by hand?) and its rows are lost",
            sink_id=self.sink_id, batch_id=tid.batch_id, transaction_id=commit.transaction_id,
        )

    def abort(self, transaction_id: str) -> None:
        """``ROLLBACK PREPARED``; nothing to do for a foreign id or one already gone."""
        tid = TransactionId.parse(transaction_id)
        if tid is None:
            return
        self._settle("ROLLBACK PREPARED", transaction_id, tid)  # gone already: nothing to do

    def list_prepared(self) -> list[str]:
        """Ids of this sink's transactions prepared in this database right now."""
        rows = self.db.fetch(
            "listing prepared transactions",
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")
        found = []
        for (gid,) in rows:
            tid = transaction_id_of(gid)
            if tid is not None and tid.belongs_to(self.sink_id):
                found.append(str(tid))
        return found
