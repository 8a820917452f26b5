"""Smoke test of the protocol on real Spark: the example file-system sink, killed drivers.

Every test runs real Structured Streaming drivers as child processes, kills them (SIGKILL
at a named crash point, a task killed at one, or at a random moment), restarts them from
the same checkpoint and then checks the output row by row: nothing missing, nothing twice,
nothing prepared left. Each kill first proves its crash point was reached: the crash log
names it, Spark's offset log holds the batch without a commit entry, and the staging area,
the ledger and the committed rows show what the crash left (a prepared transaction, a
half-committed batch, ...).

In CI one job dies at every crash point in turn (the four of the driver, then the two of
a task; ``test_every_crash_point_in_turn_on_the_rate_source_then_exact``);
``EOS_WIDE_MATRIX=1`` (``scripts/test --wide``) also runs each point in a job of its own
on the files source.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import unquote

import pytest

from connectors.sdk import CrashPoint, TransactionId
from examples.fs_sink import read_output
from examples.stream_to_files import make_input_files
from integration.support._driver import (
    REPO,
    SEED,
    DriverRun,
    KillJob,
    a_failed_task_was_retried,
    exact,
    kill_at_random,
    reached,
    run_with_a_failing_task,
    spark_batches,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FILES, ROWS_PER_FILE = 4, 600
CRASH_BATCH = 2
WIDE = os.environ.get("EOS_WIDE_MATRIX") == "1"
WIDE_ONLY = pytest.mark.skipif(
    not WIDE, reason="EOS_WIDE_MATRIX=1 only (scripts/test --wide): "
    "test_every_crash_point_in_turn_on_the_rate_source_then_exact kills every point in one job")


class Job(KillJob):
    """One streaming job's directories and its expected output."""

    module = "examples.stream_to_files"

    def __init__(self, root: Path, source: str = "files", files: int = FILES,
                 batches: int = 4, rows_per_batch: int = 500) -> None:
        super().__init__(root, sink_id="files", cwd=REPO)
        self.source = source
        self.input = root / "in"
        self.out = root / "out"
        if source == "files":
            self.total = make_input_files(self.input, files, ROWS_PER_FILE)
            self.batches, self.rows_per_batch = files, ROWS_PER_FILE
        else:
            self.batches, self.rows_per_batch = batches, rows_per_batch
            self.total = self.batches * self.rows_per_batch

    def args(self) -> list[str]:
        common = ["--out", str(self.out), "--checkpoint", str(self.checkpoint)]
        if self.source == "files":
            return ["--source", "files", "--input", str(self.input), *common]
        return [
            "--source",
            "rate",
            "--batches",
            str(self.batches),
            "--rows-per-batch",
            str(self.rows_per_batch),
            *common,
        ]

    def staged(self, suffix: str) -> list[Path]:
        staging = self.out / "_staging"
        return sorted(staging.glob(f"*{suffix}")) if staging.exists() else []

    def data_files(self) -> list[Path]:
        return sorted((self.out / "data").glob("*.parquet"))

    def txns(self, suffix: str) -> dict[int, int]:
        """batch id -> how many of its transactions are staged with ``suffix``
        (``.prepared``) or committed (``.parquet``: a data file each)."""
        paths = self.staged(suffix) if suffix != ".parquet" else self.data_files()
        counts: dict[int, int] = {}
        for p in paths:
            tid = TransactionId.parse(unquote(p.name[: -len(suffix)]))
            assert tid is not None, p
            counts[tid.batch_id] = counts.get(tid.batch_id, 0) + 1
        return counts

    def committed_rows(self) -> int:
        table = read_output(self.out)
        return 0 if table is None else table.num_rows

    def assert_exact(self) -> None:
        table = read_output(self.out)
        assert table is not None, "nothing was committed"
        column = "id" if self.source == "files" else "value"
        missing, dup = exact(table[column].to_pylist(), range(self.total))
        assert not missing and not dup, f"missing {missing[:10]}, duplicated {dup[:10]}"
        assert table.num_rows == self.total
        assert not self.staged(".prepared"), "a prepared transaction was left behind"


