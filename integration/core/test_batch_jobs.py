"""Batch jobs (``sink(df, run_id)``, no streaming query) SIGKILLed at every driver-side
crash point, each rerun with the same run id in a new process: exact, for each sink.

For each sink one chain of real driver processes (``examples/stream_to_*.py
--batch-run RUN_ID``: the rows of the rate source's batch ``RUN_ID``, ``[N*R, (N+1)*R)``,
as a static DataFrame written once with ``sink(df, N)``):

1. run id 0 is SIGKILLed at the family's first driver-side crash point; its rerun (same
   run id, a new process, a new JVM) at the next one, and so on;
2. a point that the rerun of a run id can no longer reach is met by run id 1 instead,
   after run id 0 was rerun to its end: once a run is decided, its rerun only settles it
   (reconciles, replays), and every driver-side point but ``between_commits`` (met while
   finishing a decided PostgreSQL run) lies on the fresh path only. So every driver-side
   point of ``CRASH_POINTS`` (a point added to the enum is picked up) is killed once:
   :func:`kill_plan`;
3. the last killed run id is rerun to its end, and run id 1 runs (cleanly, unless a point
   was left for it).

Each kill is proved: the driver died by SIGKILL, this run's crash log line names the
point, the sink and the run id (as ``batch=``); the target then holds what that point
stands for, and nothing partial (PostgreSQL: the ledger state, prepared transactions and
visible rows; Kafka: slot markers, the ledger, ``read_committed`` ids, no open
transaction; Delta: the table's commits, the sink's ledger and intents, whole runs
only). Each completed rerun settles the run the way its last kill requires (metrics
``outcome``). At the end, row by row: every row of run ids 0 and 1 exactly once, nothing
prepared or open (``pg_prepared_xacts``; last stable offset == high watermark on the
output, marker and ledger topics), one Delta commit per run id. No Spark checkpoint is
ever written: no streaming query ran.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from connectors.core.states import CRASH_POINTS, Family, Side
from connectors.sdk import CrashPoint
from integration.postgres.test_postgres_kill import pg  # noqa: F401 - the pg fixture
from integration.support import _kafka
from integration.support._delta import intent_batches, ledger_batches, operations, tagged_commits
from integration.support._driver import REPO, DriverRun, KillJob, reached
from integration.support._kafka import (
    KafkaTarget,
    markers,
    target_fixture,
    wait_no_open_transactions,
)
from integration.support._pg import PgTarget, check_restart

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Rows per run id (``--rows-per-batch``), in 2 partitions (so 2 PostgreSQL transactions:
#: ``between_commits`` needs more than one).
ROWS = 200
SLOTS = 2
RUN_IDS = (0, 1)
TOTAL = ROWS * len(RUN_IDS)
UTC = dt.timezone.utc

Plan = list[tuple[CrashPoint, int]]


# ------------------------------------------------------------------------------- plan


def driver_points(family: Family) -> list[CrashPoint]:
    """The family's driver-side crash points, in the order a batch meets them."""
    return [p for p in CRASH_POINTS[family] if p.side is Side.DRIVER]


def decided_at(family: Family, point: CrashPoint) -> bool:
    """Whether a kill at ``point`` leaves the run decided: a point after
    ``before_decision`` (the decision is durable; for Delta the table has the commit)."""
    points = CRASH_POINTS[family]
    return points.index(point) > points.index(CrashPoint.BEFORE_DECISION)


def reached_by_rerun(previous: CrashPoint | None, point: CrashPoint) -> bool:
    """Whether the rerun of a run killed at ``previous`` can meet ``point``. An undecided
    run is written afresh (every point ahead); a decided one is only settled: the one
    driver-side point on that path is ``between_commits``, met while finishing a
    PostgreSQL decision whose transactions are still prepared."""
    if previous is None:
        return True
    if point is CrashPoint.BETWEEN_COMMITS:
        return previous in (CrashPoint.AFTER_DECISION, CrashPoint.BETWEEN_COMMITS)
    return False


