"""Shared helpers of the PostgreSQL integration tests: names, state, clean-up, checks.

Every test works in its own table, ledger tables and sink id (a random suffix), so tests of
other files (and other pytest sessions against the same server) never see each other's
rows, decisions or prepared transactions. :class:`PgTarget` bundles the names and the
queries the tests need to prove what a crash left behind and what the restart repaired.
"""

from __future__ import annotations

import collections
import contextlib
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from connectors.core.naming import TransactionId
from connectors.postgres import XID_FORMAT_ID
from connectors.postgres._gid import decode_gid, encode_gid

__all__ = [
    "DRIVER_PGOPTIONS",
    "EVENTS_DDL",
    "LEDGER_SUFFIXES",
    "RECEIPTS_INDEX_BUG",
    "RECEIPTS_INDEX_SIGNATURE",
    "PgTarget",
    "blocked_by_receipts_index",
    "check_restart",
    "connect",
    "fresh_database",
    "prepared_of",
    "rollback_prepared_of",
    "token",
    "wait_for",
]

#: libpq options for the drivers the tests start: a driver that waits on a lock for
#: longer fails (LockNotAvailable) instead of hanging, and holding locks that block every
#: other test on the shared server. The tasks set their own ``lock_timeout``.
DRIVER_PGOPTIONS = "-c lock_timeout=30s"

#: A bug these tests found (fixed in connectors/postgres/_ledger.py): a restarted driver
#: blocked in ``PostgresLedger._create`` on ``CREATE INDEX IF NOT EXISTS <ledger>_receipts_batch``
#: while the sink's own prepared transactions held a lock on the receipts table.
RECEIPTS_INDEX_BUG = (
    "regression: the restarted driver waited on a lock in PostgresLedger._create "
    "('starting a driver run'): CREATE INDEX IF NOT EXISTS on <ledger>_receipts needs a "
    "ShareLock, which the sink's own prepared transactions block (each inserted its "
    "receipt) until this very driver settles them; it also holds the global "
    "'connectors|ddl' advisory lock meanwhile, blocking every other sink's new driver"
)
#: What a driver's output shows when it ran into :data:`RECEIPTS_INDEX_BUG`.
RECEIPTS_INDEX_SIGNATURE = "starting a driver run: lock or statement timeout"


def blocked_by_receipts_index(output: str) -> bool:
    return RECEIPTS_INDEX_SIGNATURE in output and "LockNotAvailable" in output


def check_restart(run: Any) -> None:
    """Assert a driver run (``integration.support._driver.DriverRun``) succeeded; name the known
    failure mode :data:`RECEIPTS_INDEX_BUG` when that is what happened."""
    if run.returncode != 0 and blocked_by_receipts_index(run.output):
        raise AssertionError(f"{RECEIPTS_INDEX_BUG}\n{run.tail()}")
    assert run.returncode == 0, run.tail()


#: Columns of the events table the example job writes (both sources).
EVENTS_DDL = "id bigint NOT NULL, name text, amount double precision, ts timestamptz"
LEDGER_SUFFIXES = ("", "_aborts", "_bindings", "_receipts", "_lineage")