def _ledger_batches(job: Job, sink_id: str = "files") -> dict[int, bool]:
    decisions = job.out / "_ledger" / sink_id / "decisions"
    return {
        int(p.stem): p.with_suffix(".committed").exists() for p in sorted(decisions.glob("*.json"))
    }


DRIVER_POINTS = [
    CrashPoint.BEFORE_DECISION,
    CrashPoint.AFTER_DECISION,
    CrashPoint.BETWEEN_COMMITS,
    CrashPoint.AFTER_COMMIT,
]
TASK_POINTS = [CrashPoint.BEFORE_PRECOMMIT, CrashPoint.AFTER_PRECOMMIT]


def _earlier_batches_committed(job: Job, batch: int) -> dict[int, bool]:
    """The ledger; every batch before ``batch`` recorded committed (an earlier crash was
    settled by this run's start)."""
    ledger = _ledger_batches(job)
    assert all(ledger.get(b) for b in range(batch)), ledger
    return ledger


def _driver_killed_at(job: Job, point: CrashPoint, batch: int) -> DriverRun:
    """One run SIGKILLed at the driver crash point ``point`` of ``batch``, proved: the point
    was reached in that batch, Spark's offset log holds the batch uncommitted (it will replay
    it), and the sink holds the state the point stands for."""
    run = job.run(crash=f"{point.value}:batch={batch}")
    assert run.returncode == -9, f"driver was not SIGKILLed at {point.value}:\n{run.tail()}"
    # The crash point was really reached, in the batch we aimed at ...
    assert job.reached(point, batch), reached(job.crash_log)
    # ... Spark had started the batch and not recorded it, so it will replay it ...
    offsets, commits = spark_batches(job.checkpoint)
    assert batch in offsets and batch not in commits, (offsets, commits)
    # ... and the sink was left in the state that crash point stands for: the batch's
    # transactions prepared or committed (and nothing of another batch left prepared),
    # its rows visible or not, its decision recorded or not.
    ledger = _earlier_batches_committed(job, batch)
    prepared, done = job.txns(".prepared"), job.txns(".parquet")
    assert set(prepared) <= {batch}, prepared
    before, rows = batch * job.rows_per_batch, job.committed_rows()
    if point is CrashPoint.BEFORE_DECISION:
        assert prepared and batch not in ledger, (prepared, ledger)
        assert batch not in done and rows == before, (done, rows)
    elif point is CrashPoint.AFTER_DECISION:
        assert prepared and ledger.get(batch) is False, (prepared, ledger)
        assert batch not in done and rows == before, "a decided batch became visible"
    elif point is CrashPoint.BETWEEN_COMMITS:
        assert prepared and ledger.get(batch) is False, (prepared, ledger)
        assert done.get(batch) == 1, ("not a half-committed batch", done)
        assert before <= rows < before + job.rows_per_batch, rows
    else:
        assert not prepared and ledger.get(batch) is True, (prepared, ledger)
        assert done.get(batch) and rows == before + job.rows_per_batch, (done, rows)
    return run


def _task_killed_at(job: Job, point: CrashPoint, batch: int) -> DriverRun:
    """One run whose task of partition 0 is killed at ``point`` of ``batch``: local[2] never
    retries, so the query fails, and the sink rolls back what the failed batch staged before
    the query ends (proved: nothing staged is left, the batch is neither decided nor
    visible, Spark's offset log holds it uncommitted)."""
    run = job.run(crash=f"{point.value}:batch={batch}:partition=0")
    assert run.returncode > 0, f"the query should have failed:\n{run.tail()}"
    assert job.reached(point, batch, partition=0), reached(job.crash_log)
    offsets, commits = spark_batches(job.checkpoint)
    assert batch in offsets and batch not in commits, (offsets, commits)
    assert not job.staged(".prepared") and not job.staged(".inprogress"), (
        "the failed batch left staged transactions", job.staged(""))
    ledger = _earlier_batches_committed(job, batch)
    assert batch not in ledger, ledger
    assert job.committed_rows() == batch * job.rows_per_batch
    if point is CrashPoint.AFTER_PRECOMMIT:
        assert "rolling back undecided transaction" in run.output, run.tail()
    return run


