"""PostgresSink on real Spark and a real PostgreSQL: killed drivers, killed tasks, restarts.

Every test runs real Structured Streaming drivers (``examples/stream_to_postgres.py``) as
child processes, kills them (SIGKILL at a named crash point, at a random moment, a Python
worker killed, PostgreSQL restarted, a second driver on the same checkpoint), restarts them
from the same checkpoint and then checks the table row by row: every input id exactly
once (``count(*) == count(DISTINCT id) == total``; the table has no unique key, so a
duplicate would show) and no prepared transaction of the sink left in
``pg_prepared_xacts``. Each kill test first proves its crash point was reached: the crash
log names it, Spark's offset log holds the batch without a commit entry, and PostgreSQL
shows what the crash left (prepared transactions, a DECIDED or COMMITTED ledger row, the
rows visible so far).

Each test has its own table, ledger tables and sink id (``integration/support/_pg.py``).
``EOS_WIDE_MATRIX=1`` adds more crash points and sources.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyspark
import pytest

from connectors.sdk import CrashPoint
from examples.stream_to_files import make_input_files
from integration.support._driver import (
    REPO,
    SEED,
    DriverRun,
    KillJob,
    a_failed_task_was_retried,
    conf_args,
    event_log_app_ids,
    event_log_conf,
    file_batches,
    kill_at_random,
    reached,
    run_with_a_failing_task,
    spark_batches,
    task_executors,
    two_drivers_until_one_completes,
)
from integration.support._fixtures_services import NativePostgres
from integration.support._pg import (
    DRIVER_PGOPTIONS,
    RECEIPTS_INDEX_BUG,
    PgTarget,
    blocked_by_receipts_index,
    check_restart,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FILES, ROWS_PER_FILE = 4, 600
CRASH_BATCH = 2
WIDE = os.environ.get("EOS_WIDE_MATRIX") == "1"
MODULE = "examples.stream_to_postgres"


class PgJob(KillJob):
    """One streaming job into PostgreSQL: its directories, target and expected output."""

    module = MODULE

    def __init__(
        self, root: Path, target: PgTarget, source: str = "files", files: int = FILES,
        mode: str = "append",
    ) -> None:
        super().__init__(root, sink_id=target.sink_id, cwd=REPO)
        self.target = target
        self.source = source
        self.mode = mode
        self.input = root / "in"
        if source == "files":
            self.total = make_input_files(self.input, files, ROWS_PER_FILE)
        else:
            self.batches, self.rows_per_batch = 4, 500
            self.total = self.batches * self.rows_per_batch

    def args(self) -> list[str]:
        t = self.target
        common = [
            "--checkpoint", str(self.checkpoint), "--table", t.table, "--sink-id", t.sink_id,
            "--ledger-table", t.ledger, "--mode", self.mode,
        ]
        if self.mode == "upsert":
            common += ["--key-columns", "id", "--create-table"]
        if self.source == "files":
            return ["--source", "files", "--input", str(self.input), *common]
        return [
            "--source", "rate", "--batches", str(self.batches),
            "--rows-per-batch", str(self.rows_per_batch), *common,
        ]

    def assert_exact(self) -> None:
        self.target.assert_exact(self.total)
        states = self.target.ledger_states()
        assert states and set(states.values()) == {"COMMITTED"}, states


def _target(conninfo: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[PgTarget]:
    monkeypatch.setenv("EOS_POSTGRES_CONNINFO", conninfo)  # drivers read it
    monkeypatch.setenv("PGOPTIONS", DRIVER_PGOPTIONS)
    target = PgTarget(conninfo, prefix="kill")
    target.create_table()
    yield target
    target.cleanup()


@pytest.fixture
def pg(postgres_conninfo: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[PgTarget]:
    """A fresh events table (no unique key: duplicates would show) and sink names."""
    yield from _target(postgres_conninfo, monkeypatch)


@pytest.fixture
def pg_own(native_postgres: NativePostgres, monkeypatch: pytest.MonkeyPatch
           ) -> Iterator[PgTarget]:
    """As ``pg``, on the PostgreSQL of the module's own that ``native_postgres`` restarts
    (the shared one serves the other tests meanwhile)."""
    yield from _target(native_postgres.conninfo, monkeypatch)


# ------------------------------------------------------------------ driver crash points

DRIVER_POINTS = [
    CrashPoint.BEFORE_DECISION,
    CrashPoint.AFTER_DECISION,
    CrashPoint.BETWEEN_COMMITS,
    CrashPoint.AFTER_COMMIT,
]


def _points(points: list[CrashPoint]) -> list[Any]:
    return [pytest.param(p, id=p.value) for p in points]


def _check_crash_state(pg: PgTarget, point: CrashPoint, batch: int) -> None:
    """PostgreSQL holds what a SIGKILL at ``point`` of ``batch`` leaves, and only that:
    every earlier batch committed (an earlier crash was settled by this run's start)."""
    ledger = pg.ledger_states()
    prepared = {str(t) for t in pg.prepared() if t.batch_id == batch}
    assert all(t.batch_id == batch for t in pg.prepared()), pg.prepared()
    before, count = batch * ROWS_PER_FILE, pg.count()
    assert all(ledger.get(b) == "COMMITTED" for b in range(batch)), ledger
    if point is CrashPoint.BEFORE_DECISION:
        assert prepared and batch not in ledger, (prepared, ledger)
        assert count == before
    elif point is CrashPoint.AFTER_DECISION:
        assert prepared and ledger.get(batch) == "DECIDED", (prepared, ledger)
        assert set(pg.decided_transactions(batch)) == prepared
        assert count == before, "a decided batch became visible before COMMIT PREPARED"
    elif point is CrashPoint.BETWEEN_COMMITS:
        decided = set(pg.decided_transactions(batch))
        assert len(decided) > 1, "between_commits needs a batch of several transactions"
        assert prepared and ledger.get(batch) == "DECIDED", (prepared, ledger)
        assert prepared < decided, "exactly the uncommitted part of the decision is prepared"
        assert before < count < before + ROWS_PER_FILE, count
    else:
        assert not prepared and ledger.get(batch) == "COMMITTED", (prepared, ledger)
        assert count == before + ROWS_PER_FILE


def _killed_at(job: PgJob, pg: PgTarget, point: CrashPoint, batch: int) -> DriverRun:
    """One run SIGKILLed at ``point`` of ``batch``, proved: the point was reached in that
    batch, Spark's offset log holds the batch uncommitted (it will replay it), and
    PostgreSQL holds the state the point stands for."""
    run = job.run(crash=f"{point.value}:batch={batch}")
    assert run.returncode == -9, f"driver was not SIGKILLed at {point.value}:\n{run.tail()}"
    assert job.reached(point, batch), reached(job.crash_log)
    offsets, commits = spark_batches(job.checkpoint)
    assert batch in offsets and batch not in commits, (offsets, commits)
    _check_crash_state(pg, point, batch)
    return run


def _check_outcome(after: DriverRun, point: CrashPoint, batch: int) -> None:
    """The run after a kill at ``point`` reports ``batch`` committed (nothing was decided)
    or replayed (the ledger had it)."""
    replayed = [m for m in after.metrics() if m.get("batch_id") == str(batch)]
    expected = "committed" if point is CrashPoint.BEFORE_DECISION else "replayed"
    assert replayed and replayed[0]["outcome"] == expected, (point, replayed)


#: Every driver crash point in turn, one batch each, in one job: each restart first settles
#: the previous crash (commits the decided, rolls back the undecided), then dies at the next.
DRIVER_CHAIN = [(p, b) for b, p in enumerate(DRIVER_POINTS, start=1)]


def test_driver_sigkilled_at_every_crash_point_in_turn_then_exact(
    tmp_path: Path, pg: PgTarget
) -> None:
    """One job, five driver runs: SIGKILLed at before_decision of batch 1, after_decision
    of 2, between_commits of 3, after_commit of 4, then a run to the end. After each kill:
    the point was reached in that batch, Spark's offset log holds the batch uncommitted, and
    PostgreSQL holds that point's state; the run after it reports the batch ``committed``
    (nothing was decided) or ``replayed`` (the ledger had it). The end is exact, nothing
    left prepared. (``EOS_WIDE_MATRIX=1`` also runs each point in a job of its own.)"""
    job = PgJob(tmp_path, pg, files=len(DRIVER_CHAIN) + 2)
    runs = [_killed_at(job, pg, point, batch) for point, batch in DRIVER_CHAIN]
    final = job.run()
    runs.append(final)
    check_restart(final)
    job.assert_exact()
    assert sorted(pg.ledger_states()) == list(range(job.total // ROWS_PER_FILE))
    for (point, batch), after in zip(DRIVER_CHAIN, runs[1:], strict=True):
        _check_outcome(after, point, batch)


@pytest.mark.skipif(not WIDE, reason="EOS_WIDE_MATRIX=1 only (scripts/test --wide): the "
                    "chain above kills every point in one job")
@pytest.mark.parametrize("point", _points(DRIVER_POINTS))
def test_driver_sigkill_at_crash_point_then_restart_is_exact(
    point: CrashPoint, tmp_path: Path, pg: PgTarget
) -> None:
    job = PgJob(tmp_path, pg)
    _killed_at(job, pg, point, CRASH_BATCH)
    second = job.run()
    check_restart(second)
    job.assert_exact()
    assert sorted(pg.ledger_states()) == list(range(FILES))
    _check_outcome(second, point, CRASH_BATCH)


# -------------------------------------------------------------------- task crash points

TASK_POINTS = [CrashPoint.BEFORE_PRECOMMIT, CrashPoint.AFTER_PRECOMMIT]


@pytest.mark.parametrize("point", _points(TASK_POINTS))
def test_task_killed_at_crash_point_then_restart_is_exact(
    point: CrashPoint, tmp_path: Path, pg: PgTarget
) -> None:
    """local[2] never retries: the killed Python worker fails the query, and the sink
    rolls back what the failed batch prepared before the query ends; the restart is
    exact."""
    job = PgJob(tmp_path, pg)
    first = job.run(crash=f"{point.value}:batch={CRASH_BATCH}:partition=0")
    assert first.returncode > 0, f"the query should have failed:\n{first.tail()}"
    assert job.reached(point, CRASH_BATCH, partition=0), reached(job.crash_log)
    offsets, commits = spark_batches(job.checkpoint)
    assert CRASH_BATCH in offsets and CRASH_BATCH not in commits, (offsets, commits)
    assert CRASH_BATCH not in pg.ledger_states()
    assert pg.count() == CRASH_BATCH * ROWS_PER_FILE
    assert pg.prepared() == [], f"the failed batch left prepared: {pg.prepared()}"
    if point is CrashPoint.AFTER_PRECOMMIT:
        assert "rolling back undecided transaction" in first.output, first.tail()
    else:
        # The killed task's open transaction died with its session.
        app = f"connectors-task:{pg.sink_id}"
        assert wait_for(lambda: not pg.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", [app]), 30), (
            "a session of the killed task is still open")
    second = job.run()
    check_restart(second)
    job.assert_exact()


# ---------------------------------------------------------------- random kills, sources


def test_driver_killed_at_random_moments_then_restart_is_exact(
    tmp_path: Path, pg: PgTarget
) -> None:
    job = PgJob(tmp_path, pg, files=10 if WIDE else 6)
    # Each kill a random moment after the driver decided its next batch (one kill in CI's
    # time budget, four with EOS_WIDE_MATRIX=1).
    kill_at_random(job, progress=lambda: len(pg.ledger_states()), runs=4 if WIDE else 1,
                   max_delay=1.5, seed=SEED, check=check_restart)
    job.assert_exact()


RATE_POINTS = [CrashPoint.AFTER_DECISION] + ([CrashPoint.BETWEEN_COMMITS] if WIDE else [])


@pytest.mark.parametrize("point", _points(RATE_POINTS))
def test_rate_micro_batch_source_with_crash_is_exact(
    point: CrashPoint, tmp_path: Path, pg: PgTarget
) -> None:
    job = PgJob(tmp_path, pg, source="rate")
    first = job.run(crash=f"{point.value}:batch=1")
    assert first.returncode == -9, first.tail()
    assert job.reached(point, 1), reached(job.crash_log)
    offsets, commits = spark_batches(job.checkpoint)
    assert 1 in offsets and 1 not in commits
    assert pg.ledger_states().get(1) == "DECIDED"
    assert pg.prepared(), "the decided batch's transactions should still be prepared"
    second = job.run()
    check_restart(second)
    job.assert_exact()
    # The rate source's ids are its values: batch b holds [b*R, (b+1)*R).
    rows = pg.rows("id, name")
    assert all(name == f"rate-{i}" for i, name in rows)


# ------------------------------------------------------------------ Spark task retries


def test_failed_task_is_retried_on_local_n_f_and_only_the_accepted_attempt_commits(
    tmp_path: Path, pg: PgTarget
) -> None:
    """``local[2,3]`` retries a failed task: the dead attempt's prepared transaction is
    rolled back by the sweep, the retry's commits; the event log proves the retry ran."""
    job = PgJob(tmp_path, pg)
    run, attempts = run_with_a_failing_task(job, "after_precommit:batch=1:partition=0")
    assert run.returncode == 0, run.tail()
    assert job.reached(CrashPoint.AFTER_PRECOMMIT, 1, partition=0)
    assert a_failed_task_was_retried(attempts), json.dumps(attempts, indent=1)
    batch1 = [m for m in run.metrics() if m.get("batch_id") == "1"]
    assert batch1 and int(batch1[0]["aborted"]) >= 1, batch1  # the dead attempt's txn
    job.assert_exact()


# ------------------------------------------------------------ PostgreSQL restarted


@pytest.mark.parametrize("where", ["driver-after_decision", "task-before_precommit"])
def test_postgres_restarted_mid_batch_then_job_finishes_exact(
    where: str, tmp_path: Path, pg_own: PgTarget, native_postgres: NativePostgres
) -> None:
    """A fast shutdown of PostgreSQL while a batch is in flight.

    ``driver-after_decision``: the driver stalls between its decision and COMMIT PREPARED;
    PostgreSQL restarts meanwhile (the prepared transactions survive it); the driver's
    connection is dead, the commit is retried with backoff and the same run finishes.
    ``task-before_precommit``: a task stalls with its COPY open; the restart kills its
    session, the task fails with a transient error, and the batch runs again as a new
    driver run in the same query (``outage_timeout``: no restart of the job from outside).
    """
    stall = 20.0
    job = PgJob(tmp_path, pg_own)
    point = CrashPoint.AFTER_DECISION if where.startswith("driver") else CrashPoint.BEFORE_PRECOMMIT
    extra = "" if where.startswith("driver") else ":partition=0"
    spec = f"{point.value}:batch=1{extra}:action=stall:seconds={stall:g}"
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(job.run, crash=spec)
        assert wait_for(lambda: job.reached(point, 1) or future.done(), 600)
        assert job.reached(point, 1), future.result().tail()
        stalled_at = time.monotonic()
        if point is CrashPoint.AFTER_DECISION:
            assert pg_own.ledger_states().get(1) == "DECIDED"
            decided = set(pg_own.decided_transactions(1))
            assert decided and {str(t) for t in pg_own.prepared()} == decided
        native_postgres.restart(mode="fast", downtime=1.0)
        restarted_in = time.monotonic() - stalled_at
        if point is CrashPoint.AFTER_DECISION and restarted_in < stall - 2:
            # Still stalled: the restart kept the prepared transactions of the decision.
            assert {str(t) for t in pg_own.prepared()} == decided
        run = future.result()

    if point is CrashPoint.AFTER_DECISION:
        assert restarted_in < stall, f"PostgreSQL took {restarted_in:.0f} s to restart"
        assert run.returncode == 0, run.tail()
        batch1 = [m for m in run.metrics() if m.get("batch_id") == "1"]
        assert batch1 and batch1[0]["outcome"] == "committed", batch1
        assert int(batch1[0]["retries"]) >= 1, "the commit after the restart was not retried"
    else:
        assert run.returncode == 0, f"the query should ride the restart out:\n{run.tail()}"
        batch1 = [m for m in run.metrics() if m.get("batch_id") == "1"]
        assert batch1 and int(batch1[0]["batch_restarts"]) >= 1, batch1
    job.assert_exact()


# --------------------------------------------------------- two drivers, one checkpoint


def test_two_drivers_on_one_checkpoint_then_restarts_are_exact(
    tmp_path: Path, pg: PgTarget
) -> None:
    """Two drivers start on the same checkpoint at nearly the same time; one may fail
    (FencedError: the other took over the sink; or Spark's checkpoint conflict); both are
    restarted until one completes. Nothing is lost, nothing doubled, nothing prepared."""
    job = PgJob(tmp_path, pg, files=6)

    def known_cause(runs: list[DriverRun]) -> None:
        if any(blocked_by_receipts_index(r.output) for r in runs):
            pytest.fail(RECEIPTS_INDEX_BUG)

    history, runs = two_drivers_until_one_completes(job, after_round=known_cause)
    errors = {
        name for r in runs for name in re.findall(
            r"(FencedError|QueryBindingError|ConcurrentModificationException|"
            r"FileAlreadyExistsException|already exists)", r.output)
    }
    print(f"exit codes per round: {history}; errors seen: {sorted(errors)}")
    job.assert_exact()


# ------------------------------------------------------------------------ local-cluster


@pytest.mark.parametrize(
    "crash",
    [pytest.param(None, id="clean")]
    + ([pytest.param("after_decision:batch=1", id="after_decision")] if WIDE else []),
)
def test_local_cluster_executors_in_their_own_jvms_is_exact(
    crash: str | None, tmp_path: Path, pg: PgTarget
) -> None:
    job = PgJob(tmp_path, pg)
    events = tmp_path / "events"
    args = [
        "--master", "local-cluster[2,1,1024]",
        "--conf", f"spark.executorEnv.PYTHONPATH={REPO}",
        "--conf", "spark.executor.memory=1024m",
        *conf_args(event_log_conf(events)),
    ]
    try:
        if crash:
            first = job.run(*args, crash=crash)
            assert first.returncode == -9, first.tail()
            assert job.reached(CrashPoint.AFTER_DECISION, 1)
        run = job.run(*args)
        check_restart(run)
        executors = task_executors(events)
        assert executors and "driver" not in executors and len(executors) == 2, executors
        job.assert_exact()
    finally:
        # local-cluster executors log under $SPARK_HOME/work/<app id>: remove this test's.
        home = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)
        for app_id in event_log_app_ids(events):
            shutil.rmtree(home / "work" / app_id, ignore_errors=True)


# ----------------------------------------------------------------------------- upsert

KEYS = 100
Rows = dict[str, list[tuple[Any, ...]]]  # input file name -> its rows


def _upsert_files(directory: Path, files: int, rows_per_file: int) -> Rows:
    """Rows whose ids repeat within and across files: id = n % KEYS.

    ``name`` decreases from file to file, so "the later batch wins" and "the greatest row
    wins" give different tables: the check tells the two apart.
    """
    directory.mkdir(parents=True, exist_ok=True)
    rows: Rows = {}
    n = 0
    for f in range(files):
        name = f"part-{f:05d}.json"
        rows[name] = []
        lines = []
        for _ in range(rows_per_file):
            ts = dt.datetime(2026, 1, 1, 0, (n // 60) % 60, n % 60, tzinfo=dt.timezone.utc)
            row = (n % KEYS, f"r{files - f}-{n:06d}", n * 0.25, ts)
            rows[name].append(row)
            lines.append(json.dumps({
                "id": row[0], "name": row[1], "amount": row[2],
                "ts": ts.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }))
            n += 1
        tmp = directory / f".{name}.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(directory / name)
    return rows


def _expected_upsert(rows: Rows, batches: dict[str, int], upto: int) -> list[tuple[Any, ...]]:
    """The table after batches ``0..upto``: per batch the greatest row of each key (the
    sink orders a key's rows by every column and keeps the last), later batches win."""
    table: dict[int, tuple[Any, ...]] = {}
    for name, batch in sorted(batches.items(), key=lambda kv: kv[1]):
        if batch > upto:
            continue
        best: dict[int, tuple[Any, ...]] = {}
        for row in rows[name]:
            if row[0] not in best or row > best[row[0]]:
                best[row[0]] = row
        table.update(best)
    return [table[k] for k in sorted(table)]


UPSERT_POINTS = DRIVER_POINTS if WIDE else [CrashPoint.AFTER_DECISION]


@pytest.mark.parametrize("point", _points(UPSERT_POINTS))
def test_upsert_with_repeated_keys_and_crash_then_restart_is_exact(
    point: CrashPoint, tmp_path: Path, postgres_conninfo: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EOS_POSTGRES_CONNINFO", postgres_conninfo)
    monkeypatch.setenv("PGOPTIONS", DRIVER_PGOPTIONS)
    pg = PgTarget(postgres_conninfo, prefix="upsert")  # the sink creates the table
    try:
        job = PgJob(tmp_path, pg, files=0, mode="upsert")
        rows = _upsert_files(job.input, FILES, ROWS_PER_FILE)
        first = job.run(crash=f"{point.value}:batch={CRASH_BATCH}")
        assert first.returncode == -9, first.tail()
        assert job.reached(point, CRASH_BATCH), reached(job.crash_log)
        offsets, commits = spark_batches(job.checkpoint)
        assert CRASH_BATCH in offsets and CRASH_BATCH not in commits
        keys = pg.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = to_regclass(%s) AND i.indisprimary",
            [pg.table])
        assert keys == [("id",)], "create_table did not make the key columns the primary key"
        batches = file_batches(job.checkpoint)
        state = pg.ledger_states().get(CRASH_BATCH)
        before = _expected_upsert(rows, batches, CRASH_BATCH - 1)
        after = _expected_upsert(rows, batches, CRASH_BATCH)
        if point is CrashPoint.BEFORE_DECISION:
            assert state is None and pg.prepared() and pg.rows() == before
        elif point is CrashPoint.AFTER_DECISION:
            assert state == "DECIDED" and pg.prepared() and pg.rows() == before
        elif point is CrashPoint.BETWEEN_COMMITS:
            # Keys are routed to tasks: each key shows batch 2's row or still batch 1's.
            assert state == "DECIDED" and pg.prepared()
            now = pg.rows()
            assert len(now) == KEYS
            new = [r for r, b, a in zip(now, before, after, strict=True) if r == a != b]
            assert all(r in (b, a) for r, b, a in zip(now, before, after, strict=True))
            assert 0 < len(new) < KEYS, "not a partly committed batch"
        else:
            assert state == "COMMITTED" and not pg.prepared() and pg.rows() == after

        second = job.run()
        check_restart(second)
        batches = file_batches(job.checkpoint)
        assert sorted(batches.values()) == list(range(FILES)), batches
        expected = _expected_upsert(rows, batches, FILES - 1)
        assert len(expected) == KEYS
        actual = pg.rows()
        wrong = [(a, e) for a, e in zip(actual, expected, strict=False) if a != e]
        assert len(actual) == KEYS and not wrong, wrong[:5]
        (n, distinct), = pg.execute(f"SELECT count(*), count(DISTINCT id) FROM {pg.table}")
        assert n == distinct == KEYS
        assert not pg.prepared()
        assert set(pg.ledger_states().values()) == {"COMMITTED"}
    finally:
        pg.cleanup()

