"""PostgresSink's task side speaks plain SQL: no psycopg two-phase-commit call, ever; old gids
still recovered.

- With every ``tpc_*`` method of ``psycopg.Connection`` made to raise, batches with retried
  and speculative task attempts, reused sessions, and upserts still write every row once:
  nothing calls ``tpc_begin`` after a ``PREPARE`` (or at all).
- Only an idle session is pooled and handed out; a reused session the server killed is
  replaced before anything is written.
- Transactions prepared the old way (psycopg's ``tpc_begin``/``tpc_prepare``, the same gid)
  are found by ``connectors status``, settled by ``connectors recover`` and by the sink's
  own recovery.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from connectors.core.errors import ConfigurationError
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers.ledger import BATCH_JOB_QUERY_ID, LedgerEntry, TaskCommit
from connectors.core.naming import TransactionId
from connectors.core.states import BatchState
from connectors.postgres import XID_FORMAT_ID, PostgresSink
from connectors.postgres._config import Conninfo, TableName
from connectors.postgres._gid import encode_gid
from connectors.postgres._ledger import DriverConnection, PostgresLedger
from connectors.postgres._pool import TaskConnections
from connectors.testing import LocalBatch
from integration.cli.test_cli_postgres import cli, target_args
from integration.support._pg import DRIVER_PGOPTIONS, PgTarget, connect

pytestmark = pytest.mark.integration

TPC_METHODS = ("xid", "tpc_begin", "tpc_prepare", "tpc_commit", "tpc_rollback", "tpc_recover")


@pytest.fixture
def pg(postgres_conninfo: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[PgTarget]:
    monkeypatch.setenv("PGOPTIONS", DRIVER_PGOPTIONS)
    target = PgTarget(postgres_conninfo, prefix="tsql")
    target.create_table()
    yield target
    target.cleanup()


def rows(ids: range) -> pa.Table:
    return pa.table({
        "id": pa.array(list(ids), pa.int64()),
        "name": pa.array([f"name-{i}" for i in ids]),
        "amount": pa.array([i * 0.25 for i in ids]),
        "ts": pa.array([i * 1_000_000 for i in ids], pa.timestamp("us", tz="UTC")),
    })


def sink_for(pg: PgTarget, **options: Any) -> PostgresSink:
    return PostgresSink(pg.conninfo, pg.table, sink_id=pg.sink_id, ledger_table=pg.ledger,
                        **options)


class TpcGuard:
    """Makes every psycopg two-phase-commit method raise, and records each call."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self._saved = {n: inspect.getattr_static(psycopg.Connection, n) for n in TPC_METHODS}
        self._own = {n for n in TPC_METHODS if n in vars(psycopg.Connection)}

    def _forbidden(self, name: str) -> Any:
        def call(conn: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            raise AssertionError(f"psycopg.Connection.{name} called: the sink must speak SQL")
        return call

    def install(self) -> None:
        for name in TPC_METHODS:
            setattr(psycopg.Connection, name, self._forbidden(name))

    def remove(self) -> None:
        for name in TPC_METHODS:
            if name in self._own:
                setattr(psycopg.Connection, name, self._saved[name])
            else:
                delattr(psycopg.Connection, name)

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """psycopg's own methods for a while (to prepare the way old releases did)."""
        self.remove()
        try:
            yield
        finally:
            self.install()


@pytest.fixture
def no_tpc() -> Iterator[TpcGuard]:
    guard = TpcGuard()
    guard.install()
    try:
        yield guard
    finally:
        guard.remove()


@pytest.fixture
def task_connects(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Backend pids of the task connections opened (``connectors-task:`` sessions)."""
    opened: list[int] = []
    real = psycopg.connect

    def counting(*args: Any, **kwargs: Any) -> Any:
        conn = real(*args, **kwargs)
        if str(kwargs.get("application_name", "")).startswith("connectors-task:"):
            opened.append(conn.info.backend_pid)
        return conn

    monkeypatch.setattr(psycopg, "connect", counting)
    return opened


def test_no_tpc_call_on_task_connections_with_retries_speculation_and_reuse(
    pg: PgTarget, no_tpc: TpcGuard, task_connects: list[int]
) -> None:
    # The control: the patch is in force (a tpc_begin would fail the test).
    with connect(pg.conninfo) as conn, pytest.raises(AssertionError, match="tpc_begin"):
        conn.tpc_begin("x")
    assert no_tpc.calls == ["tpc_begin"]
    no_tpc.calls.clear()
    sink = sink_for(pg)
    total, attempts = 0, 0
    for batch_id in range(4):
        batch = LocalBatch(rows(range(total, total + 100)), partitions=3,
                           fail_first_attempt=[1] if batch_id % 2 else [],
                           speculate=[2] if batch_id >= 2 else [])
        sink.write_batch(batch, batch_id)
        attempts += len(batch.attempts)
        total += 100
    sink.close()
    assert no_tpc.calls == []
    pg.assert_exact(total)
    # Sessions were reused after their PREPARE: far fewer connections than attempts.
    assert 0 < len(task_connects) < attempts, (len(task_connects), attempts)


def test_no_tpc_call_in_upsert_mode(pg: PgTarget, no_tpc: TpcGuard) -> None:
    pg.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (id)").format(sql.Identifier(pg.table)))
    sink = sink_for(pg, mode="upsert", key_columns=["id"])
    sink.write_batch(LocalBatch(rows(range(50)), partitions=2), 0)
    # (No speculation here: in-process, a speculative upsert of the same keys would wait
    # for the accepted attempt's prepared row locks until lock_timeout.)
    sink.write_batch(LocalBatch(rows(range(25, 75)), partitions=2, fail_first_attempt=[0]), 1)
    sink.close()
    assert no_tpc.calls == []
    pg.assert_exact(75)


def test_only_idle_sessions_are_pooled(postgres_conninfo: str) -> None:
    key = TaskConnections.key("test_only_idle_sessions_are_pooled")
    busy = psycopg.connect(postgres_conninfo, autocommit=True)
    busy.execute("BEGIN")
    TaskConnections.give_back(key, busy)  # inside a transaction: closed, not kept
    assert busy.closed and TaskConnections.take(key) is None
    implicit = psycopg.connect(postgres_conninfo)  # not autocommit: never pooled
    TaskConnections.give_back(key, implicit)
    assert implicit.closed and TaskConnections.take(key) is None
    idle = psycopg.connect(postgres_conninfo, autocommit=True)
    TaskConnections.give_back(key, idle)
    taken = TaskConnections.take(key)
    assert taken is idle
    idle.close()


def test_a_reused_session_killed_by_the_server_is_replaced(
    pg: PgTarget, no_tpc: TpcGuard, task_connects: list[int]
) -> None:
    sink = sink_for(pg)
    sink.write_batch(LocalBatch(rows(range(100)), partitions=1), 0)
    assert len(task_connects) == 1
    with connect(pg.conninfo) as admin:  # the pooled session dies (a server-side kill)
        admin.execute("SELECT pg_terminate_backend(%s)", [task_connects[0]])
    sink.write_batch(LocalBatch(rows(range(100, 200)), partitions=1), 1)
    sink.close()
    assert len(task_connects) == 2 and no_tpc.calls == []
    pg.assert_exact(200)


def test_a_reused_session_the_client_refuses_is_replaced(
    pg: PgTarget, no_tpc: TpcGuard, task_connects: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A psycopg release that refused a state (a client-side ProgrammingError, no
    SQLSTATE) on a reused session: the task begins on a new session instead of failing."""
    sink = sink_for(pg)
    sink.write_batch(LocalBatch(rows(range(100)), partitions=1), 0)
    refused: list[int] = []
    real_execute = psycopg.Connection.execute

    def execute(conn: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if query == "BEGIN" and conn.info.backend_pid == task_connects[0] and not refused:
            refused.append(conn.info.backend_pid)
            raise psycopg.ProgrammingError("simulated: the client refuses this session")
        return real_execute(conn, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", execute)
    sink.write_batch(LocalBatch(rows(range(100, 200)), partitions=1), 1)
    sink.close()
    assert refused and len(task_connects) == 2 and no_tpc.calls == []
    pg.assert_exact(200)


def test_a_statement_the_server_refuses_on_a_reused_session_is_a_clear_error(
    pg: PgTarget, no_tpc: TpcGuard, task_connects: list[int]
) -> None:
    """With a SQLSTATE (here the table's INSERT privilege revoked: 42501) a new session
    would fail the same way: no reconnect, one clear error, nothing committed."""
    role = f"eos_tsql_{pg.suffix}"
    pg.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'tsql-pw'").format(sql.Identifier(role)))
    try:
        pg.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA public TO {}").format(
            sql.Identifier(role)))
        pg.execute(sql.SQL("ALTER TABLE {} OWNER TO {}").format(
            sql.Identifier(pg.table), sql.Identifier(role)))
        conninfo = psycopg.conninfo.make_conninfo(pg.conninfo, user=role, password="tsql-pw")
        sink = PostgresSink(conninfo, pg.table, sink_id=pg.sink_id, ledger_table=pg.ledger)
        sink.write_batch(LocalBatch(rows(range(100)), partitions=1), 0)
        pg.execute(sql.SQL("REVOKE INSERT ON {} FROM {}").format(
            sql.Identifier(pg.table), sql.Identifier(role)))
        with pytest.raises(ConfigurationError, match=r"permission denied.*SQLSTATE 42501"):
            sink.write_batch(LocalBatch(rows(range(100, 200)), partitions=1), 1)
        assert len(task_connects) == 1  # the reused session; no reconnect
        pg.execute(sql.SQL("GRANT INSERT ON {} TO {}").format(
            sql.Identifier(pg.table), sql.Identifier(role)))
        sink.write_batch(LocalBatch(rows(range(100, 200)), partitions=1), 1)
        sink.close()
        pg.assert_exact(200)
        assert no_tpc.calls == []
    finally:
        pg.cleanup()
        pg.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        pg.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


# ------------------------------------------------------- transactions of earlier releases


def prepare_the_old_way(pg: PgTarget, tid: TransactionId, ids: range) -> str:
    """What releases before the plain-SQL task side did: psycopg's tpc_begin/tpc_prepare
    with ``conn.xid(XID_FORMAT_ID, gtrid, bqual)``, rows plus a receipt. Returns the gid."""
    conn = psycopg.connect(pg.conninfo)  # no `with`: its exit would commit()
    try:
        conn.tpc_begin(conn.xid(XID_FORMAT_ID, *tid.xid_parts()))
        with conn.cursor() as cur:
            cur.executemany(
                sql.SQL("INSERT INTO {} (id, name) VALUES (%s, %s)").format(
                    sql.Identifier(pg.table)), [(i, f"old-{i}") for i in ids])
            cur.execute(
                sql.SQL("INSERT INTO {} (xid, sink_id, batch_id, rows, digest) "
                        "VALUES (%s, %s, %s, %s, %s)").format(
                    sql.Identifier(pg.ledger + "_receipts")),
                (str(tid), tid.sink_id, tid.batch_id, len(ids), Fingerprint().hex))
        conn.tpc_prepare()
    finally:
        conn.close()
    (gid,), = pg.execute("SELECT gid FROM pg_prepared_xacts WHERE gid = %s",
                         [encode_gid(XID_FORMAT_ID, *tid.xid_parts())])
    return str(gid)


def decide(pg: PgTarget, batch_id: int, run_id: str, *tids: TransactionId) -> None:
    """The ledger's decision for ``batch_id`` (what an old driver wrote before it died)."""
    db = DriverConnection(Conninfo(pg.conninfo), 10, pg.sink_id)
    ledger = PostgresLedger(db, TableName.parse(pg.ledger), sink_id=pg.sink_id)
    commits = tuple(TaskCommit(str(t), p, t.task_attempt_id, Fingerprint())
                    for p, t in enumerate(tids))
    ledger.decide(LedgerEntry(pg.sink_id, batch_id, run_id, BatchState.DECIDED, commits,
                              Fingerprint(), BATCH_JOB_QUERY_ID))
    ledger.close()


def old_leftovers(pg: PgTarget, batch_id: int) -> tuple[TransactionId, TransactionId]:
    """A decided and an undecided transaction of ``batch_id``, prepared the old way."""
    decided = TransactionId(pg.sink_id, "0ddc0de1", batch_id, 9001)
    undecided = TransactionId(pg.sink_id, "0ddc0de2", batch_id, 9002)
    base = 1000 * (batch_id + 1)
    prepare_the_old_way(pg, decided, range(base, base + 10))
    prepare_the_old_way(pg, undecided, range(base + 500, base + 510))
    decide(pg, batch_id, decided.run_id, decided)
    return decided, undecided


def test_old_transactions_are_settled_by_the_sinks_recovery(
    pg: PgTarget, no_tpc: TpcGuard
) -> None:
    sink = sink_for(pg)
    sink.write_batch(LocalBatch(rows(range(100)), partitions=2), 0)
    sink.close()
    with no_tpc.suspended():  # the old releases' code path needs psycopg's methods
        decided, undecided = old_leftovers(pg, 1)
    assert sorted(map(str, pg.prepared())) == sorted([str(decided), str(undecided)])
    # A new driver run: its recovery commits the decided one, rolls back the other.
    sink = sink_for(pg)
    sink.write_batch(LocalBatch(rows(range(100, 200)), partitions=2), 2)
    sink.close()
    assert no_tpc.calls == []
    assert pg.prepared() == []
    assert pg.ledger_states() == {0: "COMMITTED", 1: "COMMITTED", 2: "COMMITTED"}
    assert sorted(pg.ids()) == [*range(200), *range(2000, 2010)]


def test_old_transactions_are_listed_by_status_and_settled_by_recover(pg: PgTarget) -> None:
    sink = sink_for(pg)
    sink.write_batch(LocalBatch(rows(range(100)), partitions=2), 0)
    sink.close()
    decided, undecided = old_leftovers(pg, 1)

    code, data, err = cli("status", *target_args(pg))
    assert code == 1, err
    (status,) = data
    assert status["unfinished"] == [1]
    assert {x["transaction"]: x["decided"] for x in status["lingering"]} == {
        str(decided): True, str(undecided): False}

    code, data, err = cli("recover", *target_args(pg), "--commit-decided", "--abort-undecided",
                          "--min-age", "0")
    assert code == 0, err
    assert data[0]["committed"] == [str(decided)] and data[0]["aborted"] == [str(undecided)]
    assert pg.prepared() == []
    assert pg.ledger_states() == {0: "COMMITTED", 1: "COMMITTED"}
    assert sorted(pg.ids()) == [*range(100), *range(2000, 2010)]
    code, data, err = cli("status", *target_args(pg))
    assert code == 0 and data[0]["lingering"] == [], err