def _check_outcome(after: DriverRun, point: CrashPoint, batch: int) -> None:
    """The run after a kill at ``point`` reports ``batch`` committed (nothing was decided:
    a driver killed before its decision, a task killed) or replayed (the ledger had it)."""
    m = after.batch_metrics("files", batch)
    expected = "replayed" if point in DRIVER_POINTS[1:] else "committed"
    assert m["outcome"] == expected, (point, m)


#: Every crash point in turn, one batch each, in one job with the rate-micro-batch source:
#: the driver's four (SIGKILL), then a task's two (the query fails).
CHAIN = [(p, b) for b, p in enumerate(DRIVER_POINTS + TASK_POINTS, start=1)]


@pytest.mark.timeout(1800)  # seven driver runs (each bounded by DRIVER_TIMEOUT on its own)
def test_every_crash_point_in_turn_on_the_rate_source_then_exact(tmp_path: Path) -> None:
    """One job on the ``rate-micro-batch`` source, seven runs: SIGKILLed at before_decision
    of batch 1, after_decision of 2, between_commits of 3, after_commit of 4; then a task
    killed at before_precommit of 5 and at after_precommit of 6 (the query fails); then a
    run to the end. Each kill is proved (point reached in that batch, Spark's offset log
    holds the batch uncommitted, the sink holds that point's state); the run after it
    reports the batch ``committed`` (nothing was decided) or ``replayed`` (the ledger had
    it). The end is exact (every value once, nothing prepared) and the ledger holds every
    batch. A restart replays a rate batch with the same values in the same partitions.

    (It replaces one job per point, which run with ``EOS_WIDE_MATRIX=1`` on the files
    source, with the rate source's after_decision test.)"""
    job = Job(tmp_path, source="rate", batches=len(CHAIN) + 1, rows_per_batch=100)
    runs = [
        _driver_killed_at(job, point, batch) if point in DRIVER_POINTS
        else _task_killed_at(job, point, batch)
        for point, batch in CHAIN
    ]
    final = job.run()
    assert final.returncode == 0, final.tail()
    runs.append(final)
    job.assert_exact()
    assert sorted(_ledger_batches(job)) == list(range(job.batches))
    assert all(_ledger_batches(job).values())
    for (point, batch), after in zip(CHAIN, runs[1:], strict=True):
        _check_outcome(after, point, batch)


@WIDE_ONLY
@pytest.mark.parametrize("point", DRIVER_POINTS, ids=lambda p: p.value)
def test_driver_sigkill_at_crash_point_then_restart_is_exact(
    point: CrashPoint, tmp_path: Path
) -> None:
    job = Job(tmp_path)
    _driver_killed_at(job, point, CRASH_BATCH)
    second = job.run()
    assert second.returncode == 0, second.tail()
    job.assert_exact()
    assert sorted(_ledger_batches(job)) == list(range(FILES))
    _check_outcome(second, point, CRASH_BATCH)


@WIDE_ONLY
@pytest.mark.parametrize("point", TASK_POINTS, ids=lambda p: p.value)
def test_task_killed_at_crash_point_then_restart_is_exact(
    point: CrashPoint, tmp_path: Path
) -> None:
    """local[2] never retries: the killed task fails the query, and the sink rolls back
    what the failed batch staged before the query ends; the restart is exact."""
    job = Job(tmp_path)
    _task_killed_at(job, point, CRASH_BATCH)
    second = job.run()
    assert second.returncode == 0, second.tail()
    job.assert_exact()
    _check_outcome(second, point, CRASH_BATCH)


def test_driver_killed_at_random_moments_then_restart_is_exact(tmp_path: Path) -> None:
    job = Job(tmp_path, files=10 if WIDE else 6)
    # Each kill a random moment after the driver decided its next batch (one kill in CI's
    # time budget, four with EOS_WIDE_MATRIX=1).
    kill_at_random(job, progress=lambda: len(_ledger_batches(job)), runs=4 if WIDE else 1,
                   max_delay=1.5, seed=SEED)
    job.assert_exact()


