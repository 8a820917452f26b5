"""``PostgresSink``: exactly-once into PostgreSQL with prepared transactions (XA style).

Executor side, once per Spark task, in plain SQL on an autocommit connection the task owns
(no two-phase-commit state of the client library is involved):
  1. take an idle connection of this Python worker (or connect), ``BEGIN``;
  2. COPY the task's Arrow record batches in PostgreSQL's binary format (pgpq encodes,
     psycopg writes), or, with ``mode="upsert"``, ``INSERT ... ON CONFLICT DO UPDATE``
     of the task's rows deduplicated by key;
  3. insert a receipt (sink, batch, xid, rows, digest) in the same transaction;
  4. ``PREPARE TRANSACTION '<gid>'`` (the gid names sink, run, batch and ``taskAttemptId``,
     see :mod:`connectors.postgres._gid`): the transaction now outlives the task and the
     session is idle again; return the transaction id.

Driver side: the template records the decision in the ledger, then :meth:`commit` runs
``COMMIT PREPARED`` for exactly the ids Spark returned; :meth:`recover` lists this sink's
prepared transactions in this database so the sweeps roll back everything else.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from pgpq import ArrowToPostgresBinaryEncoder
from pgpq.encoders import LargeStringEncoderBuilder
from pgpq.schema import Jsonb
from psycopg import sql
from psycopg.pq import TransactionStatus

from connectors.core.batch import BatchInput
from connectors.core.errors import (
    BadInputError,
    ConfigurationError,
    ConnectorError,
    DataLossError,
    FatalError,
)
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledger import Ledger, TaskCommit
from connectors.core.naming import TransactionId
from connectors.core.tasks import TaskTransaction
from connectors.core.template import PreparedTransactionSink
from connectors.postgres._config import Conninfo, Mode, PostgresOptions, TableName
from connectors.postgres._errors import raise_translated, translate
from connectors.postgres._gid import XID_FORMAT_ID, decode_gid, encode_gid
from connectors.postgres._ledger import DriverConnection, PostgresLedger
from connectors.postgres._pool import TaskConnections, connected_before, record_connected
from connectors.postgres._types import Column, WritePlan, ddl_type, plan_write

__all__ = ["XID_FORMAT_ID", "PostgresSink"]

logger = logging.getLogger("connectors.postgres")

#: The placeholder table of :meth:`PostgresSink.operator` instances.
_OPERATOR_TABLE = "pg_catalog.connectors_operator_no_table"


@dataclass
class _PgTxn:
    """One task's open transaction."""

    conn: psycopg.Connection[Any]
    tid: TransactionId
    plan: WritePlan
    copy_cm: Any = None
    copy: Any = None
    encoder: ArrowToPostgresBinaryEncoder | None = None
    pending: list[pa.RecordBatch] = field(default_factory=list)


