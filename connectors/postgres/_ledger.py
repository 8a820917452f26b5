"""The PostgreSQL ledger: decisions, aborts, the query binding and receipts, in tables.

Four tables, created on first use (``<ledger>`` defaults to ``public.eos_ledger``):

- ``<ledger>``: one decision per (sink, batch): the commit point (first insert wins);
- ``<ledger>_aborts``: "run R may never decide batch B" (written before a roll-back);
- ``<ledger>_bindings``: sink -> query id, generation, and the driver **epoch**;
- ``<ledger>_receipts``: one row per committed transaction, inserted *inside* the prepared
  transaction by the task: a receipt that is visible proves the commit.

Deciding, aborting and binding run in transactions that take a per-sink advisory lock
(``pg_advisory_xact_lock``) and check the epoch: every driver run bumps the epoch when it
starts, so an older driver (a zombie, or a second driver on the same checkpoint) can no
longer decide or abort once a newer one took over.

Here: the driver's connection (:class:`DriverConnection`, which the sink's driver side
shares) and the ledger's operations; the tables' DDL and the larger statements are in
:mod:`connectors.postgres._ledger_sql`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from connectors.core.errors import ConnectorError, FencedError, ProtocolStateError
from connectors.core.ledgers.ledger import Ledger, LedgerEntry, Lineage, check_binding
from connectors.core.states import BatchState
from connectors.postgres._config import Conninfo, TableName
from connectors.postgres._errors import raise_translated, translate
from connectors.postgres._ledger_sql import (
    ENTRY_COLUMNS,
    decide_statement,
    entry_of,
    ledger_ddl,
    lineage_ddl,
    prune_statement,
)

__all__ = ["DriverConnection", "PostgresLedger"]


class DriverConnection:
    """The driver's one autocommit connection, opened lazily, reopened after a failure."""

    def __init__(
        self, conninfo: Conninfo, connect_timeout: int, sink_id: str, lock_timeout: str = "30s",
        *, values_in_errors: bool = False,
    ) -> None:
        self.conninfo = conninfo
        self.connect_timeout = connect_timeout
        self.lock_timeout = lock_timeout
        self.sink_id = sink_id
        self.values_in_errors = values_in_errors
        self._conn: psycopg.Connection[Any] | None = None
        #: Connected at least once: a later connect failure is a restart, not a bad setting.
        self._connected = False
        self.lock = threading.RLock()

    def get(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            def connect() -> psycopg.Connection[Any]:
                return psycopg.connect(
                    self.conninfo.secret, autocommit=True, connect_timeout=self.connect_timeout,
                    application_name=f"connectors-driver:{self.sink_id}",
                    # A wait on a lock (another driver's lease, DDL) fails as retriable
                    # instead of hanging the query.
                    options=self.conninfo.options_with(f"-c lock_timeout={self.lock_timeout}"),
                )

            self._conn = raise_translated(connect, lambda exc: self.error(
                exc, f"connecting to {self.conninfo}", connecting=True,
                connected_before=self._connected))
            self._connected = True
        return self._conn

    def fetch(self, doing: str, statement: str, **ids: Any) -> list[Any]:
        """Run one statement on this connection; its rows, errors translated."""
        with self.lock:
            conn = self.get()
            return raise_translated(lambda: conn.execute(statement).fetchall(),
                                    lambda exc: self.error(exc, doing, **ids))

    def error(self, exc: BaseException, doing: str, **ids: Any) -> ConnectorError:
        """``exc`` translated (see :func:`~connectors.postgres._errors.translate`)."""
        if isinstance(exc, ConnectorError):
            return exc
        return translate(exc, doing=doing, conninfo=self.conninfo,
                         values=self.values_in_errors, sink_id=self.sink_id, **ids)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


#: The ledger is pruned on every PRUNE_EVERY-th batch (it keeps ``keep_batches`` + this).
PRUNE_EVERY = 10


class PostgresLedger(Ledger):
    """The sink's ledger in PostgreSQL (see the module docstring)."""

    def __init__(self, db: DriverConnection, table: TableName, *, sink_id: str) -> None:
        self.sink_id = sink_id
        self.db = db
        self.table = table
        self._epoch: int | None = None
        self._prunes = 0
        self._ready = False
        self._lock_key = f"connectors|{sink_id}"

    def __repr__(self) -> str:
        return f"PostgresLedger({self.table}, sink_id={self.sink_id!r})"

    # ---- plumbing ----
    def _run(self, doing: str, fn: Any, **ids: Any) -> Any:
        with self.db.lock:
            conn = self.db.get()

            def run() -> Any:
                if not self._ready:
                    self._create(conn)
                return fn(conn)

            return raise_translated(run, lambda exc: self.db.error(exc, doing, **ids))

    def _create(self, conn: psycopg.Connection[Any]) -> None:
        # Look before creating: DDL on an existing table (even CREATE INDEX IF NOT EXISTS)
        # takes a lock that this sink's own prepared transactions, left by a crash, hold
        # against it until this very driver settles them. So only what is missing is
        # created, and the receipts index only together with its (new, empty) table.
        names = {suffix: self.table.name + suffix
                 for suffix in ("", "_aborts", "_bindings", "_receipts")}
        rows = conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = ANY(%s)",
            (self.table.schema, list(names.values())),
        ).fetchall()
        existing = {r[0] for r in rows}
        if len(existing) < len(names):
            with conn.transaction():
                # Serialize concurrent CREATE ... IF NOT EXISTS of several drivers.
                conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended('connectors|ddl', 0))")
                for suffix, statements in ledger_ddl(self.table).items():
                    if names[suffix] not in existing:
                        for statement in statements:
                            conn.execute(statement)
        self._ready = True

    def _locked(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (self._lock_key,))

    def _check_epoch(self, conn: psycopg.Connection[Any], batch_id: int | None) -> None:
        if self._epoch is None:
            return
        row = conn.execute(
            sql.SQL("SELECT epoch FROM {} WHERE sink_id = %s").format(self.table.sql("_bindings")),
            (self.sink_id,),
        ).fetchone()
        if row is None or int(row[0]) != self._epoch:
            raise FencedError(
                f"another driver (or the operator tool) took over sink {self.sink_id!r} "
                f"(epoch {row[0] if row else None}, this driver has {self._epoch}): this "
                "driver must stop; the newer one reconciles what this one left",
                sink_id=self.sink_id, batch_id=batch_id,
            )

    # ---- Ledger ----
    def open_run(self, run_id: str) -> None:
        def bump(conn: psycopg.Connection[Any]) -> int:
            row = conn.execute(
                sql.SQL(
                    "INSERT INTO {t} AS b (sink_id, epoch) VALUES (%s, 1) ON CONFLICT (sink_id)"
                    " DO UPDATE SET epoch = b.epoch + 1, updated_at = now() RETURNING epoch"
                ).format(t=self.table.sql("_bindings")),
                (self.sink_id,),
            ).fetchone()
            assert row is not None
            return int(row[0])

        self._epoch = self._run("starting a driver run", bump)

    def run_token(self) -> str | None:
        return None if self._epoch is None else str(self._epoch)

    def resume_run(self, run_id: str, token: str | None) -> None:
        self._epoch = None if token is None else int(token)

    def bound_query(self) -> str | None:
        row = self._run("reading the query binding", lambda c: c.execute(
            sql.SQL("SELECT query_id FROM {} WHERE sink_id = %s").format(
                self.table.sql("_bindings")), (self.sink_id,)).fetchone())
        return row[0] if row else None

    def record_lineage(self, link: Lineage) -> None:
        # Its table is made here, on the first resume_from, never at a run's start: a
        # ledger an administrator created for a role without CREATE keeps working.
        def record(conn: psycopg.Connection[Any]) -> None:
            with conn.transaction():
                if not self._has_lineage(conn):
                    conn.execute(lineage_ddl(self.table))
                conn.execute(sql.SQL(
                    "INSERT INTO {} (sink_id, query_id, link) VALUES (%s, %s, %s) ON CONFLICT "
                    "(sink_id, query_id) DO UPDATE SET link = EXCLUDED.link").format(
                        self.table.sql("_lineage")),
                    (self.sink_id, link.query_id, Jsonb(link.to_json())))

        self._run("recording where the query took the sink over", record)

    def lineage(self) -> list[Lineage]:
        def read(conn: psycopg.Connection[Any]) -> list[Lineage]:
            if not self._has_lineage(conn):
                return []
            rows = conn.execute(sql.SQL("SELECT link FROM {} WHERE sink_id = %s").format(
                self.table.sql("_lineage")), (self.sink_id,)).fetchall()
            return [Lineage.from_json(r[0]) for r in rows]

        found: list[Lineage] = self._run("reading the sink's lineage", read)
        return found

    def _has_lineage(self, conn: psycopg.Connection[Any]) -> bool:
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                           (self.table.sql("_lineage").as_string(conn),)).fetchone()
        return bool(row and row[0])

    def bind_query(self, query_id: str, *, reset: bool = False) -> int:
        def bind(conn: psycopg.Connection[Any]) -> int:
            with conn.transaction():
                self._locked(conn)
                row = conn.execute(
                    sql.SQL("SELECT query_id, generation FROM {} WHERE sink_id = %s").format(
                        self.table.sql("_bindings")), (self.sink_id,)).fetchone()
                bound, generation = (row[0], int(row[1])) if row else (None, 0)
                if not check_binding(self.sink_id, bound, query_id, reset=reset):
                    return generation
                if bound is not None:
                    generation += 1
                    for suffix in ("", "_aborts", "_receipts"):
                        conn.execute(sql.SQL("DELETE FROM {} WHERE sink_id = %s").format(
                            self.table.sql(suffix)), (self.sink_id,))
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {t} AS b (sink_id, query_id, generation) VALUES (%s, %s, %s)"
                        " ON CONFLICT (sink_id) DO UPDATE SET query_id = EXCLUDED.query_id, "
                        "generation = EXCLUDED.generation, updated_at = now()"
                    ).format(t=self.table.sql("_bindings")),
                    (self.sink_id, query_id, generation),
                )
                return generation

        return int(self._run("binding the sink to its query", bind))

    def _select(
        self, conn: psycopg.Connection[Any], where: str, params: tuple[Any, ...]
    ) -> list[LedgerEntry]:
        query = sql.SQL("SELECT {} FROM {} WHERE sink_id = %s {} ORDER BY batch_id").format(
            ENTRY_COLUMNS, self.table.sql(), sql.SQL(where))
        return [entry_of(r) for r in conn.execute(query, (self.sink_id, *params)).fetchall()]

    def _one(self, conn: psycopg.Connection[Any], batch_id: int) -> LedgerEntry | None:
        found = self._select(conn, "AND batch_id = %s", (batch_id,))
        return found[0] if found else None

    def get(self, batch_id: int) -> LedgerEntry | None:
        entry: LedgerEntry | None = self._run(
            "reading the ledger", lambda c: self._one(c, batch_id), batch_id=batch_id)
        return entry

    def decide(self, entry: LedgerEntry) -> LedgerEntry:
        if entry.state not in (BatchState.DECIDED, BatchState.COMMITTED):
            raise ProtocolStateError(f"cannot record a {entry.state.value} decision")

        fp = entry.fingerprint
        params = {
            "s": self.sink_id, "b": entry.batch_id, "r": entry.run_id, "st": entry.state.value,
            "c": Jsonb([c.to_json() for c in entry.commits]), "fr": fp.rows if fp else None,
            "fd": fp.hex if fp else None, "q": entry.query_id, "e": self._epoch,
            "done": entry.state is BatchState.COMMITTED,
        }
        # One statement after the lease: epoch check, abort check and the first-insert-wins
        # insert (READ COMMITTED: its snapshot is taken after the lock was granted).
        statement = decide_statement(self.table)

        def decide(conn: psycopg.Connection[Any]) -> LedgerEntry:
            # Fast path, one round trip: BEGIN, the lease, the statement and COMMIT in a
            # pipeline. Anything but "inserted" is looked at again below, under the lease.
            with conn.pipeline(), conn.transaction():
                self._locked(conn)
                cur = conn.execute(statement, params)
            row = cur.fetchone()
            if row is not None and row[2]:
                return entry
            with conn.transaction():
                self._locked(conn)
                row = conn.execute(statement, params).fetchone()
                assert row is not None
                epoch, aborted, inserted = row
                if inserted:  # pragma: no cover - the fast path inserts first
                    return entry
                if self._epoch is not None and epoch != self._epoch:
                    self._check_epoch(conn, entry.batch_id)  # raises FencedError
                if aborted:
                    raise FencedError(
                        f"run {entry.run_id} was aborted for this batch by another driver or "
                        "the operator tool; its transactions were rolled back",
                        sink_id=self.sink_id, batch_id=entry.batch_id)
                existing = self._one(conn, entry.batch_id)
                if existing is None:  # pragma: no cover - the insert only yields to a row
                    raise ProtocolStateError("decision neither recorded nor found",
                                             sink_id=self.sink_id, batch_id=entry.batch_id)
                return existing

        result: LedgerEntry = self._run("recording the decision", decide, batch_id=entry.batch_id)
        return result

    def forbid_decision(self, batch_id: int, run_id: str) -> LedgerEntry | None:
        def abort(conn: psycopg.Connection[Any]) -> LedgerEntry | None:
            with conn.transaction():
                self._locked(conn)
                self._check_epoch(conn, batch_id)
                existing = self._one(conn, batch_id)
                if existing is not None and existing.run_id == run_id:
                    return existing
                conn.execute(
                    sql.SQL("INSERT INTO {} (sink_id, batch_id, run_id) VALUES (%s, %s, %s) "
                            "ON CONFLICT DO NOTHING").format(self.table.sql("_aborts")),
                    (self.sink_id, batch_id, run_id))
                return None

        result: LedgerEntry | None = self._run("recording an abort", abort, batch_id=batch_id)
        return result

    def mark_committed(self, batch_id: int) -> None:
        # Not waiting for the WAL flush here is safe: if this record is lost in a server
        # crash, the batch reads as DECIDED and the next run commits it again, which is
        # idempotent (the receipts prove what is committed). It saves one fsync per batch.
        def mark(conn: psycopg.Connection[Any]) -> None:
            with conn.pipeline(), conn.transaction():
                conn.execute("SET LOCAL synchronous_commit TO off")
                conn.execute(
                    sql.SQL("UPDATE {} SET state = 'COMMITTED', committed_at = now() "
                            "WHERE sink_id = %s AND batch_id = %s AND state = 'DECIDED'"
                            ).format(self.table.sql()),
                    (self.sink_id, batch_id))

        self._run("recording the batch as committed", mark, batch_id=batch_id)

    def entries(self) -> Sequence[LedgerEntry]:
        found: list[LedgerEntry] = self._run(
            "reading the ledger", lambda c: self._select(c, "", ()))
        return found

    def unfinished(self) -> list[LedgerEntry]:
        found: list[LedgerEntry] = self._run(
            "reading the ledger", lambda c: self._select(c, "AND state = 'DECIDED'", ()))
        return found

    def last_batch_id(self) -> int | None:
        row = self._run("reading the ledger", lambda c: c.execute(
            sql.SQL("SELECT max(batch_id) FROM {} WHERE sink_id = %s").format(self.table.sql()),
            (self.sink_id,)).fetchone())
        return int(row[0]) if row and row[0] is not None else None

    def prune(self, keep: int) -> None:
        # Housekeeping: every PRUNE_EVERY-th call is enough.
        self._prunes += 1
        if (self._prunes - 1) % PRUNE_EVERY:
            return

        def prune(conn: psycopg.Connection[Any]) -> None:
            with conn.pipeline(), conn.transaction():
                conn.execute("SET LOCAL synchronous_commit TO off")  # housekeeping only
                conn.execute(*statement)

        statement = (prune_statement(self.table), {"s": self.sink_id, "k": keep})
        self._run("pruning the ledger", prune)

    def receipt(self, transaction_id: str) -> bool:
        """Is there a receipt (proof of commit) for ``transaction_id``?"""
        row = self._run("reading a receipt", lambda c: c.execute(
            sql.SQL("SELECT 1 FROM {} WHERE xid = %s").format(self.table.sql("_receipts")),
            (transaction_id,)).fetchone(), transaction_id=transaction_id)
        return row is not None

    def close(self) -> None:
        self.db.close()

