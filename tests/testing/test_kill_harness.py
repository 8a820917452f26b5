"""The shipped real-kill harness (:mod:`connectors.testing.kill`) on real processes.

A tiny driver without Spark (``tests/testing/_tiny_driver.py``: the example file-system
sink, a checkpoint kept the way Spark keeps it) is SIGKILLed at crash points by
``CONNECTORS_CRASH_AT`` and from outside; the harness must prove each kill, refuse a plan
whose point is never reached, and the output must be exact row by row.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from connectors.sdk import CrashPoint
from connectors.testing.kill import (
    KillJob,
    finished_batches,
    kill_at_each,
    kill_at_random,
    point_reached,
    reached,
    run_driver,
    spark_batches,
)
from examples.fs_sink import read_output

REPO = Path(__file__).resolve().parents[2]


class TinyJob(KillJob):
    module = "tests.testing._tiny_driver"
    batches, pause = 3, 0.0

    def args(self) -> list[str]:
        return ["--out", str(self.root / "out"), "--checkpoint", str(self.checkpoint),
                "--batches", str(self.batches), "--rows", "10", "--pause", str(self.pause)]

    def committed_batches(self) -> int:
        commits = self.checkpoint / "commits"
        return len(list(commits.iterdir())) if commits.exists() else 0

    def values(self) -> list[int]:
        table = read_output(self.root / "out")
        return sorted(table["value"].to_pylist()) if table is not None else []


def test_kill_at_each_point_then_restart_is_exact(tmp_path: Path) -> None:
    job = TinyJob(tmp_path, sink_id="tiny", cwd=REPO)
    seen: list[tuple[str, int, list[int]]] = []

    def after_kill(point: CrashPoint, sink: str, batch: int, run: object) -> None:
        seen.append((point.value, batch, job.values()))

    plan = [(CrashPoint.BEFORE_DECISION, "tiny", 0), (CrashPoint.AFTER_DECISION, "tiny", 1),
            (CrashPoint.AFTER_COMMIT, "tiny", 2)]
    runs = kill_at_each(job, plan, after_kill=after_kill)
    assert [r.returncode for r in runs] == [-9, -9, -9, 0]
    # what each kill left: nothing of batch 0; batch 0 only (1 decided, not committed);
    # batches 0-2 (2 committed, not in the checkpoint's commit log)
    assert seen == [("before_decision", 0, []), ("after_decision", 1, list(range(10))),
                    ("after_commit", 2, list(range(30)))]
    assert job.values() == list(range(30))  # row by row: nothing missing, nothing twice
    assert spark_batches(job.checkpoint) == ({0, 1, 2}, {0, 1, 2})
    assert not list((tmp_path / "out" / "_staging").glob("*.prepared"))
    assert job.reached(CrashPoint.AFTER_DECISION, 1)
    assert not job.reached(CrashPoint.AFTER_DECISION, 2)
    assert point_reached(job.crash_log, CrashPoint.AFTER_COMMIT, "tiny", 2)
    assert len(reached(job.crash_log)) == 3
    # what each restart did with the batch the previous run was killed in
    assert runs[1].batch_metrics("tiny", 0)["outcome"] == "committed"  # nothing decided
    assert runs[2].batch_metrics("tiny", 1)["outcome"] == "replayed"  # decided: committed
    assert runs[2].batch_metrics("tiny", 1)["reconciled"] != "0"
    assert runs[3].batch_metrics("tiny", 2)["outcome"] == "replayed"  # already committed
    assert [m["batch_id"] for m in runs[3].metrics("tiny")] == ["2"]
    assert runs[3].metrics("other") == [] and runs[3].metrics(batch=1) == []
    with pytest.raises(AssertionError, match="no metrics line of sink tiny batch 5"):
        runs[3].batch_metrics("tiny", 5)


def test_a_point_never_reached_fails_the_plan(tmp_path: Path) -> None:
    job = TinyJob(tmp_path, sink_id="tiny", cwd=REPO)
    # batch 7 never runs: the driver ends normally, and the harness says so
    with pytest.raises(AssertionError,
                       match="at after_decision of sink tiny batch 7: the driver was not "
                             "SIGKILLed"):
        kill_at_each(job, [(CrashPoint.AFTER_DECISION, "tiny", 7)])


def test_kill_from_outside_when_a_condition_holds(tmp_path: Path) -> None:
    job = TinyJob(tmp_path, sink_id="tiny", cwd=REPO)
    stall = f"{CrashPoint.BEFORE_DECISION.value}:batch=1:action=stall:seconds=60"
    run = job.run(crash=stall, kill_after=0.0,
                  kill_when=lambda: job.reached(CrashPoint.BEFORE_DECISION, 1))
    assert run.returncode == -9 and run.seconds < 50, run.tail()
    assert spark_batches(job.checkpoint) == ({0, 1}, {0})
    final = run_driver(job.args(), module=job.module, root=REPO)
    assert final.returncode == 0, final.tail()
    assert job.values() == list(range(30))


def test_kill_at_random_moments_then_restart_is_exact(tmp_path: Path) -> None:
    job = TinyJob(tmp_path, sink_id="tiny", cwd=REPO)
    job.batches, job.pause = 6, 0.5  # each batch waits 0.5 s inside Spark's "offsets logged"
    runs = kill_at_random(job, progress=job.committed_batches, runs=3, max_delay=0.3, seed=7)
    assert len(runs) == 4 and runs[-1].returncode == 0
    assert sum(r.returncode == -9 for r in runs) >= 1
    assert job.values() == list(range(60))  # row by row: nothing missing, nothing twice
    assert not list((tmp_path / "out" / "_staging").glob("*.prepared"))


def test_kill_at_random_fails_when_no_kill_lands(tmp_path: Path) -> None:
    job = TinyJob(tmp_path, sink_id="tiny", cwd=REPO)
    # a progress count that never grows: no run is killed, nothing was tested, and it says so
    with pytest.raises(AssertionError, match="no run was killed"):
        kill_at_random(job, progress=lambda: 0, runs=1, max_delay=0.0, seed=1)
    assert job.values() == list(range(30))


def test_a_killed_drivers_spark_scratch_is_removed_unless_it_is_the_callers(
        tmp_path: Path) -> None:
    # A SIGKILLed Spark driver leaves its scratch (each jar of spark.jars copied for the
    # local executor): the harness gives each run its own and removes it.
    run = run_driver([], module="tests.testing._scratch_driver", root=REPO)
    assert run.returncode == -9
    scratch = Path(run.output.split("SCRATCH ", 1)[1].split()[0])
    assert scratch.name.startswith("connectors-driver-")
    assert not scratch.exists()
    # A SPARK_LOCAL_DIRS of the caller's is used as given and kept.
    own = tmp_path / "own-scratch"
    own.mkdir()
    run = run_driver([], module="tests.testing._scratch_driver", root=REPO,
                     env={"SPARK_LOCAL_DIRS": str(own)})
    assert run.returncode == -9 and f"SCRATCH {own}" in run.output
    assert (own / "spark-1" / "userFiles-1" / "delta-spark.jar").is_file()


def test_a_command_instead_of_a_module_runs_in_its_own_group_and_is_killed_whole(
    tmp_path: Path,
) -> None:
    """``command=``: a ``spark-submit``-like launcher whose child is the driver; a kill from
    outside takes the whole process group, the child too."""
    child_pid = tmp_path / "child.pid"
    launcher = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(child_pid)!r}, 'w').write(str(child.pid))\n"
        "print('ARGS', sys.argv[1:], flush=True)\n"
        "child.wait()\n"
    )
    run = run_driver(["--a", "1"], command=[sys.executable, "-c", launcher],
                     kill_after=0.2, kill_when=child_pid.exists, timeout=60)
    assert run.returncode == -9
    assert "ARGS ['--a', '1']" in run.output
    pid = int(child_pid.read_text())
    deadline = time.monotonic() + 20
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    status = Path(f"/proc/{pid}/status")
    assert not status.exists() or "zombie" in status.read_text(), "the launcher's child lives"
    with pytest.raises(ValueError, match="exactly one of module and command"):
        run_driver([], module="m", command=["true"])
    with pytest.raises(ValueError, match="exactly one of module and command"):
        run_driver([])


def merged_checkpoint(root: Path) -> Path:
    """A file source's checkpoint as Spark 4.2 wrote it after a driver was killed between the
    source logging file 2 and the offset log recording batch 2 (reproduced with a real query:
    the restart's batch 2 read files 2 and 3): source batches 0-3, micro-batches 0-2."""
    ckpt = root / "ckpt"
    for batch, end in enumerate([0, 1, 3]):
        for log, text in (("offsets", f'v1\n{{"batchWatermarkMs":0}}\n{{"logOffset":{end}}}'),
                          ("commits", 'v1\n{"nextBatchWatermarkMs":0}')):
            (ckpt / log).mkdir(parents=True, exist_ok=True)
            (ckpt / log / str(batch)).write_text(text)
    (ckpt / "sources" / "0").mkdir(parents=True)
    for source in range(4):
        entry = f'{{"path":"file:///in/part-{source:05d}.json","timestamp":1,"batchId":{source}}}'
        (ckpt / "sources" / "0" / str(source)).write_text(f"v1\n{entry}")
    return ckpt


def test_finished_batches_counts_micro_batches_not_files(tmp_path: Path) -> None:
    ckpt = merged_checkpoint(tmp_path)
    assert finished_batches(ckpt) == 3  # four files, three micro-batches
    (ckpt / "offsets" / "3").write_text('v1\n{}\n{"logOffset":4}')
    with pytest.raises(AssertionError, match=r"planned, not committed: \[3\]"):
        finished_batches(ckpt)
