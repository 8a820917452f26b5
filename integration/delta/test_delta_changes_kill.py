"""DeltaSink's change streams and overwrite variants with real drivers SIGKILLed at the
COMMIT_ON_DRIVER family's crash points and at a random moment, restarted from the same
checkpoint, in one chained job (``integration.delta._delta_cdc``: four sinks fed by one
``foreachBatch``: the condition form, the function form, ``replace_where``, dynamic
partition overwrite).

Every kill is proved (SIGKILL; the crash log names point, sink and batch; Spark's offset
log has the batch, its commit log not), then what every sink's table and ledger hold of the
batch is checked against the point (the killed sink at its point; the sinks DeltaSinks
committed before it hold the batch committed and recorded, those after it nothing), and
the restart's metrics show each sink's batch settled as its state requires (written
afresh, reconciled from the table, or a replay the ledger recorded). After the last run the
tables are compared row by row with a plain application of the whole input (the last
change of a key winning; a delete deleting), and each sink's Delta log holds exactly one
tagged commit per batch.

CI kills at every crash point of the family once, at after_decision (the table ahead of
the ledger: the restart reconciles from the table) for both change-stream forms and
replace_where, so that between the killed sinks and the ones around them every form is
written afresh, reconciled and replayed after a kill (6 kills, in batches 1 and 2), then
once at random, over five batches (the random kill, up to 3 s after the ledgers' first
record in batch 2, has more than two batches ahead of it): 8 driver starts.
``EOS_WIDE_MATRIX=1`` kills every sink at every point (16 kills). (CI used to kill both
change-stream forms at every point and each overwrite variant once: 10 kills, 12 starts.)
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from connectors.sdk import CrashPoint
from integration.delta._delta_cdc import COLUMNS, SINKS, change, expected_dynamic, expected_merge
from integration.support._delta import intent_batches, ledger_batches, table_rows, tagged_commits
from integration.support._driver import REPO, SEED, DriverRun, KillJob, reached, spark_batches

pytestmark = [pytest.mark.integration, pytest.mark.slow]

R = 60  # rows per batch
COND, FN, REPLACE, DYNAMIC = (SINKS[k] for k in ("cond", "fn", "replace", "dynamic"))
ORDER = [COND, FN, REPLACE, DYNAMIC]  # the order DeltaSinks commits them in each batch
SEED_ROW = (-1, "u", -1, "seed", 0.0, -1)
WIDE = os.environ.get("EOS_WIDE_MATRIX") == "1"


class CdcJob(KillJob):
    module = "integration.delta._delta_cdc"

    def __init__(self, root: Path, batches: int) -> None:
        super().__init__(root, sink_id=COND, cwd=REPO)
        self.tables = root / "tables"
        self.batches = batches

    def args(self) -> list[str]:
        return ["--root", str(self.tables), "--checkpoint", str(self.checkpoint),
                "--batches", str(self.batches), "--rows-per-batch", str(R)]

    def table(self, sink: str) -> Path:
        return self.tables / next(k for k, v in SINKS.items() if v == sink)

    def seed(self, spark: SparkSession) -> None:
        """The replace_where table starts with a row outside ``bucket >= 0``."""
        schema = "id LONG, op STRING, seq LONG, name STRING, amount DOUBLE, bucket LONG"
        spark.createDataFrame([SEED_ROW], schema).write.format("delta").save(
            str(self.table(REPLACE)))

    def progress(self) -> int:
        return sum(len(ledger_batches(self.table(s), s)) for s in ORDER)

    def assert_exact(self, spark: SparkSession) -> None:
        merged = sorted(expected_merge(range(self.batches * R), R).values())
        no_op = [c for c in COLUMNS if c != "op"]
        assert spark.read.format("delta").load(str(self.table(COND))).columns == no_op
        assert table_rows(spark, self.table(COND), no_op) == [
            tuple(v for c, v in zip(COLUMNS, r, strict=True) if c != "op") for r in merged]
        assert table_rows(spark, self.table(FN), COLUMNS) == merged
        last = [change(v, R) for v in range((self.batches - 1) * R, self.batches * R)]
        assert table_rows(spark, self.table(REPLACE), COLUMNS) == sorted([SEED_ROW, *last])
        assert table_rows(spark, self.table(DYNAMIC), COLUMNS) == expected_dynamic(
            self.batches, R)
        for sink in ORDER:
            path = self.table(sink)
            commits = tagged_commits(path, sink)
            assert sorted(commits) == list(range(self.batches)), (sink, commits)
            assert all(len(v) == 1 for v in commits.values()), (sink, commits)
            assert ledger_batches(path, sink) == dict.fromkeys(range(self.batches), True)
            assert intent_batches(path, sink) == [], sink


#: What a sink holds of the killed batch, and how the restart must settle it.
NOTHING, DECIDED, DONE = "nothing", "decided", "done"


def states_at(point: CrashPoint, sink: str) -> dict[str, str]:
    """Every sink's state in the batch killed at ``point`` of ``sink``: DeltaSinks checks
    the batch in every sink (``before_tasks``) before any decision, then each sink commits
    in ``ORDER``: those before ``sink`` have committed and recorded it, those after have
    written nothing."""
    own = {CrashPoint.BEFORE_TASKS: NOTHING, CrashPoint.BEFORE_DECISION: NOTHING,
           CrashPoint.AFTER_DECISION: DECIDED, CrashPoint.AFTER_COMMIT: DONE}[point]
    before = NOTHING if point is CrashPoint.BEFORE_TASKS else DONE
    i = ORDER.index(sink)
    return {s: before if j < i else own if j == i else NOTHING for j, s in enumerate(ORDER)}


def check_point(job: CdcJob, point: CrashPoint, sink: str, batch: int) -> dict[str, str]:
    """What every sink's table and ledger hold right after a kill at ``point`` of ``sink``
    (the killed sink and the others alike, by :func:`states_at`); returns the states."""
    states = states_at(point, sink)
    for other, state in states.items():
        path = job.table(other)
        ledger, tags = ledger_batches(path, other), tagged_commits(path, other)
        intents = intent_batches(path, other)
        where = (point.value, sink, batch, other, state)
        assert all(ledger.get(b) for b in range(batch)), (where, ledger)
        if state == NOTHING:
            assert batch not in tags and batch not in ledger, (where, tags, ledger)
            assert batch not in intents, (where, "an intent before the commit")
        elif state == DECIDED:
            assert len(tags[batch]) == 1 and batch not in ledger, (where, tags, ledger)
            assert batch in intents, where
        else:
            assert len(tags[batch]) == 1 and ledger.get(batch) is True, (where, tags, ledger)
    return states


def check_settled(run: DriverRun, state: str, sink: str, batch: int) -> None:
    """The restart after a kill settled ``sink``'s ``batch`` as its ``state`` requires:
    written afresh (nothing of it written), reconciled from the table (decided: committed,
    not recorded) or a replay the ledger recorded (done)."""
    m = run.batch_metrics(sink, batch)
    if state == NOTHING:
        assert m["outcome"] == "committed", m
    elif state == DECIDED:
        assert m["outcome"] == "replayed" and m["reconciled"] == "1", m
    else:
        assert m["outcome"] == "replayed" and m["reconciled"] == "0", m


def kill_plan_then_random(job: CdcJob, plan: list[tuple[CrashPoint, str, int]]) -> None:
    """SIGKILL at each point of ``plan`` (in the order a restarted driver meets them), then
    once at a random moment after the ledgers' next record, then one clean run."""
    spec = ";".join(f"{p.value}:batch={b}:sink={s}:once={job.root / f'once-{i}'}"
                    for i, (p, s, b) in enumerate(plan))
    # (sink, batch) -> its state at the last kill in that batch, until a run logs that
    # batch's metrics line of that sink (a later kill in the batch replaces the state).
    pending: dict[tuple[str, int], str] = {}

    def settle(run: DriverRun) -> None:
        for (sink, batch), state in list(pending.items()):
            if run.metrics(sink, batch):
                check_settled(run, state, sink, batch)
                del pending[sink, batch]

    runs = []
    for point, sink, batch in plan:
        run = job.run(crash=spec)
        runs.append(run)
        settle(run)
        assert run.returncode == -9, f"not SIGKILLed at {point.value} {sink} {batch}\n" \
            f"{run.tail()}"
        assert job.reached(point, batch, sink_id=sink), reached(job.crash_log)
        offsets, commits = spark_batches(job.checkpoint)
        assert batch in offsets and batch not in commits, (offsets, commits)
        for other, state in check_point(job, point, sink, batch).items():
            pending[other, batch] = state
    before = job.progress()
    delay = random.Random(SEED).uniform(0.0, 3.0)
    run = job.run(crash=spec, kill_after=delay, kill_when=lambda: job.progress() > before)
    settle(run)
    assert run.returncode == -9, f"the random kill ({delay:.1f} s) did not land\n{run.tail()}"
    final = job.run(crash=spec)
    assert final.returncode == 0, final.tail()
    settle(final)
    assert not pending, f"kills never settled: {pending}"
    runs += [run, final]
    print("driver runs (s):", [round(r.seconds, 1) for r in runs])
    assert len(reached(job.crash_log)) >= len(plan)


