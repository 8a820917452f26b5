"""Executor side of the MariaDB sink: one XA branch per Spark task attempt.

A task's steps, on a connection of its own (MariaDB keeps a prepared branch attached to
the session that prepared it, so a connection prepares one branch and is then closed):

1. :meth:`TaskWriter.begin`: connect (strict, UTC session), ``XA START <xid>``;
2. :meth:`TaskWriter.write`: each Arrow batch of the partition encoded
   (:mod:`connectors.mariadb._encode`) and spooled to a private temporary file;
3. :meth:`TaskWriter.pre_commit`: ``LOAD DATA LOCAL INFILE`` of the spool, then the load's
   warnings read: any warning refuses the batch (MariaDB reports some bad values of a
   ``LOCAL`` load as warnings, not errors; :mod:`connectors.mariadb._strict` names the
   column, the row number and the fix, never a value); the receipt row (xid, sink, batch,
   rows, fingerprint) inserted into the ledger's receipts table; ``XA END``,
   ``XA PREPARE``; the connection closed, the spool removed.

With ``mode="upsert"`` the task keeps its batches until the prepare, reduces them to one
row per key (the greatest by value: :func:`~connectors.core.keyed.last_row_per_key`; the
driver routed every row of a key to one task), loads them into a temporary table made
``LIKE`` the target inside the branch (so the load's warnings are the target's), then
``INSERT ... SELECT ... ON DUPLICATE KEY UPDATE`` every other column (LOAD DATA has no
upsert of its own; its ``REPLACE`` would delete and re-insert).

With ``mode="changes"`` the task keeps its batches staged with their op and sequence
values (a bad op fails the task before anything is sent) and at the prepare applies the
last change of each key (:mod:`connectors.mariadb._changes`): the upserted rows as the
upsert does, the deleted keys through a second temporary table and ``DELETE ... JOIN``.

A failure before the prepare closes the connection: MariaDB rolls back a branch that is not
prepared when its session ends. No statement inside a branch is ever retried (a retried
statement could apply twice); a failed task is a new attempt with a new xid.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from dataclasses import dataclass, field
from typing import IO, Any

import pyarrow as pa

from connectors.core.changes import stage
from connectors.core.errors import BadInputError
from connectors.core.fingerprint import Fingerprint
from connectors.core.keyed import last_row_per_key
from connectors.core.naming import TransactionId
from connectors.mariadb._changes import DELETES, delete_sql, deletes_table_sql, split
from connectors.mariadb._client import connect, raise_translated, translate
from connectors.mariadb._config import Address, MariaDBOptions, TableName, quote
from connectors.mariadb._encode import LoadPlan, ValueRefused
from connectors.mariadb._strict import refusal
from connectors.mariadb._tables import TablePlan
from connectors.mariadb._xid import xid_sql

__all__ = ["MariaTxn", "TaskWriter"]

logger = logging.getLogger(__name__)

#: The upsert's staging table: temporary, so private to the task's session (and branch).
STAGE = "connectors_stage"


@dataclass
class MariaTxn:
    """One task attempt's open branch: its connection, xid and spool."""

    conn: Any
    tid: TransactionId
    transaction_id: str
    plan: TablePlan
    spool: IO[bytes]
    rows: int = 0
    pending: list[pa.RecordBatch] = field(default_factory=list)  # upsert, changes: kept