def kill_plan(family: Family) -> Plan:
    """``(point, run id)`` for every driver-side point of ``family``, in the order the
    driver runs meet them: run id 0 while its reruns can reach the point, then run id 1."""
    plan: Plan = []
    run_id, previous = 0, None
    for point in driver_points(family):
        if previous is not None and decided_at(family, previous) and not reached_by_rerun(
                previous, point):
            run_id, previous = run_id + 1, None
        plan.append((point, run_id))
        previous = point
    assert plan[-1][1] < len(RUN_IDS), plan
    return plan


def test_kill_plans_cover_every_driver_side_point_and_both_run_ids() -> None:
    for family in Family:
        plan = kill_plan(family)
        assert [p for p, _ in plan] == driver_points(family), plan
        assert [r for _, r in plan] == sorted(r for _, r in plan)
    # The chains of the points the protocol had first (a point added later, such as
    # ``before_tasks`` ahead of the tasks, joins them by itself):
    got = {f: [(p, r) for p, r in kill_plan(f) if p.value != "before_tasks"] for f in Family}
    assert got[Family.PREPARE_IN_TASK] == [
        (CrashPoint.BEFORE_DECISION, 0), (CrashPoint.AFTER_DECISION, 0),
        (CrashPoint.BETWEEN_COMMITS, 0), (CrashPoint.AFTER_COMMIT, 1)]
    assert got[Family.COMMIT_IN_TASK] == [
        (CrashPoint.BEFORE_DECISION, 0), (CrashPoint.AFTER_COMMIT, 0)]
    assert got[Family.COMMIT_ON_DRIVER] == [
        (CrashPoint.BEFORE_DECISION, 0), (CrashPoint.AFTER_DECISION, 0),
        (CrashPoint.AFTER_COMMIT, 1)]


# -------------------------------------------------------------------------- the chain


class BatchJob(KillJob):
    """One example program run as a batch job (``--batch-run``) against one target."""

    def common(self) -> list[str]:
        # --checkpoint is required by the examples and never used by a batch job.
        return ["--source", "rate", "--rows-per-batch", str(ROWS),
                "--checkpoint", str(self.checkpoint)]

    def run_id(self, run_id: int, crash: str | None = None) -> DriverRun:
        run = self.run("--batch-run", str(run_id), crash=crash)
        assert not self.checkpoint.exists(), "a batch job wrote a streaming checkpoint"
        return run


AfterKill = Callable[[CrashPoint, int], None]


def run_chain(job: BatchJob, family: Family, after_kill: AfterKill) -> list[DriverRun]:
    """Run :func:`kill_plan`'s kills, each rerun finishing the previous, then every run id
    to its end; prove each kill and how each completed rerun settled its run id."""
    plan = kill_plan(family)
    runs: list[DriverRun] = []
    last_kill: dict[int, CrashPoint] = {}

    def complete(run_id: int) -> None:
        run = job.run_id(run_id)
        runs.append(run)
        check_restart(run)
        m = run.batch_metrics(job.sink_id, run_id)
        previous = last_kill.get(run_id)
        if previous is None:
            assert m["outcome"] == "committed", m
        elif decided_at(family, previous):
            # The killed run had decided: the rerun settles it, writes nothing new.
            assert m["outcome"] == "replayed", (previous, m)
        else:
            assert m["outcome"] in ("committed", "replayed"), (previous, m)

    done = -1
    for point, run_id in plan:
        for earlier in range(done + 1, run_id):
            complete(earlier)
            done = earlier
        seen = len(reached(job.crash_log))
        run = job.run_id(run_id, crash=f"{point.value}:batch={run_id}:sink={job.sink_id}")
        runs.append(run)
        assert run.returncode == -9, f"not SIGKILLed at {point.value}:\n{run.tail()}"
        new = reached(job.crash_log)[seen:]
        assert len(new) == 1 and new[0].startswith(
            f"{point.value} sink={job.sink_id} batch={run_id} "), new
        assert job.reached(point, run_id), reached(job.crash_log)
        last_kill[run_id] = point
        after_kill(point, run_id)
    for run_id in range(done + 1, len(RUN_IDS)):
        complete(run_id)
    assert len(reached(job.crash_log)) == len(plan), reached(job.crash_log)
    return runs