def wait_for(predicate: Any, timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate()`` until true (True) or ``timeout`` seconds passed (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def token() -> str:
    """A short random suffix for table names and sink ids."""
    return secrets.token_hex(4)


@contextlib.contextmanager
def connect(conninfo: str, **kwargs: Any) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(conninfo, autocommit=True, connect_timeout=10, **kwargs) as conn:
        yield conn


def prepared_of(conninfo: str, sink_id: str) -> list[TransactionId]:
    """The sink's transactions in ``pg_prepared_xacts`` (any database of the server)."""
    with connect(conninfo) as conn:
        gids = [r[0] for r in conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall()]
    found = []
    for gid in gids:
        xid = decode_gid(gid)
        if xid is None or xid[0] != XID_FORMAT_ID:
            continue
        tid = TransactionId.from_xid_parts(xid[1], xid[2])
        if tid is not None and tid.sink_id == sink_id:
            found.append(tid)
    return sorted(found)


def rollback_prepared_of(conninfo: str, sink_id: str) -> int:
    """Clean-up after a failed test: roll back the sink's prepared transactions."""
    n = 0
    with connect(conninfo) as conn:
        for tid in prepared_of(conninfo, sink_id):
            gid = encode_gid(XID_FORMAT_ID, *tid.xid_parts())
            with contextlib.suppress(psycopg.errors.UndefinedObject):
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
                n += 1
    return n


@dataclass
class PgTarget:
    """One test's table, ledger and sink id on the shared server."""

    conninfo: str
    prefix: str = "eos_it"
    suffix: str = field(default_factory=token)

    @property
    def table(self) -> str:
        return f"{self.prefix}_{self.suffix}"

    @property
    def ledger(self) -> str:
        return f"{self.prefix}_ledger_{self.suffix}"

    @property
    def sink_id(self) -> str:
        return f"{self.prefix.replace('_', '-')}-{self.suffix}"

    # ---- set-up and clean-up ----
    def create_table(self, columns: str = EVENTS_DDL, name: str | None = None) -> None:
        with connect(self.conninfo) as conn:
            conn.execute(sql.SQL("CREATE TABLE {} ({})").format(
                sql.Identifier(name or self.table), sql.SQL(columns)))

    def execute(self, statement: str | sql.SQL | sql.Composed, params: Any = None) -> list[Any]:
        with connect(self.conninfo) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def exists(self, name: str) -> bool:
        rows = self.execute("SELECT to_regclass(quote_ident(%s)) IS NOT NULL", [name])
        return bool(rows[0][0])

    def cleanup(self, *extra_tables: str) -> None:
        """Roll back the sink's prepared transactions (they would block DROP), drop tables."""
        rollback_prepared_of(self.conninfo, self.sink_id)
        names = [self.table, *extra_tables, *(self.ledger + s for s in LEDGER_SUFFIXES)]
        with connect(self.conninfo) as conn:
            conn.execute("SET lock_timeout = '10s'")
            for name in names:
                with contextlib.suppress(psycopg.Error):
                    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))

    # ---- what the sink left ----
    def prepared(self) -> list[TransactionId]:
        return prepared_of(self.conninfo, self.sink_id)

    def ledger_states(self) -> dict[int, str]:
        """batch id -> DECIDED / COMMITTED (empty when the ledger was never created)."""
        if not self.exists(self.ledger):
            return {}
        rows = self.execute(
            sql.SQL("SELECT batch_id, state FROM {} WHERE sink_id = %s").format(
                sql.Identifier(self.ledger)), [self.sink_id])
        return {int(b): str(s) for b, s in rows}

    def decided_transactions(self, batch_id: int) -> list[str]:
        """Transaction ids the ledger's decision of ``batch_id`` lists."""
        rows = self.execute(
            sql.SQL("SELECT commits FROM {} WHERE sink_id = %s AND batch_id = %s").format(
                sql.Identifier(self.ledger)), [self.sink_id, batch_id])
        return sorted(c["txn"] for c in rows[0][0]) if rows else []

    def ledger_aborts(self) -> list[tuple[int, str]]:
        if not self.exists(self.ledger + "_aborts"):
            return []
        return [(int(b), str(r)) for b, r in self.execute(
            sql.SQL("SELECT batch_id, run_id FROM {} WHERE sink_id = %s").format(
                sql.Identifier(self.ledger + "_aborts")), [self.sink_id])]

    def count(self, table: str | None = None) -> int:
        rows = self.execute(sql.SQL("SELECT count(*) FROM {}").format(
            sql.Identifier(table or self.table)))
        return int(rows[0][0])

    def ids(self, table: str | None = None) -> list[int]:
        return [int(r[0]) for r in self.execute(
            sql.SQL("SELECT id FROM {}").format(sql.Identifier(table or self.table)))]

    def rows(self, columns: str = "id, name, amount, ts", table: str | None = None) -> list[Any]:
        return self.execute(sql.SQL("SELECT {} FROM {} ORDER BY 1").format(
            sql.SQL(columns), sql.Identifier(table or self.table)))

    # ---- the check every test ends with ----
    def assert_exact(self, total: int, table: str | None = None) -> None:
        """Every id in ``range(total)`` exactly once, nothing prepared by the sink."""
        ids = self.ids(table)
        counts = collections.Counter(ids)
        missing = [i for i in range(total) if counts[i] == 0]
        dup = sorted(i for i, c in counts.items() if c > 1)
        extra = sorted(i for i in counts if not 0 <= i < total)
        assert not missing and not dup and not extra, (
            f"missing {missing[:10]} ({len(missing)}), duplicated {dup[:10]} ({len(dup)}), "
            f"unexpected {extra[:10]}"
        )
        (n, distinct), = self.execute(sql.SQL("SELECT count(*), count(DISTINCT id) FROM {}")
                                      .format(sql.Identifier(table or self.table)))
        assert n == distinct == total, (n, distinct, total)
        left = self.prepared()
        assert not left, f"prepared transactions of the sink left behind: {left}"


@contextlib.contextmanager
def fresh_database(conninfo: str, name: str) -> Iterator[str]:
    """Create database ``name`` and yield a conninfo for it; afterwards roll back what is
    left prepared in it and drop it."""
    from psycopg.conninfo import make_conninfo

    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    target = make_conninfo(conninfo, dbname=name)
    try:
        yield target
    finally:
        with psycopg.connect(target, autocommit=True) as conn:
            gids = [r[0] for r in conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")]
            for gid in gids:
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))