class TaskWriter:
    """The task side's settings (picklable) and its steps."""

    def __init__(self, address: Address, options: MariaDBOptions, sink_id: str,
                 values_in_errors: bool = False) -> None:
        self.address = address
        self.options = options
        self.sink_id = sink_id
        self.values_in_errors = values_in_errors

    def _error(self, doing: str, tid: TransactionId, exc: BaseException) -> BaseException:
        return translate(exc, doing=doing, address=self.address, sink_id=self.sink_id,
                         values=self.values_in_errors, batch_id=tid.batch_id,
                         transaction_id=str(tid))

    def begin(self, tid: TransactionId, plan: TablePlan) -> MariaTxn:
        """Connect and ``XA START`` the branch of ``tid``."""
        conn = connect(self.address, connect_timeout=self.options.connect_timeout,
                       lock_wait_timeout=self.options.lock_wait_timeout, local_infile=True)
        try:
            raise_translated(lambda: conn.cursor().execute(f"XA START {xid_sql(tid)}"),
                             lambda exc: self._error("starting the XA branch", tid, exc))
            spool = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in _release
                prefix=f"connectors-mariadb-{self.sink_id}-", suffix=".tsv", delete=False)
        except BaseException:
            _close(conn)
            raise
        return MariaTxn(conn=conn, tid=tid, transaction_id=str(tid), plan=plan, spool=spool)

    def write(self, handle: MariaTxn, batch: pa.RecordBatch) -> None:
        """Encode ``batch`` into the branch's spool (nothing is sent yet)."""
        if batch.num_rows == 0:
            return
        if self.options.mode == "changes":  # the rows with their op and sequence
            handle.pending.append(stage(
                batch, batch.select(list(handle.plan.columns)), self.options,
                values_in_errors=self.values_in_errors, sink_id=self.sink_id,
                batch_id=handle.tid.batch_id, transaction_id=handle.transaction_id))
            return
        if self.options.mode == "upsert":
            handle.pending.append(batch)
            return
        self._spool(handle, batch, handle.plan.load)

    def _spool(self, handle: MariaTxn, batch: pa.RecordBatch | pa.Table,
               load: LoadPlan) -> None:
        try:
            data = load.encode(batch)
        except ValueRefused as exc:  # a value MariaDB has no form for (NaN, ...)
            raise BadInputError(f"{exc}: nothing was committed", sink_id=self.sink_id,
                                batch_id=handle.tid.batch_id) from None
        handle.spool.write(memoryview(data))
        handle.rows += batch.num_rows

    def pre_commit(self, handle: MariaTxn, fingerprint: Fingerprint) -> None:
        """Load the spool, refuse on any warning, insert the receipt, ``XA END`` and
        ``XA PREPARE``; then close the connection (see the module docstring)."""
        tid = handle.tid
        try:
            cur = handle.conn.cursor()
            self._apply(handle, cur)
            receipts = self.options.ledger_table.sql("_receipts")
            raise_translated(
                lambda: cur.execute(
                    f"INSERT INTO {receipts} (xid, sink_id, batch_id, `rows`, digest) VALUES "
                    "(%s, %s, %s, %s, %s)", (handle.transaction_id, self.sink_id,
                                             tid.batch_id, fingerprint.rows, fingerprint.hex)),
                lambda exc: self._error("inserting the receipt", tid, exc))
            xid = xid_sql(tid)
            raise_translated(lambda: (cur.execute(f"XA END {xid}"),
                                      cur.execute(f"XA PREPARE {xid}")),
                             lambda exc: self._error("preparing the XA branch", tid, exc))
        finally:
            self._release(handle)

    def _apply(self, handle: MariaTxn, cur: Any) -> None:
        """The rows into the table, inside the branch (by mode)."""
        plan, mode = handle.plan, self.options.mode
        if mode == "append":
            handle.spool.flush()
            if handle.rows:
                self._load(handle, cur, plan.table, plan.load)
            return
        if not handle.pending:
            return
        stage_table = TableName(plan.table.database, STAGE)
        if mode == "upsert":
            upserts = last_row_per_key(pa.Table.from_batches(handle.pending), plan.keys)
            deletes = None
        else:
            upserts, deletes = split(handle.pending, self.options, plan.columns, plan.keys)
        if upserts.num_rows:
            self._staged(handle, cur, upserts, plan.load, stage_table,
                         f"CREATE TEMPORARY TABLE {stage_table.sql()} LIKE {plan.table.sql()}",
                         self._upsert_sql(plan, stage_table), "upserting")
        if deletes is not None and deletes.num_rows:
            assert plan.key_load is not None  # plan_table builds it for mode="changes"
            deleted = TableName(plan.table.database, DELETES)
            self._staged(handle, cur, deletes, plan.key_load, deleted,
                         deletes_table_sql(plan.table, deleted, plan.keys),
                         delete_sql(plan.table, deleted, plan.keys), "deleting")

    def _staged(self, handle: MariaTxn, cur: Any, rows: pa.Table, load: LoadPlan,
                stage_table: TableName, create: str, apply: str, doing: str) -> None:
        """``rows`` spooled, loaded into a temporary table made by ``create`` (warnings
        refused), then ``apply`` and the table dropped."""
        tid, table = handle.tid, handle.plan.table
        handle.spool.seek(0)
        handle.spool.truncate()
        handle.rows = 0
        self._spool(handle, rows, load)
        handle.spool.flush()
        raise_translated(lambda: cur.execute(create), lambda exc: self._error(
            f"creating the staging table for {doing}", tid, exc))
        self._load(handle, cur, stage_table, load)
        raise_translated(lambda: (cur.execute(apply),
                                  cur.execute(f"DROP TEMPORARY TABLE {stage_table.sql()}")),
                         lambda exc: self._error(f"{doing} {table}", tid, exc))

    def _load(self, handle: MariaTxn, cur: Any, into: TableName, load: LoadPlan) -> None:
        """``LOAD DATA LOCAL INFILE`` of the spool into ``into``; any warning refuses the
        batch (:mod:`connectors.mariadb._strict`)."""
        tid, table = handle.tid, handle.plan.table
        statement = load.statement((into.database, into.name), handle.spool.name)
        raise_translated(lambda: cur.execute(statement), lambda exc: self._error(
            f"loading {handle.rows} rows into {table}", tid, exc))
        if cur.warning_count:
            warnings = raise_translated(
                handle.conn.show_warnings,
                lambda exc: self._error("reading the load's warnings", tid, exc))
            raise BadInputError(
                f"loading into {table}: "
                + refusal(warnings, load.names, total=cur.warning_count)
                + "\nNothing was committed; after the fix a restart writes the batch",
                sink_id=self.sink_id, batch_id=tid.batch_id)

    def _upsert_sql(self, plan: TablePlan, stage: TableName) -> str:
        """``INSERT INTO <table> (cols) SELECT cols FROM <stage> ON DUPLICATE KEY UPDATE``
        every non-key column (a key column itself when there is none)."""
        cols = [quote(c) for c in plan.columns]
        keys = {k.lower() for k in self.options.key_columns}
        others = [quote(c) for c in plan.columns if c.lower() not in keys] or cols[:1]
        updates = ", ".join(f"{c} = VALUES({c})" for c in others)
        return (f"INSERT INTO {plan.table.sql()} ({', '.join(cols)}) SELECT {', '.join(cols)} "
                f"FROM {stage.sql()} ON DUPLICATE KEY UPDATE {updates}")

    def abort(self, handle: MariaTxn) -> None:
        """Close the connection (the unprepared branch rolls back with its session)."""
        self._release(handle)

    @staticmethod
    def _release(handle: MariaTxn) -> None:
        _close(handle.conn)
        with contextlib.suppress(OSError):
            handle.spool.close()
        with contextlib.suppress(OSError):
            os.unlink(handle.spool.name)


def _close(conn: Any) -> None:
    with contextlib.suppress(Exception):
        conn.close()
