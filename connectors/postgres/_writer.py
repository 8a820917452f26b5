"""Executor side of :class:`~connectors.postgres.PostgresSink`: one task's transaction.

Once per Spark task, in plain SQL on an autocommit connection the task owns (no
two-phase-commit state of the client library is involved), :class:`TaskWriter`:

  1. takes an idle connection of this Python worker (:mod:`connectors.postgres._pool`) or
     connects, ``BEGIN``;
  2. COPYs the task's Arrow record batches in PostgreSQL's binary format (pgpq encodes,
     psycopg writes), or, with ``mode="upsert"``, runs ``INSERT ... ON CONFLICT DO UPDATE``
     of the task's rows deduplicated by key, or with ``mode="changes"`` the last change of
     each key (:mod:`connectors.core.changes`, then :mod:`connectors.postgres._changes`:
     ``DELETE`` or upsert);
  3. inserts a receipt (sink, batch, xid, rows, digest) in the same transaction;
  4. ``PREPARE TRANSACTION '<gid>'`` (:func:`~connectors.postgres._gid.gid_of`): the
     transaction now outlives the task and the session is idle again.

A :class:`PgTxn` is the handle of one open transaction. The writer holds only the sink's
settings, so the sink builds one wherever it needs it, executors included.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pyarrow as pa
from pgpq import ArrowToPostgresBinaryEncoder
from pgpq.encoders import LargeStringEncoderBuilder
from pgpq.schema import Jsonb
from psycopg import sql
from psycopg.pq import TransactionStatus

from connectors.core.changes import stage
from connectors.core.errors import BadInputError, ConnectorError, FatalError
from connectors.core.fingerprint import Fingerprint
from connectors.core.keyed import last_row_per_key
from connectors.core.naming import TransactionId
from connectors.postgres._changes import apply_changes
from connectors.postgres._config import Conninfo, PostgresOptions
from connectors.postgres._errors import raise_translated, translate
from connectors.postgres._gid import gid_of
from connectors.postgres._pool import TaskConnections, connected_before, record_connected
from connectors.postgres._special import ColumnRefused, aliases, convert_batch, upsert_sql
from connectors.postgres._types import WritePlan

__all__ = ["PgTxn", "TaskWriter"]

logger = logging.getLogger(__name__)


@dataclass
class PgTxn:
    """One task's open transaction."""

    conn: psycopg.Connection[Any]
    tid: TransactionId
    plan: WritePlan
    copy_cm: Any = None
    copy: Any = None
    encoder: ArrowToPostgresBinaryEncoder | None = None
    pending: list[pa.RecordBatch] = field(default_factory=list)


