"""Helpers for tests that run real Spark drivers as child processes and kill them.

The harness itself ships: :mod:`connectors.testing.kill` (``run_driver``, ``DriverRun``,
``KillJob``, ``kill_at_each``, ``kill_at_random``, ``point_reached``, ``reached``,
``spark_batches``); these are the repository's own additions (Spark event logs, the CLI,
exactness of id lists).
"""

from __future__ import annotations

import collections
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from connectors.testing import kill
from connectors.testing.kill import (
    DriverRun,
    KillJob,
    finished_batches,
    kill_at_each,
    kill_at_random,
    point_reached,
    reached,
    spark_batches,
)
from integration.support._standalone import conf_args

__all__ = ["REPO", "SEED", "DriverRun", "KillJob", "a_failed_task_was_retried", "conf_args",
           "event_log_app_ids", "event_log_conf", "exact", "file_batches", "finished_batches",
           "kill_at_each",
           "kill_at_random", "point_reached", "reached", "run_cli", "run_driver",
           "run_with_a_failing_task", "spark_batches", "task_attempts", "task_executors",
           "two_drivers_until_one_completes"]

REPO = Path(__file__).resolve().parents[2]
#: The seed of the random-moment kills (``EOS_SEED`` to explore others).
SEED = int(os.environ.get("EOS_SEED", "20261122"))


def file_batches(checkpoint: Path) -> dict[str, int]:
    """File name -> the id of the micro-batch that read it, from the file source's metadata
    log (``sources/0``: each file's source batch) and Spark's offset log (each micro-batch's
    end offset in that log). The two differ after a driver was killed between the source
    logging its next file and the offset log recording the batch: the restart reads that
    file and the next in one micro-batch (:func:`finished_batches`). Files of source batches
    past the offset log keep their source batch id (a batch not planned yet)."""
    by_source: dict[str, int] = {}
    for path in sorted((checkpoint / "sources" / "0").glob("*")):
        if not path.name.split(".")[0].isdigit():
            continue
        for line in path.read_text().splitlines():
            if line.startswith("{"):
                entry = json.loads(line)
                by_source[Path(entry["path"]).name] = int(entry["batchId"])
    ends: list[tuple[int, int]] = []  # (the source's end offset, micro-batch id)
    for path in (checkpoint / "offsets").glob("*"):
        if path.name.isdigit():
            offsets = [ln for ln in path.read_text().splitlines() if ln.startswith("{")]
            if len(offsets) >= 2 and "logOffset" in offsets[1]:
                ends.append((int(json.loads(offsets[1])["logOffset"]), int(path.name)))
    ends.sort()
    return {name: next((batch for end, batch in ends if end >= source), source)
            for name, source in by_source.items()}


def run_driver(
    args: list[str],
    *,
    module: str = "examples.stream_to_files",
    root: Path = REPO,
    **kwargs: Any,
) -> DriverRun:
    """:func:`connectors.testing.kill.run_driver` (the shipped harness) with this
    repository's defaults: ``module`` the file-sink example, run from the repository root
    (``root``: an earlier release's tree for upgrade tests)."""
    return kill.run_driver(args, module=module, root=root, **kwargs)


def event_log_conf(event_log_dir: Path) -> dict[str, str]:
    """Spark settings that write an uncompressed event log into ``event_log_dir``
    (created): what a listener would see, for :func:`task_attempts` and friends."""
    event_log_dir.mkdir(parents=True, exist_ok=True)
    return {"spark.eventLog.enabled": "true", "spark.eventLog.dir": f"file://{event_log_dir}",
            "spark.eventLog.compress": "false"}


def _events(event_log_dir: Path, kind: str) -> Iterator[dict[str, Any]]:
    """Every event of ``kind`` (``SparkListenerTaskEnd``, ...) in an event log directory."""
    for path in event_log_dir.rglob("*"):
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            if f'"{kind}"' in line:
                yield json.loads(line)


def task_attempts(event_log_dir: Path) -> list[dict[str, Any]]:
    """Every task attempt that ended, from Spark's event log (a listener's record)."""
    return [
        {
            "stage": event["Stage ID"],
            "index": event["Task Info"]["Index"],
            "attempt": event["Task Info"]["Attempt"],
            "speculative": event["Task Info"].get("Speculative", False),
            "failed": event["Task Info"].get("Failed", False),
            "killed": event["Task Info"].get("Killed", False),
            "reason": event.get("Task End Reason", {}).get("Reason"),
        }
        for event in _events(event_log_dir, "SparkListenerTaskEnd")
    ]


