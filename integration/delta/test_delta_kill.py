"""DeltaSink on real Spark and real Delta: drivers SIGKILLed at every crash point of the
COMMIT_ON_DRIVER family and at random moments, restarted from the same checkpoint.

Each driver (``examples/stream_to_delta.py``) feeds two sinks from one ``foreachBatch``
(``DeltaSinks``): ``events-delta`` appends every row to table ``a``; ``events-merge``
MERGEs on ``key = id % KEY_MOD`` into table ``b`` (several rows per key in every batch, so
the sink's deterministic dedup is needed). Every kill first proves its crash point was
reached (the crash log names point, sink and batch; Spark's offset log holds the batch and
its commit log does not) and that the table and the ledger hold what that point stands for.
After the last restart the tables are compared row by row with the input (``a``: every
input row exactly once; ``b``: per key the row with the greatest id), and the Delta log
shows exactly one commit per batch for each sink (read with the pure-Python log reader,
independent of the sink's own).

Every commit path runs (the driver is ``integration.support._delta``, which forces one),
each test one job whose runs die in turn (one driver start per kill, one to end):

- ``tag`` (the default, no Delta txn id): each crash point of the family once (both sinks
  between them), then a random moment; every point of both sinks and two random moments
  with ``EOS_WIDE_MATRIX=1``;
- ``txn_seed`` (``delta_txn_id=True``, the accelerator on auto: it runs unless
  ``CONNECTORS_ACCELERATORS=off``) and ``txn_mismatch`` (``delta_txn_id=True`` with the
  accelerator's digest allow-list made wrong in the driver process: the real digest check
  refuses the classes, the sink warns and Delta reconstructs its state): one job whose runs
  switch between the two, each path killed once where the table is ahead of the ledger and
  settling one such kill (three kills each, each path alone, with ``EOS_WIDE_MATRIX=1``).

Each run's output must name the path that ran (the sink logs it once per run).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from connectors.delta._txn_seed import accelerators_off
from connectors.sdk import CrashPoint
from examples.stream_to_files import make_input_files
from integration.support._delta import (
    input_rows,
    intent_batches,
    latest_per_key,
    ledger_batches,
    ledger_fingerprint,
    operations,
    rate_rows,
    table_rows,
    tagged_commits,
    txn_version,
)
from integration.support._driver import (
    REPO,
    SEED,
    DriverRun,
    KillJob,
    file_batches,
    finished_batches,
    kill_at_each,
    kill_at_random,
    reached,
    spark_batches,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODULE = "integration.support._delta"
APPEND, MERGE = "events-delta", "events-merge"
KEY_MOD = 40
COLUMNS = ["id", "name", "amount", "unix_micros(ts)"]


class DeltaJob(KillJob):
    """One streaming job into two Delta tables: directories, arguments, expectations."""

    module = MODULE

    def __init__(self, root: Path, source: str = "files", files: int = 4, rows: int = 150,
                 batches: int = 6, delta_path: str = "tag") -> None:
        super().__init__(root, sink_id=APPEND, cwd=REPO)
        self.delta_path = delta_path
        self.txn = delta_path != "tag"
        self.source = source
        self.input = root / "in"
        self.a, self.b = root / "a", root / "b"
        if source == "files":
            self.total = make_input_files(self.input, files, rows)
            self.batches = files
        else:
            self.batches, self.rows_per_batch = batches, rows
            self.total = batches * rows

    def args(self) -> list[str]:
        common = ["--delta-path", self.delta_path,
                  "--checkpoint", str(self.checkpoint), "--path", str(self.a),
                  "--sink-id", APPEND, "--key-mod", str(KEY_MOD),
                  "--merge-path", str(self.b), "--merge-sink-id", MERGE]
        if self.source == "files":
            return ["--source", "files", "--input", str(self.input), *common]
        return ["--source", "rate", "--batches", str(self.batches),
                "--rows-per-batch", str(self.rows_per_batch), *common]

    def run(self, *extra: str, **kwargs: Any) -> DriverRun:
        run = super().run(*extra, **kwargs)
        self.check_path(run)
        return run

    def check_path(self, run: DriverRun) -> None:
        """The run's output names the commit path it took, for both sinks, and no other."""
        out = run.output
        if self.delta_path == "tag":
            want = "Delta commit path tag"
        elif self.delta_path == "txn_seed" and not accelerators_off():
            want = "Delta commit path txn_seed"
        else:
            want = "delta_txn_id=True and no fast path for Delta's txn lookup"
            reason = ("CONNECTORS_ACCELERATORS=off" if accelerators_off() else
                      "SHA-256 differs")
            assert reason in out, run.tail()
        # A sink logs its path at its first commit of the run: a run killed before a sink's
        # first commit has no line of that sink.
        announced = [sink for sink in (APPEND, MERGE)
                     if f"sink {sink}: Delta commit path" in out
                     or f"sink {sink}: delta_txn_id=True and no fast path" in out]
        for sink in announced:
            assert f"sink {sink}: {want}" in out, (sink, want, run.tail())
        others = {"Delta commit path tag", "Delta commit path txn_seed", "no fast path"}
        assert not [o for o in others if o not in want and o in out], run.tail()
        if "outcome=committed" in out:  # some sink committed in this run: it said how
            assert announced, run.tail()

    def expect_txn(self, path: Path, sink: str, batch: int) -> None:
        got = txn_version(path, sink)
        if self.txn:
            assert got == (batch if batch >= 0 else None), (sink, got, batch)
        else:
            assert got is None, f"the tag path wrote a Delta txn id: {got}"

    def expected(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        if self.source == "files":
            rows, files = input_rows(self.total), file_batches(self.checkpoint)
            assert len(files) == self.batches, files
            per_file = self.total // self.batches

            def batch_of(i: int) -> int:
                return files[f"part-{i // per_file:05d}.json"]
        else:
            rows = rate_rows(self.total)

            def batch_of(i: int) -> int:
                return i // self.rows_per_batch
        return rows, latest_per_key(rows, KEY_MOD, batch_of)

    def assert_exact(self, spark: SparkSession) -> None:
        rows, latest = self.expected()
        cols = COLUMNS if self.source == "files" else COLUMNS[:3]
        got_a = table_rows(spark, self.a, cols)
        assert len(got_a) == len(rows), (len(got_a), len(rows))
        assert got_a == rows, "table a differs from the input row by row"
        got_b = table_rows(spark, self.b, [*cols, "key"])
        assert got_b == latest, "table b differs from the latest row per key"
        batches = self.batches
        if self.source == "files":  # a kill can put two files in one micro-batch
            batches = finished_batches(self.checkpoint)
            assert 0 < batches <= self.batches, (batches, self.batches)
        # One Delta commit per batch for each sink, and nothing else of theirs.
        for path, app in ((self.a, APPEND), (self.b, MERGE)):
            commits = tagged_commits(path, app)
            assert sorted(commits) == list(range(batches)), (app, commits)
            assert all(len(v) == 1 for v in commits.values()), (app, commits)
            self.expect_txn(path, app, batches - 1)
            assert sorted(ledger_batches(path, app)) == list(range(batches))
            assert intent_batches(path, app) == [], "intents of recorded batches are pruned"
            assert all(ledger_batches(path, app).values())
        assert operations(self.a) == ["WRITE"] * batches
        # table b: the empty table the sink created, then one MERGE per batch
        assert operations(self.b) == ["WRITE"] + ["MERGE"] * batches


# (point, sink, batch), in the order a restarted driver meets them: each run dies at the
# next one, so 6 kills + 1 clean run cover every crash point of the family for the append
# sink and for the MERGE sink.
PLAN = [
    (CrashPoint.BEFORE_DECISION, APPEND, 1),
    (CrashPoint.AFTER_DECISION, MERGE, 1),
    (CrashPoint.AFTER_COMMIT, APPEND, 2),
    (CrashPoint.BEFORE_DECISION, MERGE, 2),
    (CrashPoint.AFTER_DECISION, APPEND, 3),
    (CrashPoint.AFTER_COMMIT, MERGE, 3),
]
# CI's time budget: the first three (each point of the family once, both sinks); the whole
# plan with EOS_WIDE_MATRIX=1.
CI_PLAN = PLAN[:3]
# The txn paths: the points where the table and the ledger disagree (Delta committed, the
# ledger not yet), for both sinks, and one where both hold the batch.
SHORT_PLAN = [
    (CrashPoint.AFTER_DECISION, APPEND, 1),
    (CrashPoint.AFTER_DECISION, MERGE, 2),
    (CrashPoint.AFTER_COMMIT, APPEND, 3),
]
# The txn paths in CI's time budget, in one job: a txn_seed run killed where the table is
# ahead of the ledger (the append sink), a txn_mismatch run that settles that batch and is
# killed the same way (the MERGE sink), a txn_seed run that settles it and runs to the end.
# Both txn paths die once and restart once, and the job switches between them (what a
# Delta upgrade that changes the classes' digests does to a running job).
TXN_PLAN = SHORT_PLAN[:2]
TXN_RUN_PATHS = ["txn_seed", "txn_mismatch", "txn_seed"]

WIDE = os.environ.get("EOS_WIDE_MATRIX") == "1"
WIDE_ONLY = pytest.mark.skipif(
    not WIDE, reason="EOS_WIDE_MATRIX=1 only (scripts/test --wide): in CI the chains "
    "test_tag_path_*_in_turn_* and test_txn_paths_in_turn_* cover these points and kinds")


def _check_killed(job: DeltaJob, point: CrashPoint, sink: str, batch: int) -> None:
    """The table and the ledger of ``sink`` hold what a kill at ``point`` of ``batch``
    stands for, every earlier batch recorded committed."""
    path = job.a if sink == APPEND else job.b
    ledger, tags = ledger_batches(path, sink), tagged_commits(path, sink)
    assert all(ledger.get(b) for b in range(batch)), ledger
    if point is CrashPoint.BEFORE_DECISION:
        job.expect_txn(path, sink, batch - 1)
        assert batch not in tags and batch not in ledger
        assert batch not in intent_batches(path, sink), "intent before the crash point"
    elif point is CrashPoint.AFTER_DECISION:
        job.expect_txn(path, sink, batch)
        assert len(tags[batch]) == 1
        assert batch not in ledger, "recorded before the crash point"
        if not job.txn:  # the attempt is on record: the restart asks the history
            assert batch in intent_batches(path, sink)
    else:
        job.expect_txn(path, sink, batch)
        assert len(tags[batch]) == 1
        assert ledger.get(batch) is True
        fp = ledger_fingerprint(path, sink, batch)
        if sink == APPEND:  # an append hashes nothing while writing (see committed_fingerprint)
            assert fp is None, fp
        else:
            rows = job.total // job.batches
            assert fp is not None and fp["rows"] == rows, fp


def _settled(run: DriverRun, point: CrashPoint, sink: str, batch: int) -> None:
    """The restart after a kill at ``point`` settled that batch the way the point requires."""
    m = run.batch_metrics(sink, batch)
    if point is CrashPoint.BEFORE_DECISION:
        assert m["outcome"] == "committed", m
    elif point is CrashPoint.AFTER_DECISION:
        assert m["outcome"] == "replayed" and m["reconciled"] == "1", m
    else:
        assert m["outcome"] == "replayed" and m["reconciled"] == "0", m


def _killed_in_turn(
    job: DeltaJob, plan: list[tuple[CrashPoint, str, int]], *,
    paths: list[str] | None = None, random_kills: int = 0,
) -> list[DriverRun]:
    """One run SIGKILLed at each ``(point, sink, batch)`` of ``plan`` in turn (only that
    point armed), each kill proved (SIGKILL; the crash log names point, sink and batch;
    Spark's offset log holds the batch and its commit log does not; the table and the
    ledger hold that point's state); then ``random_kills`` runs SIGKILLed at a random
    moment (from :data:`SEED`) after the MERGE sink recorded a batch (each run's last
    sink: every batch before is settled); then a run to the end. ``paths``: the commit path
    of each run (else the job's). Each run after a planned kill settled that batch the way
    its point requires. Returns every run."""
    rng = random.Random(SEED)
    runs: list[DriverRun] = []

    def next_run(**kwargs: Any) -> DriverRun:
        if paths is not None:
            job.delta_path = paths[len(runs)]
        run = job.run(**kwargs)
        runs.append(run)
        return run

    for point, sink, batch in plan:
        run = next_run(crash=f"{point.value}:batch={batch}:sink={sink}")
        assert run.returncode == -9, (
            f"not SIGKILLed at {point.value} of {sink} batch {batch}:\n{run.tail()}")
        assert job.reached(point, batch, sink_id=sink), reached(job.crash_log)
        offsets, commits = spark_batches(job.checkpoint)
        assert batch in offsets and batch not in commits, (offsets, commits)
        _check_killed(job, point, sink, batch)
    for _ in range(random_kills):
        before = len(ledger_batches(job.b, MERGE))

        def moved(before: int = before) -> bool:
            return len(ledger_batches(job.b, MERGE)) > before

        run = next_run(kill_after=rng.uniform(0.0, 2.0), kill_when=moved)
        assert run.returncode == -9, f"the run ended before its random kill:\n{run.tail()}"
    final = next_run()
    assert final.returncode == 0, final.tail()
    for (point, sink, batch), after in zip(plan, runs[1:], strict=False):
        _settled(after, point, sink, batch)
    assert len(reached(job.crash_log)) == len(plan), reached(job.crash_log)
    return runs


@pytest.mark.timeout(1800)  # five driver runs or more (each bounded by DRIVER_TIMEOUT)
def test_tag_path_sigkilled_at_crash_points_of_both_sinks_in_turn_then_at_random_then_exact(
    tmp_path: Path, spark: SparkSession
) -> None:
    """The tag path (the default), one job on the files source: SIGKILLed at before_decision
    of the append sink's batch 1, after_decision of the MERGE sink's batch 1, after_commit
    of the append sink's batch 2 (each point of the family once, both sinks), then at a
    random moment after the MERGE sink recorded a later batch (while the driver writes the
    next), then a run to the end; exact row by row, one Delta commit per batch and sink.
    ``EOS_WIDE_MATRIX=1``: every point of both sinks (:data:`PLAN`), two random kills."""
    plan = PLAN if WIDE else CI_PLAN
    random_kills = 2 if WIDE else 1
    # Batches after the plan's last: the random kills land while they are written.
    job = DeltaJob(tmp_path, files=plan[-1][2] + 2 + 2 * random_kills)
    _killed_in_turn(job, plan, random_kills=random_kills)
    job.assert_exact(spark)


@pytest.mark.timeout(1800)  # three driver runs (each bounded by DRIVER_TIMEOUT)
def test_txn_paths_in_turn_sigkilled_where_the_table_is_ahead_of_the_ledger_then_exact(
    tmp_path: Path, spark: SparkSession
) -> None:
    """``delta_txn_id=True``, one job whose runs switch paths (:data:`TXN_PLAN`,
    :data:`TXN_RUN_PATHS`): a ``txn_seed`` run (the accelerator) SIGKILLed after the append
    sink's Delta commit of batch 1 and before its ledger record; a ``txn_mismatch`` run (the
    accelerator refused by a wrong digest: Delta's own lookup) that settles it (replayed,
    reconciled from Delta's txn version) and dies the same way on the MERGE sink's batch 2;
    a ``txn_seed`` run that settles that one and writes the last batches. Each run names its
    path; the end is exact with Delta's txn version at the last batch for both sinks.
    ``EOS_WIDE_MATRIX=1`` adds :data:`SHORT_PLAN` on each path alone."""
    job = DeltaJob(tmp_path, files=5, delta_path=TXN_RUN_PATHS[0])
    _killed_in_turn(job, TXN_PLAN, paths=TXN_RUN_PATHS)
    job.assert_exact(spark)


@WIDE_ONLY
@pytest.mark.parametrize("delta_path", ["txn_seed", "txn_mismatch"],
                         ids=["txn-seed", "txn-digest-mismatch"])
def test_sigkill_at_crash_points_of_both_sinks_then_restart_is_exact(
    tmp_path: Path, spark: SparkSession, delta_path: str,
) -> None:
    """Each txn path alone, at every point of :data:`SHORT_PLAN`, with the shipped
    harness's ``kill_at_each``."""
    job = DeltaJob(tmp_path, delta_path=delta_path)
    kills = iter(range(len(SHORT_PLAN)))

    def after_kill(point: CrashPoint, sink: str, batch: int, run: DriverRun) -> None:
        _check_killed(job, point, sink, batch)
        i = next(kills)
        if i:  # what the previous kill left was settled the way its crash point requires
            _settled(run, *SHORT_PLAN[i - 1])

    runs = kill_at_each(job, SHORT_PLAN, after_kill=after_kill)
    _settled(runs[-1], *SHORT_PLAN[-1])
    assert len(reached(job.crash_log)) == len(SHORT_PLAN)
    job.assert_exact(spark)


@WIDE_ONLY
def test_sigkill_at_random_moments_then_restart_is_exact(
    tmp_path: Path, spark: SparkSession
) -> None:
    """The rate source, killed at random moments only (in CI: the tag chain's random kill,
    on the files source; the rate source in test_delta_s3's random kills)."""
    job = DeltaJob(tmp_path, source="rate", batches=4, rows=150)
    # Each kill a random moment after the driver recorded its next batch.
    kill_at_random(job, progress=lambda: len(ledger_batches(job.a, APPEND)), max_delay=4.0,
                   runs=2, seed=SEED)
    job.assert_exact(spark)
