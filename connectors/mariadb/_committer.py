"""Driver side of the MariaDB sink: settle prepared XA branches by xid.

After the template recorded the decision in the ledger, :meth:`Committer.commit` runs
``XA COMMIT`` for exactly the ids Spark returned. MariaDB answers ``XAER_NOTA`` (1397) for
an xid it does not hold prepared: the branch is then either committed before (its receipt
proves it) or, while ``XA RECOVER`` still lists it, held by a session that has not ended
yet (a task's connection the server has not seen close): a transient error, retried,
never presumed lost. A branch neither listed nor receipted was rolled back outside the
sink: a :class:`~connectors.core.errors.DataLossError`. :meth:`Committer.abort` runs
``XA ROLLBACK``; :meth:`Committer.list_prepared` lists this sink's branches
(``XA RECOVER``) so the template's sweeps roll back everything else. All of it on the
driver's one connection (:class:`~connectors.mariadb._ledger.DriverConnection`).
"""

from __future__ import annotations

from typing import Any

from connectors.core.errors import DataLossError, TransientError
from connectors.core.ledgers.ledger import TaskCommit
from connectors.core.naming import TransactionId
from connectors.mariadb._client import error_code
from connectors.mariadb._config import TableName
from connectors.mariadb._ledger import DriverConnection, MariaDBLedger
from connectors.mariadb._xid import transaction_id_of_row, xid_sql

__all__ = ["XAER_NOTA", "Committer"]

#: ``XAER_NOTA``: unknown XID (not prepared here, or not detached from its session yet).
XAER_NOTA = 1397


class Committer:
    """Commits, rolls back and finds one sink's prepared branches by xid."""

    def __init__(self, db: DriverConnection, ledger_table: TableName, *, sink_id: str) -> None:
        self.db = db
        self.ledger_table = ledger_table
        self.sink_id = sink_id

    def _settle(self, verb: str, transaction_id: str, tid: TransactionId) -> bool:
        """``XA COMMIT`` / ``XA ROLLBACK`` of the xid; False if MariaDB does not hold it."""
        def run(conn: Any) -> bool:
            try:
                with conn.cursor() as cur:
                    cur.execute(f"{verb} {xid_sql(tid)}")
            except Exception as exc:
                if error_code(exc) == XAER_NOTA:
                    return False
                raise
            return True

        return self.db.run(verb, run, batch_id=tid.batch_id, transaction_id=transaction_id)

    def commit(self, commit: TaskCommit) -> None:
        """``XA COMMIT``; idempotent: a receipt proves an earlier commit."""
        tid = TransactionId.parse(commit.transaction_id)
        if tid is None:
            raise DataLossError("not a transaction id of this library", sink_id=self.sink_id,
                                transaction_id=commit.transaction_id)
        if self._settle("XA COMMIT", commit.transaction_id, tid):
            return
        ledger = MariaDBLedger(self.db, self.ledger_table, sink_id=self.sink_id)
        if ledger.receipt(commit.transaction_id):
            return  # committed before: its receipt is the proof
        if commit.transaction_id in self.list_prepared():
            raise TransientError(
                "a decided branch is prepared but still attached to the session that prepared "
                "it (MariaDB answers XAER_NOTA until that connection is gone): retried",
                sink_id=self.sink_id, batch_id=tid.batch_id,
                transaction_id=commit.transaction_id)
        raise DataLossError(
            "a decided branch is neither prepared nor committed (no receipt): it was rolled "
            "back outside this sink (XA ROLLBACK by hand?) and its rows are lost",
            sink_id=self.sink_id, batch_id=tid.batch_id, transaction_id=commit.transaction_id)

    def abort(self, transaction_id: str) -> None:
        """``XA ROLLBACK``; nothing to do for a foreign id or one already gone."""
        tid = TransactionId.parse(transaction_id)
        if tid is not None:
            self._settle("XA ROLLBACK", transaction_id, tid)

    def list_prepared(self) -> list[str]:
        """Ids of this sink's branches prepared in this server right now."""
        found = []
        for row in self.db.fetch("listing prepared XA branches", "XA RECOVER"):
            tid = transaction_id_of_row(row)
            if tid is not None and tid.belongs_to(self.sink_id):
                found.append(str(tid))
        return found
