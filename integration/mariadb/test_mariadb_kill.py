"""MariaDBSink on real Spark and a real MariaDB: drivers SIGKILLed at every crash point of the
prepared-transaction family in turn and at a random moment, a task's Python worker killed
before and after its ``XA PREPARE``, the server SIGKILLed while a batch is decided but not
committed. Each run restarts from the same checkpoint; the table is then read row by row:
every input id exactly once (the table has no key, so a duplicate would show), every batch
COMMITTED in the ledger, and no branch of the sink left in ``XA RECOVER``.

The driver is ``examples/stream_to_mariadb.py`` (files source: one file per micro-batch).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors.core.naming import TransactionId
from connectors.mariadb._client import connect
from connectors.mariadb._config import Address, TableName
from connectors.mariadb._xid import transaction_id_of_row
from connectors.sdk import CrashPoint
from examples.stream_to_files import make_input_files
from integration.support._driver import (
    REPO,
    SEED,
    DriverRun,
    KillJob,
    finished_batches,
    kill_at_each,
    kill_at_random,
    reached,
    spark_batches,
    two_drivers_until_one_completes,
)
from integration.support._fixtures_mariadb import NativeMariaDB

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS_PER_FILE = 300


class Target:
    """One test's table, ledger tables and sink id, read through the sink's own client."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.address = Address(url)
        tag = uuid.uuid4().hex[:8]
        self.table, self.ledger, self.sink_id = f"ev_{tag}", f"led_{tag}", f"kill-{tag}"
        self.execute(f"CREATE TABLE {self.sql()} (id BIGINT NOT NULL, name VARCHAR(64), "
                     "amount DOUBLE, ts DATETIME(6)) ENGINE=InnoDB")

    def sql(self, name: str | None = None) -> str:
        return TableName(self.address.database, name or self.table).sql()

    def execute(self, statement: str, params: tuple[Any, ...] = ()) -> list[Any]:
        conn = connect(self.address, connect_timeout=10, lock_wait_timeout=10)
        try:
            with conn.cursor() as cur:
                cur.execute(statement, params)
                return list(cur.fetchall())
        finally:
            conn.close()

    def ids(self) -> list[int]:
        return sorted(int(r[0]) for r in self.execute(f"SELECT id FROM {self.sql()}"))

    def ledger_states(self) -> dict[int, str]:
        try:
            rows = self.execute(f"SELECT batch_id, state FROM {self.sql(self.ledger)} "
                                "WHERE sink_id = %s", (self.sink_id,))
        except Exception:  # the ledger's tables are made by the first run
            return {}
        return {int(b): str(s) for b, s in rows}

    def prepared(self) -> list[TransactionId]:
        found = [transaction_id_of_row(r) for r in self.execute("XA RECOVER")]
        return [t for t in found if t is not None and t.belongs_to(self.sink_id)]

    def cleanup(self) -> None:
        for suffix in ("", "_aborts", "_bindings", "_receipts"):
            self.execute(f"DROP TABLE IF EXISTS {self.sql(self.ledger + suffix)}")
        self.execute(f"DROP TABLE IF EXISTS {self.sql()}")


class MariaJob(KillJob):
    """Files (one per batch, ``ROWS_PER_FILE`` rows each) or, with ``rate_rows``, Spark's
    rate source (``files`` batches of ``rate_rows`` rows, ids ``0..``)."""

    module = "examples.stream_to_mariadb"

    def __init__(self, root: Path, target: Target, files: int, rate_rows: int = 0) -> None:
        super().__init__(root, sink_id=target.sink_id, cwd=REPO)
        self.target = target
        self.input = root / "in"
        self.rate_rows = rate_rows
        self.total = (files * rate_rows if rate_rows
                      else make_input_files(self.input, files, ROWS_PER_FILE))
        self.batches = files

    def args(self) -> list[str]:
        t = self.target
        source = (["--source", "rate", "--batches", str(self.batches), "--rows-per-batch",
                   str(self.rate_rows)] if self.rate_rows
                  else ["--source", "files", "--input", str(self.input)])
        return [*source, "--checkpoint", str(self.checkpoint), "--url", t.url, "--table",
                t.table, "--sink-id", t.sink_id, "--ledger-table", t.ledger]

    def assert_exact(self) -> None:
        ids = self.target.ids()
        assert len(ids) == self.total, (len(ids), self.total)
        assert ids == list(range(self.total)), "every input id exactly once"
        batches = self.batches
        if not self.rate_rows:  # files: a kill can put two files in one micro-batch
            batches = finished_batches(self.checkpoint)
            assert 0 < batches <= self.batches, (batches, self.batches)
        states = self.target.ledger_states()
        assert states == dict.fromkeys(range(batches), "COMMITTED"), states
        assert self.target.prepared() == [], "nothing of the sink left prepared"