@WIDE_ONLY
def test_rate_micro_batch_source_with_crash_after_decision_is_exact(tmp_path: Path) -> None:
    """(In CI the chain above runs on the rate source and dies at after_decision.)"""
    job = Job(tmp_path, source="rate")
    first = job.run(crash=f"{CrashPoint.AFTER_DECISION.value}:batch=1")
    assert first.returncode == -9, first.tail()
    assert any(line.startswith("after_decision ") for line in reached(job.crash_log))
    second = job.run()
    assert second.returncode == 0, second.tail()
    job.assert_exact()


def test_failed_task_is_retried_on_local_n_f_and_only_the_accepted_attempt_commits(
    tmp_path: Path,
) -> None:
    """``local[2,3]`` retries a failed task (``local[2]`` would not): the killed attempt's
    transaction never commits and the retry's does; the event log proves the retry ran."""
    job = Job(tmp_path)
    run, attempts = run_with_a_failing_task(job, "after_precommit:batch=1:partition=0")
    assert run.returncode == 0, run.tail()
    assert a_failed_task_was_retried(attempts), json.dumps(attempts, indent=1)
    job.assert_exact()


def test_a_killed_first_offset_write_is_named_fixed_by_the_doctor_then_exact(
        tmp_path: Path) -> None:
    """What a driver killed inside Spark's first offset log write leaves: the query's
    ``metadata`` and that write's temporary file, cut short, in ``offsets/``. Spark >= 4.1
    then refuses to start the query; the job's error names ``connectors doctor``, whose
    exact fix (remove only those files) lets the restart deliver every row once.

    The instant is made, not hit: the write lasts microseconds, no crash point of ours is
    inside it, so the first run ends before any batch (an empty input, ``metadata``
    written by Spark) and the temporary file is laid as Spark's CheckpointFileManager
    names it (``.0.<uuid>.tmp``, its checksum ``..0.<uuid>.tmp.crc``).
    """
    import shlex
    import subprocess

    import pyspark

    from connectors.cli._doctor import offset_log_findings, read_checkpoint

    job = Job(tmp_path, files=2)
    held = tmp_path / "held"
    held.mkdir()
    inputs = sorted(job.input.iterdir())
    for f in inputs:  # the first run sees no input: it plans no batch
        f.rename(held / f.name)
    first = job.run()
    assert first.returncode == 0, first.tail()
    assert (job.checkpoint / "metadata").is_file()
    assert spark_batches(job.checkpoint) == (set(), set())
    uuid = "5c7e0b9a-1d2f-4e3a-9b8c-7d6e5f4a3b2c"
    offsets = job.checkpoint / "offsets"
    offsets.mkdir(exist_ok=True)
    (offsets / f".0.{uuid}.tmp").write_text('v1\n{"batchWatermarkMs":0,"batchTimesta')
    (offsets / f"..0.{uuid}.tmp.crc").write_bytes(b"crc\x00")
    for f in inputs:
        (held / f.name).rename(f)

    spark_version = tuple(int(x) for x in pyspark.__version__.split(".")[:2])
    if spark_version >= (4, 1):
        refused = job.run()
        assert refused.returncode != 0
        assert "STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY" in refused.output
        assert "connectors doctor --checkpoint" in refused.output  # the job's error says where
        assert read_output(job.out) is None  # nothing written
    (finding,) = offset_log_findings(read_checkpoint(str(job.checkpoint)))
    assert finding.check == "first-offset-write" and not finding.ok
    fix = finding.detail.split("(rm -- ", 1)[1].split(")", 1)[0]
    removed = shlex.split(fix)
    assert sorted(removed) == sorted(str(p) for p in offsets.glob(".*tmp*"))
    subprocess.run(["rm", "--", *removed], check=True)  # the fix, as the doctor wrote it
    assert offset_log_findings(read_checkpoint(str(job.checkpoint))) == []

    last = job.run()
    assert last.returncode == 0, last.tail()
    job.assert_exact()  # row by row: every id once
    assert spark_batches(job.checkpoint) == ({0, 1}, {0, 1})
    assert not job.staged(".prepared")