class PostgresSink(PreparedTransactionSink[_PgTxn]):
    """Exactly-once sink into a PostgreSQL table, for ``foreachBatch`` and batch jobs.

    Args:
        conninfo: libpq connection string (the password never appears in logs, reprs or
            errors). Tasks and the driver connect with it; prepared transactions are
            committed by the driver, so it must be the same role (or a superuser).
        table: ``"schema.table"`` or ``"table"`` (schema ``public``).
        sink_id: the sink's stable name (1-40 characters of ``A-Za-z0-9_-``).
        mode: ``"append"`` (binary COPY) or ``"upsert"`` (``INSERT ... ON CONFLICT (keys)
            DO UPDATE``; rows of one key are routed to one task and deduplicated
            deterministically: the greatest row by value wins).
        key_columns: the upsert key (a unique index of the table must cover exactly them).
        create_table: create the table from the batch's schema if it does not exist.
        ledger_table: where the ledger tables live (default ``public.eos_ledger``).
        lock_timeout: PostgreSQL ``lock_timeout`` in tasks (default ``"30s"``).
        connect_timeout: seconds.
        reuse_connections: keep a task's connection open after its ``PREPARE`` for the
            next task of the same Spark Python worker (default ``True``; connecting costs
            more than a small batch's write). Only an idle session is reused; idle
            connections are closed after 60 s.
        **options: the template's options (``retry``, ``reset_binding``,
            ``on_replay_mismatch``, ``keep_batches``, ``values_in_errors``: by default
            errors name table, column, constraint and type but quote no row value, not
            even PostgreSQL's ``DETAIL: Failing row contains (...)``).

    Example::

        sink = PostgresSink(conninfo, "public.events", sink_id="events-pg",
                            create_table=True)
        query = (df.writeStream.foreachBatch(sink)
                 .option("checkpointLocation", ckpt).start())

    The server needs ``max_prepared_transactions`` at least the number of tasks of a
    batch (the sink checks and says what to set).
    """

    #: Tasks fingerprint the Arrow batches they write: table rows are mostly numbers,
    #: timestamps and short strings, for which that is cheaper than the JVM's extra
    #: row-hash column (6.6 % faster end to end on the benchmark's rows; long text, bytea
    #: or jsonb values favour the JVM, see docs/postgres.md).
    hash_rows_in_tasks: ClassVar[bool] = True

    def __init__(
        self,
        conninfo: str,
        table: str | tuple[str, str],
        *,
        sink_id: str,
        mode: Mode = "append",
        key_columns: Iterable[str] | None = None,
        create_table: bool = False,
        ledger_table: str | tuple[str, str] = "public.eos_ledger",
        lock_timeout: str = "30s",
        connect_timeout: int = 10,
        reuse_connections: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(sink_id=sink_id, **options)
        self.conninfo = Conninfo(conninfo)
        self.options = PostgresOptions(
            table=TableName.parse(table),
            mode=mode,
            key_columns=tuple(key_columns or ()),
            create_table=bool(create_table),
            ledger_table=TableName.parse(ledger_table, what="ledger_table"),
            lock_timeout=lock_timeout,
            connect_timeout=connect_timeout,
            reuse_connections=bool(reuse_connections),
        )
        self._plan: WritePlan | None = None
        self._db: DriverConnection | None = None
        self._checked_prepared = 0

    @classmethod
    def operator(
        cls,
        conninfo: str,
        *,
        sink_id: str,
        ledger_table: str | tuple[str, str] = "public.eos_ledger",
    ) -> PostgresSink:
        """An instance for the operator tools (``connectors recover``): it can settle the
        sink's prepared transactions through its ledger, and refuses to write."""
        return cls(conninfo, _OPERATOR_TABLE, sink_id=sink_id, ledger_table=ledger_table)

    def __repr__(self) -> str:
        return (
            f"PostgresSink({self.conninfo.redacted()!r}, {str(self.options.table)!r}, "
            f"sink_id={self.sink_id!r}, mode={self.options.mode!r})"
        )

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_db"] = None  # the driver's connection never travels to executors
        return state

    # ---- helpers ----
    def _error(self, exc: BaseException, doing: str, **ids: Any) -> ConnectorError:
        """``exc`` in the library's error tree; row values only with ``values_in_errors``.

        Raise the result outside the ``except`` block (or through ``raise_translated``)
        so that the psycopg exception is not kept as its ``__context__``.
        """
        if isinstance(exc, ConnectorError):
            return exc
        return translate(exc, doing=doing, password=self.conninfo.password,
                         values=self.values_in_errors, sink_id=self.sink_id, **ids)

    def _driver_db(self) -> DriverConnection:
        if self._db is None:
            self._db = DriverConnection(
                self.conninfo, self.options.connect_timeout, self.sink_id,
                self.options.lock_timeout, values_in_errors=self.values_in_errors,
            )
        return self._db

    @staticmethod
    def _gid(tid: TransactionId) -> str:
        """The gid of ``PREPARE TRANSACTION``: byte-identical to earlier releases' gids."""
        gtrid, bqual = tid.xid_parts()
        return encode_gid(XID_FORMAT_ID, gtrid, bqual)

    def _driver_sql(self, doing: str, statement: str, **ids: Any) -> list[Any]:
        """Run one statement on the driver's connection; its rows, errors translated."""
        db = self._driver_db()
        with db.lock:
            conn = db.get()
            return raise_translated(lambda: conn.execute(statement).fetchall(),
                                    lambda exc: self._error(exc, doing, **ids))

    # ---- driver: ledger, validation, routing ----
    def create_ledger(self) -> Ledger:
        return PostgresLedger(self._driver_db(), self.options.ledger_table, sink_id=self.sink_id)

    def _columns(self, conn: psycopg.Connection[Any]) -> list[Column]:
        rows = conn.execute(
            "SELECT a.attname, t.typname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
            "a.atthasdef FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_type t ON t.oid = a.atttypid "
            "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped "
            "ORDER BY a.attnum",
            (self.options.table.schema, self.options.table.name),
        ).fetchall()
        return [Column(r[0], r[1], r[2], bool(r[3]), bool(r[4])) for r in rows]

    def validate_input(self, schema: pa.Schema) -> None:
        """Driver: the table exists (or is created), every column fits, keys are indexed."""
        table = self.options.table
        if table == TableName.parse(_OPERATOR_TABLE):
            raise ConfigurationError("PostgresSink.operator(...) settles transactions; it "
                                     "cannot write: create a PostgresSink with a table",
                                     sink_id=self.sink_id)
        db = self._driver_db()
        with db.lock:
            conn = db.get()

            def read() -> list[Column]:
                columns = self._columns(conn)
                if not columns and self.options.create_table:
                    self._create_table(conn, schema)
                    columns = self._columns(conn)
                return columns

            columns = raise_translated(
                read, lambda exc: self._error(exc, f"reading the columns of {table}"))
        if not columns:
            raise BadInputError(
                f"table {table} does not exist: create it, or pass create_table=True",
                sink_id=self.sink_id,
            )
        plan = plan_write(str(table), schema, columns)
        missing_keys = [k for k in self.options.key_columns if k not in plan.columns]
        if missing_keys:
            raise BadInputError(
                f"key column(s) {', '.join(missing_keys)} are not in the batch",
                sink_id=self.sink_id,
            )
        self._plan = plan

    def _create_table(self, conn: psycopg.Connection[Any], schema: pa.Schema) -> None:
        columns = [
            sql.SQL("{} {}").format(sql.Identifier(f.name), sql.SQL(ddl_type(f.type)))
            for f in schema
        ]
        if self.options.key_columns:
            columns.append(sql.SQL("PRIMARY KEY ({})").format(
                sql.SQL(", ").join(map(sql.Identifier, self.options.key_columns))))
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            self.options.table.sql(), sql.SQL(", ").join(columns)))
        logger.info("sink %s: created table %s", self.sink_id, self.options.table)

    def partition_input(self, batch: BatchInput) -> BatchInput:
        """Driver: check ``max_prepared_transactions``; in upsert mode route keys."""
        tasks = batch.estimated_partitions() or 1
        self._check_max_prepared(tasks)
        if self.options.mode == "upsert":
            return batch.slotted(tasks, list(self.options.key_columns))
        return batch

    def _check_max_prepared(self, tasks: int) -> None:
        if self._checked_prepared and tasks <= self._checked_prepared:
            return
        rows = self._driver_sql("reading max_prepared_transactions",
                                "SHOW max_prepared_transactions")
        limit = int(rows[0][0]) if rows else 0
        if limit < tasks:
            needed = max(64, tasks * 2)
            raise ConfigurationError(
                f"max_prepared_transactions is {limit} on the server, below the {tasks} "
                f"task(s) of this batch that each prepare a transaction: set "
                f"max_prepared_transactions = {needed} in postgresql.conf (ALTER SYSTEM SET "
                f"max_prepared_transactions = {needed}) and restart PostgreSQL",
                sink_id=self.sink_id,
            )
        self._checked_prepared = limit

    # ---- executor side ----
    def _pool_key(self) -> str:
        o = self.options
        return TaskConnections.key(self.conninfo.secret, o.lock_timeout, str(o.connect_timeout),
                                   self.sink_id)

    def _connect_task(self, tid: TransactionId) -> psycopg.Connection[Any]:
        key = self._pool_key()

        def connect() -> psycopg.Connection[Any]:
            return psycopg.connect(
                self.conninfo.secret,
                autocommit=True,  # the task's SQL says BEGIN and PREPARE TRANSACTION itself
                connect_timeout=self.options.connect_timeout,
                options=f"-c lock_timeout={self.options.lock_timeout}",
                application_name=f"connectors-task:{self.sink_id}",
            )

        conn = raise_translated(connect, lambda exc: self._error(
            exc, f"connecting to {self.conninfo}", connecting=True,
            connected_before=connected_before(key), batch_id=tid.batch_id,
            transaction_id=str(tid)))
        record_connected(key)
        return conn

    def begin_transaction(self, txn: TaskTransaction) -> _PgTxn:
        """Executor: ``BEGIN`` on an idle session of this worker or a new one; start COPY.

        A reused session that fails before anything was written on it (the server dropped
        it, or the client refuses it: no SQLSTATE) is closed and replaced, once.
        """
        plan = self._plan
        if plan is None:  # pragma: no cover - validate_input always runs first
            raise ConfigurationError("the sink was not validated on the driver")
        tid = txn.transaction_id
        reused = TaskConnections.take(self._pool_key()) if self.options.reuse_connections else None
        if reused is not None and reused.info.transaction_status is not TransactionStatus.IDLE:
            reused.close()  # pragma: no cover - the pool hands out idle sessions only
            reused = None
        conn = reused or self._connect_task(tid)
        handle, failure, session_lost = self._begin(conn, tid, plan)
        if handle is not None:
            return handle
        if reused is not None and session_lost:
            logger.info("sink %s: a reused task connection failed before any write (%s); "
                        "beginning on a new one", self.sink_id, type(failure).__name__)
            handle, failure, _ = self._begin(self._connect_task(tid), tid, plan)
            if handle is not None:
                return handle
        assert failure is not None  # _begin returns a handle or a failure
        error = self._error(failure, "starting the task's transaction", batch_id=tid.batch_id,
                            transaction_id=str(tid))
        del failure  # nothing of the client's exception travels with the error
        raise error

    def _begin(
        self, conn: psycopg.Connection[Any], tid: TransactionId, plan: WritePlan
    ) -> tuple[_PgTxn | None, BaseException | None, bool]:
        """``BEGIN`` (+ COPY): ``(handle, _, _)``, or ``(None, failure, session_lost)`` with
        the connection closed. ``session_lost``: the session died or the client refused it
        (no SQLSTATE), so a new session may succeed; a statement the server refused
        (``UndefinedTable``, ``InsufficientPrivilege``, ...) would fail there too."""
        handle = _PgTxn(conn, tid, plan)
        try:
            conn.execute("BEGIN")
            if conn.info.transaction_status is not TransactionStatus.INTRANS:
                raise FatalError(  # pragma: no cover - BEGIN on an idle session opens one
                    f"BEGIN left the task's session {conn.info.transaction_status.name}, not "
                    "in a transaction", sink_id=self.sink_id, batch_id=tid.batch_id,
                    transaction_id=str(tid))
            if self.options.mode == "append":
                self._start_copy(handle)
        except Exception as exc:
            lost = isinstance(exc, psycopg.Error) and (exc.sqlstate is None or conn.broken)
            conn.close()
            return None, exc.with_traceback(None), lost
        return handle, None, False

    def _start_copy(self, h: _PgTxn) -> None:
        statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
            self.options.table.sql(), sql.SQL(", ").join(map(sql.Identifier, h.plan.columns)))
        h.copy_cm = h.conn.cursor().copy(statement)
        h.copy = h.copy_cm.__enter__()
        if h.plan.jsonb:
            # pgpq wants an encoder for every field once one is given (else "UnknownFields").
            encoders = {f.name: ArrowToPostgresBinaryEncoder.infer_encoder(f)
                        for f in h.plan.schema}
            for name in h.plan.jsonb:
                encoders[name] = LargeStringEncoderBuilder.new_with_output(
                    h.plan.schema.field(name), Jsonb())
            h.encoder = ArrowToPostgresBinaryEncoder.new_with_encoders(h.plan.schema, encoders)
        else:
            h.encoder = ArrowToPostgresBinaryEncoder(h.plan.schema)
        h.copy.write(h.encoder.write_header())

    def _cast(self, h: _PgTxn, batch: pa.RecordBatch) -> pa.RecordBatch:
        try:
            return batch.select(list(h.plan.columns)).cast(h.plan.schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            # Arrow's text quotes the value: only with values_in_errors.
            quoted = f": {exc}" if self.values_in_errors else ""
        column = self._failing_column(h, batch)
        raise BadInputError(
            f"a value {column}does not fit its column in {self.options.table}{quoted}",
            sink_id=self.sink_id, batch_id=h.tid.batch_id, transaction_id=str(h.tid),
        )

    @staticmethod
    def _failing_column(h: _PgTxn, batch: pa.RecordBatch) -> str:
        """``"of column 'x' (integer) "`` for the first column whose cast fails, or ``""``."""
        for target in h.plan.schema:
            try:
                batch.column(target.name).cast(target.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                sql_type = h.plan.sql_types[h.plan.columns.index(target.name)]
                return f"of column {target.name!r} ({sql_type}) "
        return ""  # pragma: no cover - the same casts, one at a time

    def write(self, handle: _PgTxn, batch: pa.RecordBatch) -> None:
        cast = self._cast(handle, batch)
        if self.options.mode == "upsert":
            handle.pending.append(cast)
            return
        assert handle.encoder is not None
        encoder, copy = handle.encoder, handle.copy
        raise_translated(lambda: copy.write(encoder.write_batch(cast)), lambda exc: self._error(
            exc, f"COPY into {self.options.table}", batch_id=handle.tid.batch_id,
            transaction_id=str(handle.tid)))

    def pre_commit(self, handle: _PgTxn, fingerprint: Fingerprint) -> bytes:
        """Executor: end the COPY (or upsert), insert the receipt, ``PREPARE TRANSACTION``.

        Steps (each failure closes the session: an unprepared transaction dies with it):
          1. finish writing the rows;
          2. the receipt and ``PREPARE TRANSACTION '<gid>'`` in one pipelined round trip;
             the server must answer ``PREPARE TRANSACTION`` (a transaction it had aborted
             would answer ``ROLLBACK``);
          3. hand the idle session back for the next task of this worker.
        """
        h = handle
        ids = {"batch_id": h.tid.batch_id, "transaction_id": str(h.tid)}
        error: ConnectorError | None = None
        # Step 1
        try:
            if self.options.mode == "append":
                assert h.encoder is not None
                h.copy.write(h.encoder.finish())
                h.copy_cm.__exit__(None, None, None)
                h.copy_cm = None
            else:
                self._upsert(h)
        except Exception as exc:
            error = self._error(exc, f"writing into {self.options.table}", **ids)
        # Step 2
        if error is None:
            try:
                self._prepare(h, fingerprint)
            except Exception as exc:
                error = self._error(exc, f"preparing the transaction of {self.options.table}",
                                    preparing=True, **ids)
        if error is not None:
            h.conn.close()
            raise error
        # Step 3: the transaction lives on without its session, which is idle again.
        if self.options.reuse_connections:
            TaskConnections.give_back(self._pool_key(), h.conn)
        else:
            h.conn.close()
        return b""

    def _prepare(self, h: _PgTxn, fingerprint: Fingerprint) -> None:
        status = h.conn.info.transaction_status
        if status is not TransactionStatus.INTRANS:
            raise FatalError(  # a PREPARE outside a transaction would only warn
                f"the task's session is {status.name}, not in its transaction: nothing to "
                "prepare", sink_id=self.sink_id, batch_id=h.tid.batch_id,
                transaction_id=str(h.tid))
        with h.conn.pipeline():
            h.conn.execute(
                sql.SQL("INSERT INTO {} (xid, sink_id, batch_id, rows, digest) "
                        "VALUES (%s, %s, %s, %s, %s)").format(
                    self.options.ledger_table.sql("_receipts")),
                (str(h.tid), self.sink_id, h.tid.batch_id, fingerprint.rows, fingerprint.hex),
            )
            cur = h.conn.execute(
                sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(self._gid(h.tid))))
        if cur.statusmessage != "PREPARE TRANSACTION":
            raise FatalError(
                f"PREPARE TRANSACTION answered {cur.statusmessage!r}: the server did not "
                "prepare the task's transaction (it was rolled back)",
                sink_id=self.sink_id, batch_id=h.tid.batch_id, transaction_id=str(h.tid))

    def _upsert(self, h: _PgTxn) -> None:
        if not h.pending:
            return
        table = pa.Table.from_batches(h.pending, schema=h.plan.schema)
        keys = list(self.options.key_columns)
        # Deterministic dedup: order by every column, keep the last (greatest) row per key.
        order = [(c, "ascending") for c in table.column_names]
        table = table.take(pc.sort_indices(table, sort_keys=order))
        table = table.append_column("__row", pa.array(range(table.num_rows), pa.int64()))
        last = table.group_by(keys, use_threads=False).aggregate([("__row", "max")])
        table = table.take(last["__row_max"]).drop_columns(["__row"])
        cols = list(h.plan.columns)
        others = [c for c in cols if c not in keys]
        action = (
            sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
                sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) for c in others))
            if others else sql.SQL("DO NOTHING")
        )
        statement = sql.SQL(
            "INSERT INTO {t} ({cols}) SELECT * FROM unnest({arrays}) ON CONFLICT ({keys}) {action}"
        ).format(
            t=self.options.table.sql(),
            cols=sql.SQL(", ").join(map(sql.Identifier, cols)),
            arrays=sql.SQL(", ").join(
                sql.SQL("%s::{}[]").format(sql.SQL(t)) for t in h.plan.sql_types),
            keys=sql.SQL(", ").join(map(sql.Identifier, keys)),
            action=action,
        )
        h.conn.execute(statement, [table.column(c).to_pylist() for c in cols])

    def abort_transaction(self, handle: _PgTxn) -> None:
        handle.conn.close()  # an unprepared transaction dies with its session

    # ---- driver side ----
    def _settle(self, verb: str, transaction_id: str, tid: TransactionId) -> bool:
        """``COMMIT PREPARED`` / ``ROLLBACK PREPARED`` the gid; False if it is not prepared."""
        statement = sql.SQL(verb + " {}").format(sql.Literal(self._gid(tid)))
        db = self._driver_db()
        with db.lock:
            conn = db.get()

            def run() -> bool:
                try:
                    conn.execute(statement)
                except psycopg.errors.UndefinedObject:  # SQLSTATE 42704: no such gid
                    return False
                return True

            return raise_translated(run, lambda exc: self._error(
                exc, verb, batch_id=tid.batch_id, transaction_id=transaction_id))

    def commit(self, commit: TaskCommit) -> None:
        tid = TransactionId.parse(commit.transaction_id)
        if tid is None:
            raise DataLossError("not a transaction id of this library", sink_id=self.sink_id,
                                transaction_id=commit.transaction_id)
        if self._settle("COMMIT PREPARED", commit.transaction_id, tid):
            return
        # Not prepared (any more): committed before, or lost.
        ledger = PostgresLedger(self._driver_db(), self.options.ledger_table,
                                sink_id=self.sink_id)
        if ledger.receipt(commit.transaction_id):
            return  # committed before: its receipt is the proof
        raise DataLossError(
            "a decided transaction is neither prepared nor committed (no receipt): it was "
            "rolled back outside this sink (ROLLBACK PREPARED by hand?) and its rows are lost",
            sink_id=self.sink_id, batch_id=tid.batch_id, transaction_id=commit.transaction_id,
        )

    def abort(self, transaction_id: str) -> None:
        tid = TransactionId.parse(transaction_id)
        if tid is None:
            return
        self._settle("ROLLBACK PREPARED", transaction_id, tid)  # gone already: nothing to do

    def recover(self) -> Iterable[str]:
        rows = self._driver_sql(
            "listing prepared transactions",
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")
        found = []
        for (gid,) in rows:
            xid = decode_gid(gid)
            if xid is None or xid[0] != XID_FORMAT_ID:
                continue
            tid = TransactionId.from_xid_parts(xid[1], xid[2])
            if tid is not None and tid.belongs_to(self.sink_id):
                found.append(str(tid))
        return found

    def close(self) -> None:
        super().close()
        if self._db is not None:
            self._db.close()
            self._db = None
