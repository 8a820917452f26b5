"""``PostgresSink``: exactly-once into PostgreSQL with prepared transactions (XA style).

Executor side, once per Spark task:
  1. connect, ``tpc_begin`` an xid named by sink, run, batch and ``taskAttemptId``;
  2. COPY the task's Arrow record batches in PostgreSQL's binary format (pgpq encodes,
     psycopg writes), or, with ``mode="upsert"``, ``INSERT ... ON CONFLICT DO UPDATE``
     of the task's rows deduplicated by key;
  3. insert a receipt (sink, batch, xid, rows, digest) in the same transaction;
  4. ``tpc_prepare``: the transaction now outlives the task; return its id.

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

from connectors.core.batch import BatchInput
from connectors.core.errors import (
    BadInputError,
    ConfigurationError,
    ConnectorError,
    DataLossError,
)
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledger import Ledger, TaskCommit
from connectors.core.naming import TransactionId
from connectors.core.tasks import TaskTransaction
from connectors.core.template import PreparedTransactionSink
from connectors.postgres._config import Conninfo, Mode, PostgresOptions, TableName
from connectors.postgres._errors import translate
from connectors.postgres._ledger import DriverConnection, PostgresLedger
from connectors.postgres._pool import TaskConnections
from connectors.postgres._types import Column, WritePlan, ddl_type, plan_write

__all__ = ["XID_FORMAT_ID", "PostgresSink"]

logger = logging.getLogger("connectors.postgres")

#: The XA format id of every xid this library prepares ("EOS1" in ASCII).
XID_FORMAT_ID = 0x454F5331
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
            more than a small batch's write). Idle connections are closed after 60 s.
        **options: the template's options (``retry``, ``reset_binding``,
            ``on_replay_mismatch``, ``keep_batches``).

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
        if isinstance(exc, ConnectorError):
            return exc
        return translate(exc, doing=doing, password=self.conninfo.password,
                         sink_id=self.sink_id, **ids)

    def _driver_db(self) -> DriverConnection:
        if self._db is None:
            self._db = DriverConnection(
                self.conninfo, self.options.connect_timeout, self.sink_id,
                self.options.lock_timeout,
            )
        return self._db

    def _xid(self, conn: psycopg.Connection[Any], tid: TransactionId) -> psycopg.Xid:
        gtrid, bqual = tid.xid_parts()
        return conn.xid(XID_FORMAT_ID, gtrid, bqual)

    @staticmethod
    def _gid(tid: TransactionId) -> str:
        gtrid, bqual = tid.xid_parts()
        return str(psycopg.Xid.from_parts(XID_FORMAT_ID, gtrid, bqual))

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
            try:
                conn = db.get()
                columns = self._columns(conn)
                if not columns and self.options.create_table:
                    self._create_table(conn, schema)
                    columns = self._columns(conn)
            except psycopg.Error as exc:
                raise self._error(exc, f"reading the columns of {table}") from None
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
        db = self._driver_db()
        with db.lock:
            try:
                row = db.get().execute("SHOW max_prepared_transactions").fetchone()
            except psycopg.Error as exc:
                raise self._error(exc, "reading max_prepared_transactions") from None
        limit = int(row[0]) if row else 0
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
        try:
            return psycopg.connect(
                self.conninfo.secret,
                connect_timeout=self.options.connect_timeout,
                options=f"-c lock_timeout={self.options.lock_timeout}",
                application_name=f"connectors-task:{self.sink_id}",
            )
        except psycopg.Error as exc:
            raise self._error(exc, f"connecting to {self.conninfo}", batch_id=tid.batch_id,
                              transaction_id=str(tid)) from None

    def begin_transaction(self, txn: TaskTransaction) -> _PgTxn:
        plan = self._plan
        if plan is None:  # pragma: no cover - validate_input always runs first
            raise ConfigurationError("the sink was not validated on the driver")
        tid = txn.transaction_id
        reused = TaskConnections.take(self._pool_key()) if self.options.reuse_connections else None
        conn = reused or self._connect_task(tid)
        while True:
            handle = _PgTxn(conn, tid, plan)
            try:
                conn.tpc_begin(self._xid(conn, tid))
                if self.options.mode == "append":
                    self._start_copy(handle)
                return handle
            except Exception as exc:
                conn.close()
                if reused is not None and isinstance(exc, psycopg.OperationalError):
                    # The idle session died (server restart, idle timeout): nothing was
                    # written on it; begin again on a fresh connection, once.
                    logger.info("sink %s: a reused task connection was dead (%s); reconnecting",
                                self.sink_id, type(exc).__name__)
                    reused = None
                    conn = self._connect_task(tid)
                    continue
                raise self._error(exc, "starting the COPY", batch_id=tid.batch_id,
                                  transaction_id=str(tid)) from None

    def _start_copy(self, h: _PgTxn) -> None:
        statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
            self.options.table.sql(), sql.SQL(", ").join(map(sql.Identifier, h.plan.columns)))
        h.copy_cm = h.conn.cursor().copy(statement)
        h.copy = h.copy_cm.__enter__()
        encoders = {
            name: LargeStringEncoderBuilder.new_with_output(
                h.plan.schema.field(name), Jsonb())
            for name in h.plan.jsonb
        }
        h.encoder = (
            ArrowToPostgresBinaryEncoder.new_with_encoders(h.plan.schema, encoders)
            if encoders else ArrowToPostgresBinaryEncoder(h.plan.schema)
        )
        h.copy.write(h.encoder.write_header())

    def _cast(self, h: _PgTxn, batch: pa.RecordBatch) -> pa.RecordBatch:
        try:
            return batch.select(list(h.plan.columns)).cast(h.plan.schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise BadInputError(
                f"a value does not fit its column in {self.options.table}: {exc}",
                sink_id=self.sink_id, batch_id=h.tid.batch_id, transaction_id=str(h.tid),
            ) from None

    def write(self, handle: _PgTxn, batch: pa.RecordBatch) -> None:
        cast = self._cast(handle, batch)
        if self.options.mode == "upsert":
            handle.pending.append(cast)
            return
        assert handle.encoder is not None
        try:
            handle.copy.write(handle.encoder.write_batch(cast))
        except Exception as exc:
            raise self._error(exc, f"COPY into {self.options.table}",
                              batch_id=handle.tid.batch_id, transaction_id=str(handle.tid)
                              ) from None

    def pre_commit(self, handle: _PgTxn, fingerprint: Fingerprint) -> bytes:
        h = handle
        prepared = False
        try:
            if self.options.mode == "append":
                assert h.encoder is not None
                h.copy.write(h.encoder.finish())
                h.copy_cm.__exit__(None, None, None)
                h.copy_cm = None
            else:
                self._upsert(h)
            # The receipt and the PREPARE in one round trip.
            with h.conn.pipeline():
                h.conn.execute(
                    sql.SQL("INSERT INTO {} (xid, sink_id, batch_id, rows, digest) "
                            "VALUES (%s, %s, %s, %s, %s)").format(
                        self.options.ledger_table.sql("_receipts")),
                    (str(h.tid), self.sink_id, h.tid.batch_id, fingerprint.rows,
                     fingerprint.hex),
                )
                h.conn.tpc_prepare()
            prepared = True
        except Exception as exc:
            raise self._error(exc, f"writing into {self.options.table}",
                              batch_id=h.tid.batch_id, transaction_id=str(h.tid)) from None
        finally:
            if prepared and self.options.reuse_connections:
                # The transaction lives on without its session: the session serves the
                # next task of this Python worker.
                TaskConnections.give_back(self._pool_key(), h.conn)
            elif h.copy_cm is None:
                h.conn.close()
        return b""

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
    def commit(self, commit: TaskCommit) -> None:
        tid = TransactionId.parse(commit.transaction_id)
        if tid is None:
            raise DataLossError("not a transaction id of this library", sink_id=self.sink_id,
                                transaction_id=commit.transaction_id)
        db = self._driver_db()
        with db.lock:
            try:
                db.get().execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(self._gid(tid))))
                return
            except psycopg.errors.UndefinedObject:
                pass  # not prepared (any more): committed before, or lost
            except psycopg.Error as exc:
                raise self._error(exc, "COMMIT PREPARED", batch_id=tid.batch_id,
                                  transaction_id=commit.transaction_id) from None
        ledger = PostgresLedger(db, self.options.ledger_table, sink_id=self.sink_id)
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
        db = self._driver_db()
        with db.lock:
            try:
                db.get().execute(
                    sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(self._gid(tid))))
            except psycopg.errors.UndefinedObject:
                pass  # gone already
            except psycopg.Error as exc:
                raise self._error(exc, "ROLLBACK PREPARED", batch_id=tid.batch_id,
                                  transaction_id=transaction_id) from None

    def recover(self) -> Iterable[str]:
        db = self._driver_db()
        with db.lock:
            try:
                rows = db.get().execute(
                    "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
                ).fetchall()
            except psycopg.Error as exc:
                raise self._error(exc, "listing prepared transactions") from None
        found = []
        for (gid,) in rows:
            xid = psycopg.Xid.from_string(gid)
            if xid.format_id != XID_FORMAT_ID or xid.bqual is None:
                continue
            tid = TransactionId.from_xid_parts(xid.gtrid, xid.bqual)
            if tid is not None and tid.belongs_to(self.sink_id):
                found.append(str(tid))
        return found

    def close(self) -> None:
        super().close()
        if self._db is not None:
            self._db.close()
            self._db = None