BT, BD = CrashPoint.BEFORE_TASKS, CrashPoint.BEFORE_DECISION
AD, AC = CrashPoint.AFTER_DECISION, CrashPoint.AFTER_COMMIT
# The CI plan, in the order a restarted driver meets the points: every crash point of the
# family once, and the reconciled path (after_decision: the table ahead of the ledger) of
# both change-stream forms and of replace_where. Each kill also leaves the sinks around the
# killed one in the other states (``states_at``), each checked, and settled by the restart
# as checked: so each form is also written afresh and replayed from the ledger after a
# kill. The kills, with what each leaves [cond, fn, replace, dynamic]:
CI_PLAN = [
    (BT, FN, 1),       # [nothing, nothing, nothing, nothing]
    (BD, FN, 1),       # [done, nothing, nothing, nothing]
    (AD, REPLACE, 1),  # [done, done, decided, nothing]
    (AC, DYNAMIC, 1),  # [done, done, done, done]
    (AD, COND, 2),     # [decided, nothing, nothing, nothing]
    (AD, FN, 2),       # [done, decided, nothing, nothing]
]
# Wide: every sink at every point (the reconciled path passes no after_commit, so that one
# is in the next batch).
WIDE_PLAN = [
    *[(BT, s, 1) for s in ORDER],
    *[(p, s, 1) for s in ORDER for p in (BD, AD)],
    *[(AC, s, 2) for s in ORDER],
]