def rate_row(i: int) -> tuple[int, str, float, dt.datetime]:
    """Row ``i`` as ``rate_as_input_rows`` makes it: the run id's second as ``ts``."""
    return i, f"rate-{i}", i * 0.25, dt.datetime.fromtimestamp(i // ROWS, UTC)


def whole_runs(ids: list[int], upto: int, what: str) -> None:
    """``ids`` are exactly the rows of run ids ``< upto``: no partial run, no duplicate."""
    counts = collections.Counter(ids)
    dup = sorted(i for i, c in counts.items() if c > 1)
    assert not dup, f"{what}: duplicated {dup[:10]} ({len(dup)})"
    assert sorted(counts) == list(range(upto * ROWS)), (
        f"{what}: expected the rows of run ids < {upto}, got {len(counts)} ids "
        f"({min(counts, default=None)}..{max(counts, default=None)})")


# ------------------------------------------------------------------------- PostgreSQL


class PgBatchJob(BatchJob):
    module = "examples.stream_to_postgres"

    def __init__(self, root: Path, target: PgTarget) -> None:
        super().__init__(root, sink_id=target.sink_id, cwd=REPO)
        self.target = target

    def args(self) -> list[str]:
        t = self.target
        return [*self.common(), "--table", t.table, "--sink-id", t.sink_id,
                "--ledger-table", t.ledger]




def test_postgres_batch_job_sigkilled_at_every_driver_point_then_rerun_is_exact(
    tmp_path: Path, pg: PgTarget  # noqa: F811 - the pg fixture
) -> None:
    family = Family.PREPARE_IN_TASK
    job = PgBatchJob(tmp_path, pg)

    def after_kill(point: CrashPoint, run_id: int) -> None:
        ledger = pg.ledger_states()
        assert all(ledger.get(r) == "COMMITTED" for r in range(run_id)), ledger
        prepared = pg.prepared()
        assert all(t.batch_id == run_id for t in prepared), prepared
        mine = {str(t) for t in prepared}
        before, count = run_id * ROWS, pg.count()
        ids = pg.ids()
        if not decided_at(family, point):
            assert run_id not in ledger and count == before, (ledger, count)
            whole_runs(ids, run_id, point.value)
            if point is CrashPoint.BEFORE_DECISION:
                assert len(mine) == SLOTS, mine  # each task's transaction, prepared
        elif point is CrashPoint.AFTER_DECISION:
            assert ledger.get(run_id) == "DECIDED", ledger
            assert mine == set(pg.decided_transactions(run_id)) and len(mine) == SLOTS
            assert count == before, "a decided run became visible before COMMIT PREPARED"
        elif point is CrashPoint.BETWEEN_COMMITS:
            decided = set(pg.decided_transactions(run_id))
            assert ledger.get(run_id) == "DECIDED" and mine and mine < decided, (ledger, mine)
            assert before < count < before + ROWS, count
            assert len(set(ids)) == count and set(ids) <= set(range(before + ROWS))
        else:
            assert ledger.get(run_id) == "COMMITTED" and not mine, (ledger, mine)
            whole_runs(ids, run_id + 1, point.value)

    runs = run_chain(job, family, after_kill)
    pg.assert_exact(TOTAL)  # every id once, nothing of the sink in pg_prepared_xacts
    assert pg.rows() == [rate_row(i) for i in range(TOTAL)], "rows differ from the input"
    assert pg.ledger_states() == dict.fromkeys(RUN_IDS, "COMMITTED")
    bindings = pg.execute(f"SELECT query_id FROM {pg.ledger}_bindings WHERE sink_id = %s",
                          [pg.sink_id])
    assert bindings == [("batch-job",)], bindings
    print(f"{len(runs)} driver runs: {[r.returncode for r in runs]}")


# ------------------------------------------------------------------------------ Kafka


class KafkaBatchJob(BatchJob):
    module = "examples.stream_to_kafka"

    def __init__(self, root: Path, target: KafkaTarget) -> None:
        super().__init__(root, sink_id=target.sink_id, cwd=REPO)
        self.target = target

    def args(self) -> list[str]:
        t = self.target
        return [*self.common(), "--topic", t.topic, "--sink-id", t.sink_id,
                "--bootstrap", t.bootstrap, "--slots", str(SLOTS)]

    def topics(self) -> list[str]:
        """The output topic and the sink's marker and ledger topics that exist by now."""
        t = self.target
        admin = AdminClient({"bootstrap.servers": t.bootstrap})
        existing = set(admin.list_topics(timeout=30).topics)
        return [n for n in (t.topic, t.marker_topic, t.ledger_topic) if n in existing]

    def marked(self, run_id: int) -> set[int]:
        """Slots whose committed markers include ``run_id``."""
        if self.target.marker_topic not in self.topics():
            return set()
        found = markers(self.target.bootstrap, self.target.marker_topic)
        return {slot for slot, ms in found.items() if any(m["batch_id"] == run_id for m in ms)}

    def ledger(self) -> dict[int, str]:
        t = self.target
        if t.ledger_topic not in self.topics():
            return {}
        return _kafka.ledger_batches(t.bootstrap, t.ledger_topic)


kafka = target_fixture("batchjob")


def test_kafka_batch_job_sigkilled_at_every_driver_point_then_rerun_is_exact(
    tmp_path: Path, kafka: KafkaTarget
) -> None:
    family = Family.COMMIT_IN_TASK
    job = KafkaBatchJob(tmp_path, kafka)

    def after_kill(point: CrashPoint, run_id: int) -> None:
        ledger = job.ledger()
        assert all(ledger.get(r) == "COMMITTED" for r in range(run_id)), ledger
        ids = kafka.ids()
        if point is CrashPoint.BEFORE_DECISION:
            # Every slot committed with its marker; the ledger does not know yet.
            assert job.marked(run_id) == set(range(SLOTS)) and run_id not in ledger, ledger
            whole_runs(ids, run_id + 1, point.value)
        elif not decided_at(family, point):  # before the tasks: nothing of the run
            assert not job.marked(run_id) and run_id not in ledger, ledger
            whole_runs(ids, run_id, point.value)
        else:
            assert job.marked(run_id) == set(range(SLOTS)), job.marked(run_id)
            assert ledger.get(run_id) == "COMMITTED", ledger
            whole_runs(ids, run_id + 1, point.value)
        stuck = wait_no_open_transactions(kafka.bootstrap, job.topics())
        assert not stuck, f"open transactions (LSO < HWM) after {point.value}: {stuck}"

    runs = run_chain(job, family, after_kill)
    kafka.assert_exact(TOTAL)  # every id once for read_committed; no open transaction
    stuck = wait_no_open_transactions(kafka.bootstrap, job.topics())
    assert not stuck, f"open transactions (LSO < HWM): {stuck}"
    by_id = {m.json()["id"]: m for m in kafka.messages()}
    for i in range(TOTAL):
        value = by_id[i].json()
        assert by_id[i].key == str(i).encode(), by_id[i]
        assert (value["name"], value["amount"]) == rate_row(i)[1:3], value
    assert job.ledger() == dict.fromkeys(RUN_IDS, "COMMITTED")
    for slot, ms in markers(kafka.bootstrap, kafka.marker_topic).items():
        batches = [m["batch_id"] for m in ms]
        assert len(batches) == len(set(batches)), (slot, batches)  # no slot written twice
    print(f"{len(runs)} driver runs: {[r.returncode for r in runs]}")


# ------------------------------------------------------------------------------ Delta

DELTA_SINK = "batchjob-delta"


class DeltaBatchJob(BatchJob):
    module = "examples.stream_to_delta"

    def __init__(self, root: Path) -> None:
        super().__init__(root, sink_id=DELTA_SINK, cwd=REPO)
        self.table = root / "table"

    def args(self) -> list[str]:
        return [*self.common(), "--path", str(self.table), "--sink-id", DELTA_SINK]


def delta_rows(path: Path) -> list[tuple[Any, ...]]:
    """``(id, name, amount)`` of every row of the Delta table's current version, sorted,
    read without Spark: the commit files' add/remove actions replayed, the live Parquet
    files read with pyarrow (no checkpoint file: these tables have a few commits)."""
    log = path / "_delta_log"
    commits = sorted(p for p in log.glob("*.json") if p.stem.isdigit()) if log.exists() else []
    assert not list(log.glob("*.checkpoint*")), "a checkpoint: read the table with Spark"
    live: dict[str, dict[str, Any]] = {}
    for commit in commits:
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                assert not action["add"].get("deletionVector"), action
                live[action["add"]["path"]] = action["add"]
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    rows: list[tuple[Any, ...]] = []
    for name in live:
        table = pq.read_table(path / urllib.parse.unquote(name), columns=["id", "name", "amount"])
        rows += zip(*(table.column(c).to_pylist() for c in ("id", "name", "amount")),
                    strict=True)
    return sorted(rows)


def test_delta_batch_job_sigkilled_at_every_driver_point_then_rerun_is_exact(
    tmp_path: Path
) -> None:
    family = Family.COMMIT_ON_DRIVER
    job = DeltaBatchJob(tmp_path)
    path = job.table

    def after_kill(point: CrashPoint, run_id: int) -> None:
        ledger = ledger_batches(path, DELTA_SINK)
        tags = tagged_commits(path, DELTA_SINK) if (path / "_delta_log").exists() else {}
        assert all(ledger.get(r) for r in range(run_id)), ledger
        ids = [r[0] for r in delta_rows(path)]
        if not decided_at(family, point):
            assert run_id not in tags and run_id not in ledger, (tags, ledger)
            if point is CrashPoint.BEFORE_DECISION:
                assert run_id not in intent_batches(path, DELTA_SINK), "intent before the point"
            whole_runs(ids, run_id, point.value)
        elif point is CrashPoint.AFTER_DECISION:
            # Delta committed the run (one commit); the ledger does not know yet.
            assert len(tags.get(run_id, [])) == 1 and run_id not in ledger, (tags, ledger)
            assert run_id in intent_batches(path, DELTA_SINK)
            whole_runs(ids, run_id + 1, point.value)
        else:
            assert len(tags.get(run_id, [])) == 1 and ledger.get(run_id) is True, (tags, ledger)
            whole_runs(ids, run_id + 1, point.value)

    runs = run_chain(job, family, after_kill)
    assert delta_rows(path) == [rate_row(i)[:3] for i in range(TOTAL)], "rows differ"
    commits = tagged_commits(path, DELTA_SINK)
    assert sorted(commits) == list(RUN_IDS) and all(len(v) == 1 for v in commits.values()), (
        commits)  # one Delta commit per run id: no partial, no second one
    assert operations(path) == ["WRITE"] * len(RUN_IDS), operations(path)
    assert ledger_batches(path, DELTA_SINK) == dict.fromkeys(RUN_IDS, True)
    assert intent_batches(path, DELTA_SINK) == [], "intents of recorded runs are pruned"
    print(f"{len(runs)} driver runs: {[r.returncode for r in runs]}")
