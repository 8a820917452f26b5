"""Helpers for tests that run real Spark drivers as child processes and kill them."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DRIVER_TIMEOUT = 300  # one driver run; a hung Spark job fails the test, not CI


@dataclass
class DriverRun:
    returncode: int
    output: str
    seconds: float

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.output.splitlines()[-n:])


def run_driver(
    args: list[str],
    *,
    crash: str | None = None,
    crash_log: Path | None = None,
    kill_after: float | None = None,
    kill_when: Callable[[], bool] | None = None,
    timeout: float = DRIVER_TIMEOUT,
    module: str = "examples.stream_to_files",
    root: Path = REPO,
) -> DriverRun:
    """Run a driver program; ``crash`` arms ``CONNECTORS_CRASH_AT`` in it (and its tasks).

    ``kill_after`` SIGKILLs the driver from outside that many seconds after it started
    (or, with ``kill_when``, after ``kill_when()`` first returned true), unless it ended
    before: a random moment of the protocol. ``root``: the tree the program and its
    ``connectors`` come from (default this one; an earlier release's for upgrade tests).
    """
    env = dict(os.environ)
    env.pop("CONNECTORS_CRASH_AT", None)
    if crash:
        env["CONNECTORS_CRASH_AT"] = crash
        env["CONNECTORS_TEST_MODE"] = "1"
    if crash_log is not None:
        env["CONNECTORS_CRASH_LOG"] = str(crash_log)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        if kill_after is not None:
            if kill_when is not None:
                while proc.poll() is None and not kill_when():
                    if time.monotonic() - start > timeout:
                        break
                    time.sleep(0.05)
            try:
                out, _ = proc.communicate(timeout=kill_after)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                out, _ = proc.communicate(timeout=timeout)
        else:
            out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"driver did not finish in {timeout} s:\n{out[-5000:]}") from None
    finally:
        _reap_group(proc.pid)
    return DriverRun(proc.returncode, out, time.monotonic() - start)


def _reap_group(pgid: int) -> None:
    """Kill what the driver left (its JVM notices the dead driver, but do not wait on it)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.25)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def reached(crash_log: Path) -> list[str]:
    """Lines of the crash log: one per crash point reached."""
    return crash_log.read_text().splitlines() if crash_log.exists() else []


def point_reached(crash_log: Path, point: Any, sink_id: str, batch: int | None = None,
                  **fields: Any) -> bool:
    """Whether the crash log has ``point`` for ``sink_id`` (and ``batch``, and every other
    ``field=value`` given): lines read ``<point> sink=<id> batch=<n> <field>=<value>...``."""
    want = {"sink": sink_id, **{k: str(v) for k, v in fields.items()}}
    if batch is not None:
        want["batch"] = str(batch)
    for line in reached(crash_log):
        if line.startswith(f"{point.value} "):
            # (a line being appended while a kill_when predicate polls may be partial)
            words = dict(w.split("=", 1) for w in line.split()[1:] if "=" in w)
            if all(words.get(k) == v for k, v in want.items()):
                return True
    return False


def spark_batches(checkpoint: Path) -> tuple[set[int], set[int]]:
    """Batch ids in Spark's offset log and commit log."""

    def ids(d: Path) -> set[int]:
        return {int(p.name) for p in d.glob("*") if p.name.isdigit()} if d.exists() else set()

    return ids(checkpoint / "offsets"), ids(checkpoint / "commits")


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
