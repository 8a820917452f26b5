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

Every commit path runs (the driver is ``integration.support._delta``, which forces one):

- ``tag`` (the default, no Delta txn id): every crash point of both sinks, and random kills;
- ``txn_seed`` (``delta_txn_id=True``, the accelerator on auto: it runs unless
  ``CONNECTORS_ACCELERATORS=off``) and ``txn_mismatch`` (``delta_txn_id=True`` with the
  accelerator's digest allow-list made wrong in the driver process: the real digest check
  refuses the classes, the sink warns and Delta reconstructs its state): one kill each where
  the table is ahead of the ledger (three each, at the crash points where the table and
  the ledger disagree, with ``EOS_WIDE_MATRIX=1``).

Each run's output must name the path that ran (the sink logs it once per run).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from connectors.delta._txn_seed import accelerators_off
from connectors.sdk import CrashPoint
from examples.stream_to_files import make_input_files
from integration.support._delta import (
    file_batches,
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
        # One Delta commit per batch for each sink, and nothing else of theirs.
        for path, app in ((self.a, APPEND), (self.b, MERGE)):
            commits = tagged_commits(path, app)
            assert sorted(commits) == list(range(self.batches)), (app, commits)
            assert all(len(v) == 1 for v in commits.values()), (app, commits)
            self.expect_txn(path, app, self.batches - 1)
            assert sorted(ledger_batches(path, app)) == list(range(self.batches))
            assert intent_batches(path, app) == [], "intents of recorded batches are pruned"
            assert all(ledger_batches(path, app).values())
        assert operations(self.a) == ["WRITE"] * self.batches
        # table b: the empty table the sink created, then one MERGE per batch
        assert operations(self.b) == ["WRITE"] + ["MERGE"] * self.batches
        _offsets, commits_log = spark_batches(self.checkpoint)
        assert set(range(self.batches)) <= commits_log


# (point, sink, batch), in the order a restarted driver meets them: each run dies at the
# next one (``once`` files spend each crash), so 6 kills + 1 clean run cover every crash
# point of the family for the append sink and for the MERGE sink.
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


# The txn paths in CI's time budget: one point each where the table is ahead of the ledger
# (the accelerated seed on the MERGE sink; a mismatched digest, which falls back to the
# delta_txn_id path, on the append sink); the short plan for both with EOS_WIDE_MATRIX=1.
WIDE = os.environ.get("EOS_WIDE_MATRIX") == "1"
TXN_SEED_PLAN = SHORT_PLAN if WIDE else SHORT_PLAN[1:2]
MISMATCH_PLAN = SHORT_PLAN if WIDE else SHORT_PLAN[:1]


@pytest.mark.parametrize(("delta_path", "plan"), [
    pytest.param("tag", PLAN if WIDE else CI_PLAN, id="tag-every-point"),
    pytest.param("txn_seed", TXN_SEED_PLAN, id="txn-seed"),
    pytest.param("txn_mismatch", MISMATCH_PLAN, id="txn-digest-mismatch"),
])
def test_sigkill_at_crash_points_of_both_sinks_then_restart_is_exact(
    tmp_path: Path, spark: SparkSession, delta_path: str,
    plan: list[tuple[CrashPoint, str, int]],
) -> None:
    job = DeltaJob(tmp_path, delta_path=delta_path)
    kills = iter(range(len(plan)))

    def after_kill(point: CrashPoint, sink: str, batch: int, run: DriverRun) -> None:
        # The table and the ledger hold what the crash point stands for.
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
                assert fp is not None and fp["rows"] == 150, fp
        i = next(kills)
        if i:  # what the previous kill left was settled the way its crash point requires
            _settled(run, *plan[i - 1])

    runs = kill_at_each(job, plan, after_kill=after_kill)
    _settled(runs[-1], *plan[-1])
    assert len(reached(job.crash_log)) == len(plan)
    job.assert_exact(spark)


def _settled(run: DriverRun, point: CrashPoint, sink: str, batch: int) -> None:
    """The restart after a kill at ``point`` settled that batch the way the point requires."""
    m = run.batch_metrics(sink, batch)
    if point is CrashPoint.BEFORE_DECISION:
        assert m["outcome"] == "committed", m
    elif point is CrashPoint.AFTER_DECISION:
        assert m["outcome"] == "replayed" and m["reconciled"] == "1", m
    else:
        assert m["outcome"] == "replayed" and m["reconciled"] == "0", m


def test_sigkill_at_random_moments_then_restart_is_exact(
    tmp_path: Path, spark: SparkSession
) -> None:
    job = DeltaJob(tmp_path, source="rate", batches=4, rows=150)
    # Each kill a random moment after the driver recorded its next batch.
    # One random kill in CI's time budget (each run is a driver start, ~30 s); two wide.
    kill_at_random(job, progress=lambda: len(ledger_batches(job.a, APPEND)), max_delay=4.0,
                   runs=2 if WIDE else 1, seed=SEED)
    job.assert_exact(spark)
