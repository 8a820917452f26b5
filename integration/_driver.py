"""Helpers for tests that run real Spark drivers as child processes and kill them.

The harness itself ships: :mod:`connectors.testing.kill` (``run_driver``, ``DriverRun``,
``KillJob``, ``kill_at_each``, ``point_reached``, ``reached``, ``spark_batches``); these
are the repository's own additions (Spark event logs, the CLI, exactness of id lists).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from connectors.testing import kill
from connectors.testing.kill import (
    DriverRun,
    KillJob,
    kill_at_each,
    point_reached,
    reached,
    spark_batches,
)

__all__ = ["REPO", "DriverRun", "KillJob", "event_log_app_ids", "exact", "kill_at_each",
           "point_reached", "reached", "run_cli", "run_driver", "spark_batches",
           "task_attempts", "task_executors"]

REPO = Path(__file__).resolve().parents[1]


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


def task_attempts(event_log_dir: Path) -> list[dict[str, Any]]:
    """Every task attempt that ended, from Spark's event log (a listener's record)."""
    attempts = []
    for path in event_log_dir.rglob("*"):
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            if '"SparkListenerTaskEnd"' not in line:
                continue
            event = json.loads(line)
            info = event["Task Info"]
            attempts.append(
                {
                    "stage": event["Stage ID"],
                    "index": info["Index"],
                    "attempt": info["Attempt"],
                    "speculative": info.get("Speculative", False),
                    "failed": info.get("Failed", False),
                    "killed": info.get("Killed", False),
                    "reason": event.get("Task End Reason", {}).get("Reason"),
                }
            )
    return attempts


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
    for path in event_log_dir.rglob("*"):
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            if '"SparkListenerTaskEnd"' not in line:
                continue
            info = json.loads(line)["Task Info"]
            if not info.get("Failed", False) and not info.get("Killed", False):
                counts[str(info.get("Executor ID"))] += 1
    return dict(counts)


def event_log_app_ids(event_log_dir: Path) -> list[str]:
    """Application ids of the runs recorded in an event log directory."""
    ids = []
    for path in event_log_dir.rglob("*"):
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            if '"SparkListenerApplicationStart"' in line:
                app_id = json.loads(line).get("App ID")
                if app_id:
                    ids.append(str(app_id))
                break
    return ids


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