@pytest.fixture
def target(mariadb_url: str) -> Iterator[Target]:
    t = Target(mariadb_url)
    yield t
    t.cleanup()


def test_driver_sigkilled_at_every_crash_point_in_turn_then_exact(
        tmp_path: Path, target: Target) -> None:
    """One job, five driver runs: SIGKILLed at before_decision of batch 1, after_decision
    of 2, between_commits of 3, after_commit of 4, then a run to its end. After each kill
    MariaDB holds that point's state (branches prepared; the decision recorded or not; the
    rows visible or not), and the next run settles it."""
    plan = [(CrashPoint.BEFORE_DECISION, target.sink_id, 1),
            (CrashPoint.AFTER_DECISION, target.sink_id, 2),
            (CrashPoint.BETWEEN_COMMITS, target.sink_id, 3),
            (CrashPoint.AFTER_COMMIT, target.sink_id, 4)]
    job = MariaJob(tmp_path, target, files=6)

    def after_kill(point: CrashPoint, _sink: str, batch: int, _run: DriverRun) -> None:
        states, prepared = target.ledger_states(), target.prepared()
        before = batch * ROWS_PER_FILE
        assert all(states.get(b) == "COMMITTED" for b in range(batch)), states
        assert all(t.batch_id == batch for t in prepared), prepared
        count = len(target.ids())
        if point is CrashPoint.BEFORE_DECISION:
            assert prepared and batch not in states and count == before
        elif point is CrashPoint.AFTER_DECISION:
            assert prepared and states.get(batch) == "DECIDED" and count == before
        elif point is CrashPoint.BETWEEN_COMMITS:
            assert prepared and states.get(batch) == "DECIDED"
            assert before < count < before + ROWS_PER_FILE, count
        else:
            assert not prepared and states.get(batch) == "COMMITTED"
            assert count == before + ROWS_PER_FILE

    kill_at_each(job, plan, after_kill=after_kill)
    job.assert_exact()


@pytest.mark.parametrize("point", [CrashPoint.BEFORE_PRECOMMIT, CrashPoint.AFTER_PRECOMMIT],
                         ids=lambda p: p.value)
def test_task_killed_before_and_after_its_prepare_then_exact(
        point: CrashPoint, tmp_path: Path, target: Target) -> None:
    """A task's Python worker SIGKILLed before / after ``XA PREPARE``: the query fails, its
    branches are rolled back (the open one with its session, the prepared one by the
    driver), nothing of the batch is visible; the restart is exact."""
    job = MariaJob(tmp_path, target, files=4)
    first = job.run(crash=f"{point.value}:batch=2:partition=0")
    assert first.returncode > 0, f"the query should have failed:\n{first.tail()}"
    assert job.reached(point, 2, partition=0), reached(job.crash_log)
    offsets, commits = spark_batches(job.checkpoint)
    assert 2 in offsets and 2 not in commits, (offsets, commits)
    assert 2 not in target.ledger_states() and len(target.ids()) == 2 * ROWS_PER_FILE
    second = job.run()
    assert second.returncode == 0, second.tail()
    job.assert_exact()


def test_driver_killed_at_a_random_moment_then_exact(tmp_path: Path, target: Target) -> None:
    job = MariaJob(tmp_path, target, files=6)
    kill_at_random(job, progress=lambda: len(target.ledger_states()), runs=1, max_delay=1.5,
                   seed=SEED)
    job.assert_exact()