def test_change_streams_and_overwrites_sigkilled_at_crash_points_and_at_random_are_exact(
    tmp_path: Path, spark: SparkSession
) -> None:
    job = CdcJob(tmp_path, batches=5)
    job.seed(spark)
    plan: list[Any] = WIDE_PLAN if WIDE else CI_PLAN
    kill_plan_then_random(job, plan)
    job.assert_exact(spark)


@pytest.mark.connect_local
def test_the_condition_form_over_spark_connect_is_exact(
    tmp_path: Path, spark: SparkSession
) -> None:
    """Under Spark Connect the sink runs in the server's foreachBatch worker and the
    condition form runs as SQL ``MERGE`` (Delta's ``DeltaTable`` needs a plugin Delta 4.4
    does not publish for Spark 4.2; the function form is refused there, in
    ``test_delta_changes.py``). Two batches; the table is the plain application."""
    job = CdcJob(tmp_path, batches=2)
    run = job.run("--sinks", "cond", "--connect", "--query-name", "cdc")
    assert run.returncode == 0, run.tail()
    merged = sorted(expected_merge(range(2 * R), R).values())
    no_op = [c for c in COLUMNS if c != "op"]
    assert table_rows(spark, job.table(COND), no_op) == [
        tuple(v for c, v in zip(COLUMNS, r, strict=True) if c != "op") for r in merged]
    assert {b: len(v) for b, v in tagged_commits(job.table(COND), COND).items()} == {0: 1, 1: 1}
    assert ledger_batches(job.table(COND), COND) == {0: True, 1: True}
