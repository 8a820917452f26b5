"""The MariaDB ledger: decisions, aborts, the query binding and receipts, in tables.

The tables are :mod:`connectors.mariadb._ledger_sql`'s. Deciding, aborting and binding run
in one transaction each that first locks the sink's row of ``<ledger>_bindings``
(``SELECT ... FOR UPDATE``) and checks the epoch: every driver run bumps the epoch when it
starts, so an older driver (a zombie, or a second driver on the same checkpoint) can no
longer decide or abort once a newer one took over. Under that lock a decision is read,
then inserted only when absent: the first decision wins.

Here: the driver's connection (:class:`DriverConnection`, which the sink's driver side
shares) and the ledger's operations.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from connectors.core.errors import ConnectorError, FencedError, ProtocolStateError
from connectors.core.ledgers.ledger import Ledger, LedgerEntry, Lineage, check_binding
from connectors.core.states import BatchState
from connectors.mariadb._client import connect, raise_translated, translate
from connectors.mariadb._config import Address, TableName
from connectors.mariadb._ledger_sql import (
    ENTRY_COLUMNS,
    LEDGER_SUFFIXES,
    entry_of,
    ledger_ddl,
    lineage_ddl,
)

__all__ = ["PRUNE_EVERY", "DriverConnection", "MariaDBLedger"]

T = TypeVar("T")

#: The ledger is pruned on every PRUNE_EVERY-th batch (it keeps ``keep_batches`` + this).
PRUNE_EVERY = 10


class DriverConnection:
    """The driver's one autocommit connection (READ COMMITTED), opened lazily and again
    after a failure."""

    def __init__(self, address: Address, *, connect_timeout: int, lock_wait_timeout: int,
                 sink_id: str, values_in_errors: bool = False) -> None:
        self.address = address
        self.connect_timeout = connect_timeout
        self.lock_wait_timeout = lock_wait_timeout
        self.sink_id = sink_id
        self.values_in_errors = values_in_errors
        self._conn: Any = None
        self.lock = threading.RLock()

    def get(self) -> Any:
        if self._conn is None or not self._conn.open:
            conn = connect(self.address, connect_timeout=self.connect_timeout,
                           lock_wait_timeout=self.lock_wait_timeout)
            raise_translated(
                lambda: conn.cursor().execute(
                    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"),
                lambda exc: self.error(exc, "setting up the driver's session"))
            self._conn = conn
        return self._conn

    def run(self, doing: str, fn: Callable[[Any], T], **ids: Any) -> T:
        """``fn(connection)`` under the lock; errors translated, a broken connection
        dropped (the next call connects again)."""
        with self.lock:
            conn = self.get()

            def call() -> T:
                try:
                    return fn(conn)
                except BaseException:
                    self._discard_transaction(conn)
                    raise

            return raise_translated(call, lambda exc: self.error(exc, doing, **ids))

    def _discard_transaction(self, conn: Any) -> None:
        try:
            conn.rollback()
        except Exception:  # the connection is gone: drop it
            self.close()

    def fetch(self, doing: str, statement: str, params: Sequence[Any] = (),
              **ids: Any) -> list[Any]:
        """Rows of one statement (autocommit)."""
        def fetch(conn: Any) -> list[Any]:
            with conn.cursor() as cur:
                cur.execute(statement, tuple(params))
                return list(cur.fetchall())

        return self.run(doing, fetch, **ids)

    def error(self, exc: BaseException, doing: str, **ids: Any) -> ConnectorError:
        """``exc`` translated (:func:`~connectors.mariadb._client.translate`)."""
        if not isinstance(exc, ConnectorError) and not self._alive():
            self.close()
        return translate(exc, doing=doing, address=self.address, sink_id=self.sink_id,
                         values=self.values_in_errors, **ids)

    def _alive(self) -> bool:
        return self._conn is not None and bool(self._conn.open)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                conn.close()


class MariaDBLedger(Ledger):
    """The sink's ledger in MariaDB (see the module docstring)."""

    def __init__(self, db: DriverConnection, table: TableName, *, sink_id: str) -> None:
        self.sink_id = sink_id
        self.db = db
        self.table = table
        self._epoch: int | None = None
        self._prunes = 0
        self._ready = False

    def __repr__(self) -> str:
        return f"MariaDBLedger({self.table}, sink_id={self.sink_id!r})"

    # ---- plumbing ----
    def _run(self, doing: str, fn: Callable[[Any], T], *, transaction: bool = False,
             **ids: Any) -> T:
        def run(conn: Any) -> T:
            if not self._ready:
                self._create(conn)
            if not transaction:
                return fn(conn)
            conn.begin()
            result = fn(conn)
            conn.commit()
            return result

        return self.db.run(doing, run, **ids)

    def _create(self, conn: Any) -> None:
        # Only what is missing is created: DDL on a table this sink's own prepared branches
        # (left by a crash) hold a metadata lock on waits until this very driver settles them.
        names = {self.table.name + suffix: suffix for suffix in LEDGER_SUFFIXES}
        with conn.cursor() as cur:
            cur.execute("SELECT table_name FROM information_schema.tables WHERE "
                        "table_schema = %s AND table_name IN (" +
                        ", ".join(["%s"] * len(names)) + ")",
                        (self.table.database, *names))
            existing = {str(r[0]) for r in cur.fetchall()}
            ddl = ledger_ddl(self.table)
            for name, suffix in names.items():
                if name not in existing:
                    cur.execute(ddl[suffix])
        self._ready = True

    def _locked(self, cur: Any) -> int:
        """Lock the sink's binding row (created if missing); its epoch."""
        cur.execute(f"INSERT INTO {self.table.sql('_bindings')} (sink_id) VALUES (%s) "
                    "ON DUPLICATE KEY UPDATE sink_id = sink_id", (self.sink_id,))
        cur.execute(f"SELECT epoch FROM {self.table.sql('_bindings')} WHERE sink_id = %s "
                    "FOR UPDATE", (self.sink_id,))
        row = cur.fetchone()
        return int(row[0]) if row else 0

    def _check_epoch(self, epoch: int, batch_id: int | None) -> None:
        if self._epoch is not None and epoch != self._epoch:
            raise FencedError(
                f"another driver (or the operator tool) took over sink {self.sink_id!r} "
                f"(epoch {epoch}, this driver has {self._epoch}): this driver must stop; "
                "the newer one reconciles what this one left",
                sink_id=self.sink_id, batch_id=batch_id)

    def _select(self, cur: Any, where: str, params: tuple[Any, ...]) -> list[LedgerEntry]:
        cur.execute(f"SELECT {ENTRY_COLUMNS} FROM {self.table.sql()} WHERE sink_id = %s "
                    f"{where} ORDER BY batch_id", (self.sink_id, *params))
        return [entry_of(r) for r in cur.fetchall()]

    def _one(self, cur: Any, batch_id: int) -> LedgerEntry | None:
        found = self._select(cur, "AND batch_id = %s", (batch_id,))
        return found[0] if found else None

    def _entries(self, doing: str, where: str = "", params: tuple[Any, ...] = (),
                 **ids: Any) -> list[LedgerEntry]:
        def read(conn: Any) -> list[LedgerEntry]:
            with conn.cursor() as cur:
                return self._select(cur, where, params)

        return self._run(doing, read, **ids)

    # ---- Ledger ----
    def open_run(self, run_id: str) -> None:
        def bump(conn: Any) -> int:
            with conn.cursor() as cur:
                self._locked(cur)
                cur.execute(f"UPDATE {self.table.sql('_bindings')} SET epoch = epoch + 1, "
                            "updated_at = CURRENT_TIMESTAMP(6) WHERE sink_id = %s",
                            (self.sink_id,))
                return self._locked(cur)

        self._epoch = self._run("starting a driver run", bump, transaction=True)

    def run_token(self) -> str | None:
        return None if self._epoch is None else str(self._epoch)

    def resume_run(self, run_id: str, token: str | None) -> None:
        self._epoch = None if token is None else int(token)

    def bound_query(self) -> str | None:
        rows = self._run("reading the query binding", lambda c: _rows(
            c, f"SELECT query_id FROM {self.table.sql('_bindings')} WHERE sink_id = %s",
            (self.sink_id,)))
        return str(rows[0][0]) if rows and rows[0][0] is not None else None

    def bind_query(self, query_id: str, *, reset: bool = False) -> int:
        def bind(conn: Any) -> int:
            with conn.cursor() as cur:
                self._locked(cur)
                cur.execute(f"SELECT query_id, generation FROM {self.table.sql('_bindings')} "
                            "WHERE sink_id = %s", (self.sink_id,))
                row = cur.fetchone()
                bound, generation = (row[0], int(row[1])) if row else (None, 0)
                if not check_binding(self.sink_id, bound, query_id, reset=reset):
                    return generation
                if bound is not None:
                    generation += 1
                    for suffix in ("", "_aborts", "_receipts"):
                        cur.execute(f"DELETE FROM {self.table.sql(suffix)} WHERE sink_id = %s",
                                    (self.sink_id,))
                cur.execute(f"UPDATE {self.table.sql('_bindings')} SET query_id = %s, "
                            "generation = %s, updated_at = CURRENT_TIMESTAMP(6) "
                            "WHERE sink_id = %s", (query_id, generation, self.sink_id))
                return generation

        return self._run("binding the sink to its query", bind, transaction=True)

    def record_lineage(self, link: Lineage) -> None:
        def record(conn: Any) -> None:
            with conn.cursor() as cur:
                cur.execute(lineage_ddl(self.table))  # DDL commits on its own
                cur.execute(f"INSERT INTO {self.table.sql('_lineage')} (sink_id, query_id, "
                            "link) VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE link = "
                            "VALUES(link)", (self.sink_id, link.query_id,
                                             json.dumps(link.to_json())))

        self._run("recording where the query took the sink over", record)

    def lineage(self) -> list[Lineage]:
        def read(conn: Any) -> list[Lineage]:
            if not _rows(conn, "SELECT 1 FROM information_schema.tables WHERE table_schema = "
                         "%s AND table_name = %s",
                         (self.table.database, self.table.name + "_lineage")):
                return []
            return [Lineage.from_json(json.loads(r[0])) for r in _rows(
                conn, f"SELECT link FROM {self.table.sql('_lineage')} WHERE sink_id = %s",
                (self.sink_id,))]

        return self._run("reading the sink's lineage", read)

    def get(self, batch_id: int) -> LedgerEntry | None:
        found = self._entries("reading the ledger", "AND batch_id = %s", (batch_id,),
                              batch_id=batch_id)
        return found[0] if found else None

    def decide(self, entry: LedgerEntry) -> LedgerEntry:
        if entry.state not in (BatchState.DECIDED, BatchState.COMMITTED):
            raise ProtocolStateError(f"cannot record a {entry.state.value} decision")
        fp = entry.fingerprint
        done = entry.state is BatchState.COMMITTED

        def decide(conn: Any) -> LedgerEntry:
            with conn.cursor() as cur:
                self._check_epoch(self._locked(cur), entry.batch_id)
                cur.execute(f"SELECT 1 FROM {self.table.sql('_aborts')} WHERE sink_id = %s "
                            "AND batch_id = %s AND run_id = %s",
                            (self.sink_id, entry.batch_id, entry.run_id))
                if cur.fetchone() is not None:
                    raise FencedError(
                        f"run {entry.run_id} was aborted for this batch by another driver or "
                        "the operator tool; its transactions were rolled back",
                        sink_id=self.sink_id, batch_id=entry.batch_id)
                existing = self._one(cur, entry.batch_id)
                if existing is not None:
                    return existing
                cur.execute(
                    f"INSERT INTO {self.table.sql()} (sink_id, batch_id, run_id, state, "
                    "commits, fp_rows, fp_digest, query_id, committed_at) VALUES (%s, %s, %s, "
                    "%s, %s, %s, %s, %s, " + ("CURRENT_TIMESTAMP(6))" if done else "NULL)"),
                    (self.sink_id, entry.batch_id, entry.run_id, entry.state.value,
                     json.dumps([c.to_json() for c in entry.commits]),
                     fp.rows if fp else None, fp.hex if fp else None, entry.query_id))
                return entry

        return self._run("recording the decision", decide, transaction=True,
                         batch_id=entry.batch_id)

    def forbid_decision(self, batch_id: int, run_id: str) -> LedgerEntry | None:
        def abort(conn: Any) -> LedgerEntry | None:
            with conn.cursor() as cur:
                self._check_epoch(self._locked(cur), batch_id)
                existing = self._one(cur, batch_id)
                if existing is not None and existing.run_id == run_id:
                    return existing
                cur.execute(f"INSERT INTO {self.table.sql('_aborts')} (sink_id, batch_id, "
                            "run_id) VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE "
                            "run_id = run_id", (self.sink_id, batch_id, run_id))
                return None

        return self._run("recording an abort", abort, transaction=True, batch_id=batch_id)

    def mark_committed(self, batch_id: int) -> None:
        # Lost in a server crash, the batch reads as DECIDED and the next run commits it
        # again, which is idempotent (the receipts prove what is committed).
        self._run("recording the batch as committed", lambda c: _rows(
            c, f"UPDATE {self.table.sql()} SET state = 'COMMITTED', committed_at = "
            "CURRENT_TIMESTAMP(6) WHERE sink_id = %s AND batch_id = %s AND state = 'DECIDED'",
            (self.sink_id, batch_id)), batch_id=batch_id)

    def entries(self) -> Sequence[LedgerEntry]:
        return self._entries("reading the ledger")

    def unfinished(self) -> list[LedgerEntry]:
        return self._entries("reading the ledger", "AND state = 'DECIDED'")

    def last_batch_id(self) -> int | None:
        rows = self._run("reading the ledger", lambda c: _rows(
            c, f"SELECT max(batch_id) FROM {self.table.sql()} WHERE sink_id = %s",
            (self.sink_id,)))
        return int(rows[0][0]) if rows and rows[0][0] is not None else None

    def prune(self, keep: int) -> None:
        self._prunes += 1
        if (self._prunes - 1) % PRUNE_EVERY:  # housekeeping: every PRUNE_EVERY-th call
            return

        def prune(conn: Any) -> None:
            with conn.cursor() as cur:
                cur.execute(f"SELECT batch_id FROM {self.table.sql()} WHERE sink_id = %s "
                            "ORDER BY batch_id DESC LIMIT 1 OFFSET %s", (self.sink_id, keep))
                row = cur.fetchone()
                if row is None:
                    return
                cutoff = int(row[0])
                cur.execute(f"DELETE FROM {self.table.sql()} WHERE sink_id = %s AND state = "
                            "'COMMITTED' AND batch_id <= %s", (self.sink_id, cutoff))
                for suffix in ("_aborts", "_receipts"):
                    cur.execute(f"DELETE FROM {self.table.sql(suffix)} WHERE sink_id = %s "
                                "AND batch_id <= %s", (self.sink_id, cutoff))

        self._run("pruning the ledger", prune, transaction=True)

    def receipt(self, transaction_id: str) -> bool:
        """Is there a receipt (proof of commit) for ``transaction_id``?"""
        return bool(self._run("reading a receipt", lambda c: _rows(
            c, f"SELECT 1 FROM {self.table.sql('_receipts')} WHERE xid = %s",
            (transaction_id,)), transaction_id=transaction_id))

    def close(self) -> None:
        self.db.close()


def _rows(conn: Any, statement: str, params: tuple[Any, ...]) -> list[Any]:
    with conn.cursor() as cur:
        cur.execute(statement, params)
        return list(cur.fetchall())