def test_server_sigkilled_with_a_decided_batch_then_exact(
        tmp_path: Path, native_mariadb: NativeMariaDB, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver is SIGKILLed after batch 2's decision, then the server is SIGKILLed and
    started again: the prepared branches survive the server's crash, and the restarted
    driver commits them."""
    target = Target(native_mariadb.url)
    try:
        job = MariaJob(tmp_path, target, files=4)
        first = job.run(crash=f"{CrashPoint.AFTER_DECISION.value}:batch=2")
        assert first.returncode == -9, first.tail()
        held = target.prepared()
        assert held and {t.batch_id for t in held} == {2}
        native_mariadb.restart("immediate")
        assert sorted(map(str, target.prepared())) == sorted(map(str, held)), \
            "the prepared branches survived the server's crash"
        second = job.run()
        assert second.returncode == 0, second.tail()
        job.assert_exact()
    finally:
        target.cleanup()


def test_server_restarted_while_a_decided_batch_waits_then_the_same_run_finishes_exact(
        tmp_path: Path, native_mariadb: NativeMariaDB) -> None:
    """The driver stalls between batch 1's decision and its ``XA COMMIT``; MariaDB restarts
    meanwhile (SIGTERM, 1 s down): the prepared branches survive it, the driver's dead
    connection is replaced, the commit is retried and the same run ends exact."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    target = Target(native_mariadb.url)
    try:
        job = MariaJob(tmp_path, target, files=3)
        spec = f"{CrashPoint.AFTER_DECISION.value}:batch=1:action=stall:seconds=15"
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(job.run, crash=spec)
            deadline = time.monotonic() + 300
            while not (job.reached(CrashPoint.AFTER_DECISION, 1) or future.done()):
                assert time.monotonic() < deadline, "the stall was never reached"
                time.sleep(0.2)
            assert job.reached(CrashPoint.AFTER_DECISION, 1), future.result().tail()
            held = {str(t) for t in target.prepared()}
            assert held and target.ledger_states().get(1) == "DECIDED"
            native_mariadb.restart("fast", downtime=1.0)
            assert {str(t) for t in target.prepared()} <= held
            run = future.result()
        assert run.returncode == 0, run.tail()
        batch1 = [m for m in run.metrics() if m.get("batch_id") == "1"]
        assert batch1 and int(batch1[0]["retries"]) >= 1, batch1
        job.assert_exact()
    finally:
        target.cleanup()


def test_a_query_started_while_the_server_is_down_rides_it_out(
        tmp_path: Path, native_mariadb: NativeMariaDB) -> None:
    """MariaDB is down when the query starts: the first batch's connect fails as transient,
    the batch runs again within ``outage_timeout`` and, once the server is back (25 s
    later), the query ends exact."""
    import threading

    target = Target(native_mariadb.url)
    try:
        job = MariaJob(tmp_path, target, files=2)
        native_mariadb.stop("fast")
        timer = threading.Timer(25.0, native_mariadb.start)  # Spark starts in ~10 s
        timer.start()
        try:
            run = job.run()
        finally:
            timer.join()
        assert run.returncode == 0, run.tail()
        batch0 = [m for m in run.metrics() if m.get("batch_id") == "0"]
        assert batch0 and int(batch0[0].get("batch_restarts", 0)) >= 1, batch0
        job.assert_exact()
    finally:
        target.cleanup()


def test_two_drivers_on_one_checkpoint_then_restarts_are_exact(
        tmp_path: Path, target: Target) -> None:
    """Two drivers start on the same checkpoint at nearly the same time; one may fail
    (FencedError: the other bumped the epoch; or Spark's checkpoint conflict); both are
    restarted until one completes. Nothing is lost, nothing doubled, nothing prepared."""
    job = MariaJob(tmp_path, target, files=6)
    history, runs = two_drivers_until_one_completes(job)
    seen = sorted({e for r in runs for e in ("FencedError", "QueryBindingError",
                                               "ConcurrentModificationException")
                   if e in r.output})
    print(f"exit codes per round: {history}; errors seen: {seen}")
    job.assert_exact()


def test_stopped_gracefully_and_plainly_in_every_phase_leaves_nothing_then_exact(
        tmp_path: Path, target: Target) -> None:
    """The rate source, stopped once per batch by a SIGTERM in the next phase (graceful:
    ``connectors.stop_on_sigterm``; plain: ``query.stop()``): before the tasks, in them,
    after the prepare, at and after the decision, between the commits. After each stop no
    branch of the sink is left prepared (a graceful stop also committed the batch in
    flight); the last run ends exact."""
    from integration.core.test_stopping import PG_CI, batches_for, stop_chain

    job = MariaJob(tmp_path, target, files=batches_for(PG_CI), rate_rows=200)

    def nothing_left(stopped: Any) -> None:
        assert target.prepared() == [], (stopped.kind, stopped.point.value,
                                         target.prepared())

    stop_chain(job, target.sink_id, PG_CI, nothing_left)
    job.assert_exact()