def run_with_a_failing_task(job: KillJob, crash: str) -> tuple[DriverRun, list[dict[str, Any]]]:
    """One run of ``job`` on ``local[2,3]`` (Spark retries a failed task; ``local[2]``
    would not) whose task exits at ``crash`` (``point:batch=B:partition=P``), once, with
    Spark's event log on. Returns the run and every task attempt the log records, after
    checking that the crash point fired."""
    once = job.root / "crash-once"
    events = conf_args(event_log_conf(job.root / "events"))
    run = job.run("--master", "local[2,3]", *events, crash=f"{crash}:action=exit:once={once}")
    assert once.exists(), f"the task crash point {crash} was never reached:\n{run.tail()}"
    return run, task_attempts(job.root / "events")


def a_failed_task_was_retried(attempts: list[dict[str, Any]]) -> bool:
    """Whether an attempt failed and a later attempt of a task succeeded."""
    return any(a["failed"] for a in attempts) and any(
        a["attempt"] >= 1 and not a["failed"] for a in attempts)


def exact(ids: list[int], expected: range) -> tuple[list[int], list[int]]:
    """(missing, duplicated) ids."""
    counts = collections.Counter(ids)
    missing = [i for i in expected if counts[i] == 0]
    dup = sorted(i for i, c in counts.items() if c > 1)
    return missing, dup


def task_executors(event_log_dir: Path) -> dict[str, int]:
    """Executor id -> number of successful task attempts, from Spark's event log.

    On ``local[N]`` every task runs on executor ``driver``; on ``local-cluster`` and real
    clusters on numbered executors in their own JVMs.
    """
    counts: dict[str, int] = collections.Counter()
    for event in _events(event_log_dir, "SparkListenerTaskEnd"):
        info = event["Task Info"]
        if not info.get("Failed", False) and not info.get("Killed", False):
            counts[str(info.get("Executor ID"))] += 1
    return dict(counts)


def event_log_app_ids(event_log_dir: Path) -> list[str]:
    """Application ids of the runs recorded in an event log directory."""
    return [str(e["App ID"]) for e in _events(event_log_dir, "SparkListenerApplicationStart")
            if e.get("App ID")]


def run_cli(*args: str, timeout: float = 180) -> tuple[int, Any, str]:
    """Run ``python -m connectors ARGS --json``: (exit code, parsed JSON stdout, stderr).

    stdout is parsed alone: client libraries (librdkafka) log to stderr."""
    env = dict(os.environ)
    env.pop("CONNECTORS_CRASH_AT", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "connectors", *args, "--json"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=timeout, check=False)
    out = proc.stdout.strip()
    data = json.loads(out) if out.startswith(("[", "{")) else out
    return proc.returncode, data, proc.stderr


def two_drivers_until_one_completes(
        job: KillJob, *, rounds: int = 4,
        after_round: Callable[[list[DriverRun]], None] | None = None,
) -> tuple[list[list[int]], list[DriverRun]]:
    """Start two drivers of ``job`` on its one checkpoint, the second 0-1 s after the first
    (from ``random.Random(SEED)``), until a round ends with one that completed; each run must
    exit 0 or 1 (fenced, or Spark's checkpoint conflict), never crash. ``after_round`` sees
    each round's runs (to fail early on a known cause). Returns the exit codes per round
    and the last round's runs; checking the output row by row is the caller's."""
    rng = random.Random(SEED)
    history: list[list[int]] = []
    runs: list[DriverRun] = []
    for _ in range(rounds):
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(job.run)
            time.sleep(rng.uniform(0.0, 1.0))
            second = pool.submit(job.run)
            runs = [first.result(), second.result()]
        history.append([r.returncode for r in runs])
        for r in runs:
            assert r.returncode in (0, 1), r.tail()
        if 0 in history[-1]:
            return history, runs
        if after_round is not None:
            after_round(runs)
    raise AssertionError(f"no driver completed in {rounds} rounds: {history}\n"
                         f"{runs[-1].tail() if runs else ''}")