@dataclass(frozen=True)
class TaskWriter:
    """The task side of one sink: begin, write, prepare or abort a task's transaction."""

    conninfo: Conninfo
    options: PostgresOptions
    sink_id: str
    values_in_errors: bool = False

    def error(self, exc: BaseException, doing: str, **ids: Any) -> ConnectorError:
        """``exc`` in the library's error tree; row values only with ``values_in_errors``.

        Raise the result outside the ``except`` block (or through ``raise_translated``)
        so that the psycopg exception is not kept as its ``__context__``.
        """
        if isinstance(exc, ConnectorError):
            return exc
        return translate(exc, doing=doing, conninfo=self.conninfo,
                         values=self.values_in_errors, sink_id=self.sink_id, **ids)

    # ---- connections ----
    def _pool_key(self) -> str:
        o = self.options
        return TaskConnections.key(self.conninfo.secret, o.lock_timeout, str(o.connect_timeout),
                                   self.sink_id)

    def _connect(self, tid: TransactionId) -> psycopg.Connection[Any]:
        key = self._pool_key()

        def connect() -> psycopg.Connection[Any]:
            return psycopg.connect(
                self.conninfo.secret,
                autocommit=True,  # the task's SQL says BEGIN and PREPARE TRANSACTION itself
                connect_timeout=self.options.connect_timeout,
                options=self.conninfo.options_with(
                    f"-c lock_timeout={self.options.lock_timeout}"),
                application_name=f"connectors-task:{self.sink_id}",
            )

        conn = raise_translated(connect, lambda exc: self.error(
            exc, f"connecting to {self.conninfo}", connecting=True,
            connected_before=connected_before(key), batch_id=tid.batch_id,
            transaction_id=str(tid)))
        record_connected(key)
        return conn

    # ---- begin ----
    def begin(self, tid: TransactionId, plan: WritePlan) -> PgTxn:
        """``BEGIN`` on an idle session of this worker or a new one; start COPY.

        A reused session that fails before anything was written on it (the server dropped
        it, or the client refuses it: no SQLSTATE) is closed and replaced, once.
        """
        reused = TaskConnections.take(self._pool_key()) if self.options.reuse_connections else None
        if reused is not None and reused.info.transaction_status is not TransactionStatus.IDLE:
            reused.close()  # pragma: no cover - the pool hands out idle sessions only
            reused = None
        conn = reused or self._connect(tid)
        handle, failure, session_lost = self._begin(conn, tid, plan)
        if handle is not None:
            return handle
        if reused is not None and session_lost:
            logger.info("sink %s: a reused task connection failed before any write (%s); "
                        "beginning on a new one", self.sink_id, type(failure).__name__)
            handle, failure, _ = self._begin(self._connect(tid), tid, plan)
            if handle is not None:
                return handle
        assert failure is not None  # _begin returns a handle or a failure
        error = self.error(failure, "starting the task's transaction", batch_id=tid.batch_id,
                           transaction_id=str(tid))
        del failure  # nothing of the client's exception travels with the error
        raise error

    def _begin(
        self, conn: psycopg.Connection[Any], tid: TransactionId, plan: WritePlan
    ) -> tuple[PgTxn | None, BaseException | None, bool]:
        """``BEGIN`` (+ COPY): ``(handle, _, _)``, or ``(None, failure, session_lost)`` with
        the connection closed. ``session_lost``: the session died or the client refused it
        (no SQLSTATE), so a new session may succeed; a statement the server refused
        (``UndefinedTable``, ``InsufficientPrivilege``, ...) would fail there too."""
        handle = PgTxn(conn, tid, plan)
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

    def _start_copy(self, h: PgTxn) -> None:
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

    # ---- write ----
    def _cast(self, h: PgTxn, batch: pa.RecordBatch) -> pa.RecordBatch:
        p = h.plan
        try:
            if p.specials:  # uuid, arrays, enums, ...: converted first (see _special)
                return convert_batch(p.columns, p.schema, p.sql_types, p.specials, batch,
                                     upsert=self.options.mode != "append")
            return batch.select(list(h.plan.columns)).cast(h.plan.schema)
        except ColumnRefused as exc:
            value = f": {exc.value!r}" if self.values_in_errors and exc.value is not None else ""
            refused = BadInputError(
                f"a value of column {exc.column!r} ({exc.sql_type}) does not fit its column "
                f"in {self.options.table}: {exc.reason}{value}", sink_id=self.sink_id,
                batch_id=h.tid.batch_id, transaction_id=str(h.tid))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            # Arrow's text quotes the value: only with values_in_errors.
            quoted = f": {exc}" if self.values_in_errors else ""
            refused = None
        if refused is not None:
            raise refused
        column = self._failing_column(h, batch)
        raise BadInputError(
            f"a value {column}does not fit its column in {self.options.table}{quoted}",
            sink_id=self.sink_id, batch_id=h.tid.batch_id, transaction_id=str(h.tid),
        )

    @staticmethod
    def _failing_column(h: PgTxn, batch: pa.RecordBatch) -> str:
        """``"of column 'x' (integer) "`` for the first column whose cast fails, or ``""``."""
        for target in h.plan.schema:
            try:
                batch.column(target.name).cast(target.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                sql_type = h.plan.sql_types[h.plan.columns.index(target.name)]
                return f"of column {target.name!r} ({sql_type}) "
        return ""  # pragma: no cover - the same casts, one at a time

    def write(self, handle: PgTxn, batch: pa.RecordBatch) -> None:
        """COPY one record batch (upsert: keep it for the prepare)."""
        cast = self._cast(handle, batch)
        if self.options.mode == "changes":  # keep the rows with their op and sequence
            handle.pending.append(stage(
                batch, cast, self.options, values_in_errors=self.values_in_errors,
                sink_id=self.sink_id, batch_id=handle.tid.batch_id,
                transaction_id=str(handle.tid)))
            return
        if self.options.mode == "upsert":
            handle.pending.append(cast)
            return
        assert handle.encoder is not None
        encoder, copy = handle.encoder, handle.copy
        raise_translated(lambda: copy.write(encoder.write_batch(cast)), lambda exc: self.error(
            exc, f"COPY into {self.options.table}", batch_id=handle.tid.batch_id,
            transaction_id=str(handle.tid)))

    # ---- prepare ----
    def pre_commit(self, handle: PgTxn, fingerprint: Fingerprint) -> None:
        """End the COPY (or upsert), insert the receipt, ``PREPARE TRANSACTION``.

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
            elif self.options.mode == "changes":
                apply_changes(h.conn, h.pending, self.options, h.plan,
                              lambda rows: self._upsert_rows(h, rows))
            else:
                self._upsert(h)
        except Exception as exc:
            error = self.error(exc, f"writing into {self.options.table}", **ids)
        # Step 2
        if error is None:
            try:
                self._prepare(h, fingerprint)
            except Exception as exc:
                error = self.error(exc, f"preparing the transaction of {self.options.table}",
                                   preparing=True, **ids)
        if error is not None:
            h.conn.close()
            raise error
        # Step 3: the transaction lives on without its session, which is idle again.
        if self.options.reuse_connections:
            TaskConnections.give_back(self._pool_key(), h.conn)
        else:
            h.conn.close()

    def _prepare(self, h: PgTxn, fingerprint: Fingerprint) -> None:
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
                sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid_of(h.tid))))
        if cur.statusmessage != "PREPARE TRANSACTION":
            raise FatalError(
                f"PREPARE TRANSACTION answered {cur.statusmessage!r}: the server did not "
                "prepare the task's transaction (it was rolled back)",
                sink_id=self.sink_id, batch_id=h.tid.batch_id, transaction_id=str(h.tid))

    def _upsert(self, h: PgTxn) -> None:
        if not h.pending:
            return
        table = pa.Table.from_batches(h.pending)  # special columns travel as text
        # Deterministic dedup: the greatest row by value of each key.
        self._upsert_rows(h, last_row_per_key(table, self.options.key_columns))

    def _upsert_rows(self, h: PgTxn, table: pa.Table) -> None:
        """``INSERT ... ON CONFLICT (keys) DO UPDATE`` of ``table``'s rows (one per key)."""
        keys = list(self.options.key_columns)
        cols = list(h.plan.columns)
        arrays, select = upsert_sql(cols, h.plan.sql_types,
                                    [s is not None for s in h.plan.specials or [None] * len(cols)])
        others = [c for c in cols if c not in keys]
        action = (
            sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
                sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) for c in others))
            if others else sql.SQL("DO NOTHING")
        )
        statement = sql.SQL(
            "INSERT INTO {t} ({cols}) SELECT {select} FROM unnest({arrays}) AS u({aliases}) "
            "ON CONFLICT ({keys}) {action}"
        ).format(
            t=self.options.table.sql(),
            cols=sql.SQL(", ").join(map(sql.Identifier, cols)),
            select=select, arrays=arrays, aliases=aliases(len(cols)),
            keys=sql.SQL(", ").join(map(sql.Identifier, keys)),
            action=action,
        )
        h.conn.execute(statement, [table.column(c).to_pylist() for c in cols])

    # ---- abort ----
    @staticmethod
    def abort(handle: PgTxn) -> None:
        """Close the session: an unprepared transaction dies with it."""
        handle.conn.close()
