"""Smoke test of the protocol on real Spark: the example file-system sink, killed drivers.

Every test runs real Structured Streaming drivers as child processes, kills them (SIGKILL
at a named crash point, or at a random moment), restarts them from the same checkpoint
and then checks the output row by row: nothing missing, nothing twice, nothing prepared
left. Each kill test first proves its crash point was reached: the crash log names it,
Spark's offset log holds the batch without a commit entry, and the staging area shows
what the crash left (a prepared transaction, a half-committed batch, ...).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from connectors.sdk import CrashPoint
from examples.fs_sink import read_output
from examples.stream_to_files import make_input_files
from integration.support._driver import (
    REPO,
    SEED,
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


class Job(KillJob):
    """One streaming job's directories and its expected output."""

    module = "examples.stream_to_files"

    def __init__(self, root: Path, source: str = "files", files: int = FILES) -> None:
        super().__init__(root, sink_id="files", cwd=REPO)
        self.source = source
        self.input = root / "in"
        self.out = root / "out"
        if source == "files":
            self.total = make_input_files(self.input, files, ROWS_PER_FILE)
        else:
            self.batches, self.rows_per_batch = 4, 500
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


@pytest.mark.parametrize("point", DRIVER_POINTS, ids=lambda p: p.value)
def test_driver_sigkill_at_crash_point_then_restart_is_exact(point: CrashPoint, tmp_path: Path):
    job = Job(tmp_path)
    first = job.run(crash=f"{point.value}:batch={CRASH_BATCH}")
    assert first.returncode == -9, f"driver was not SIGKILLed:\n{first.tail()}"

    # The crash point was really reached, in the batch we aimed at ...
    assert any(
        line.startswith(f"{point.value} ") and f"batch={CRASH_BATCH}" in line
        for line in reached(job.crash_log)
    ), reached(job.crash_log)
    # ... Spark had started the batch and not recorded it, so it will replay it ...
    offsets, commits = spark_batches(job.checkpoint)
    assert CRASH_BATCH in offsets and CRASH_BATCH not in commits
    # ... and the sink was left in the state that crash point stands for.
    ledger = _ledger_batches(job)
    prepared = job.staged(".prepared")
    if point is CrashPoint.BEFORE_DECISION:
        assert prepared and CRASH_BATCH not in ledger
    elif point is CrashPoint.AFTER_DECISION:
        assert prepared and ledger.get(CRASH_BATCH) is False
    elif point is CrashPoint.BETWEEN_COMMITS:
        assert prepared and ledger.get(CRASH_BATCH) is False
        assert len(job.data_files()) > 0
    else:
        assert not prepared and ledger.get(CRASH_BATCH) is True

    second = job.run()
    assert second.returncode == 0, second.tail()
    job.assert_exact()
    assert sorted(_ledger_batches(job)) == list(range(FILES))


TASK_POINTS = [CrashPoint.BEFORE_PRECOMMIT, CrashPoint.AFTER_PRECOMMIT]


@pytest.mark.parametrize("point", TASK_POINTS, ids=lambda p: p.value)
def test_task_killed_at_crash_point_then_restart_is_exact(point: CrashPoint, tmp_path: Path):
    """local[2] never retries: the killed task fails the query, and the sink rolls back
    what the failed batch staged before the query ends; the restart is exact."""
    job = Job(tmp_path)
    first = job.run(crash=f"{point.value}:batch={CRASH_BATCH}:partition=0")
    assert first.returncode != 0, first.tail()
    assert any(
        line.startswith(f"{point.value} ") and "partition=0" in line
        for line in reached(job.crash_log)
    )
    assert not job.staged(".prepared") and not job.staged(".inprogress"), (
        "the failed batch left staged transactions", job.staged(""))
    if point is CrashPoint.AFTER_PRECOMMIT:
        assert "rolling back undecided transaction" in first.output, first.tail()
    second = job.run()
    assert second.returncode == 0, second.tail()
    job.assert_exact()


def test_driver_killed_at_random_moments_then_restart_is_exact(tmp_path: Path):
    job = Job(tmp_path, files=10 if WIDE else 6)
    # Each kill a random moment after the driver decided its next batch (one kill in CI's
    # time budget, four with EOS_WIDE_MATRIX=1).
    kill_at_random(job, progress=lambda: len(_ledger_batches(job)), runs=4 if WIDE else 1,
                   max_delay=1.5, seed=SEED)
    job.assert_exact()


def test_rate_micro_batch_source_with_crash_after_decision_is_exact(tmp_path: Path):
    job = Job(tmp_path, source="rate")
    first = job.run(crash=f"{CrashPoint.AFTER_DECISION.value}:batch=1")
    assert first.returncode == -9, first.tail()
    assert any(line.startswith("after_decision ") for line in reached(job.crash_log))
    second = job.run()
    assert second.returncode == 0, second.tail()
    job.assert_exact()


def test_failed_task_is_retried_on_local_n_f_and_only_the_accepted_attempt_commits(
    tmp_path: Path,
):
    """``local[2,3]`` retries a failed task (``local[2]`` would not): the killed attempt's
    transaction never commits and the retry's does; the event log proves the retry ran."""
    job = Job(tmp_path)
    run, attempts = run_with_a_failing_task(job, "after_precommit:batch=1:partition=0")
    assert run.returncode == 0, run.tail()
    assert a_failed_task_was_retried(attempts), json.dumps(attempts, indent=1)
    job.assert_exact()

