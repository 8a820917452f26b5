"""The chaos soak's failures (:mod:`benchmarks.chaos`): each finds its victim among the
live processes and strikes once, or says it found none (then the campaign picks again).

- ``driver``: SIGKILL a running job's driver (its whole process group);
- ``executor``: SIGKILL an executor JVM of the standalone cluster;
- ``python_worker``: SIGKILL a Python worker (a ``pyspark.daemon`` child of an executor);
- ``postgres``: restart PostgreSQL in ``immediate`` mode (a crash: sessions cut);
- ``kafka``: SIGKILL the Kafka broker and start it again (same address).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks._chaos_jobs import SinkJob

__all__ = ["KINDS", "Failure", "strike"]

KINDS = ("driver", "executor", "python_worker", "postgres", "kafka")


@dataclass(frozen=True)
class Failure:
    """One failure that happened: when (seconds into the campaign), what, whom."""

    at: float
    kind: str
    victim: str
    took_s: float


def _processes() -> list[tuple[int, int, str]]:
    """(pid, parent pid, command line) of every process."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True,
                         check=True).stdout
    found = []
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3:
            found.append((int(parts[0]), int(parts[1]), parts[2]))
    return found


def _kill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def executors(cluster_root: Path) -> list[int]:
    """Executor JVMs of the cluster under ``cluster_root``."""
    return [pid for pid, _, args in _processes()
            if "CoarseGrainedExecutorBackend" in args and str(cluster_root) in args]


def python_workers(cluster_root: Path) -> list[int]:
    """Forked Python workers (children of a ``pyspark.daemon`` whose parent is an
    executor of the cluster)."""
    procs = _processes()
    jvms = set(executors(cluster_root))
    daemons = {pid for pid, ppid, args in procs if "pyspark.daemon" in args and ppid in jvms}
    return [pid for pid, ppid, _ in procs if ppid in daemons]


def strike(kind: str, rng: random.Random, jobs: list[SinkJob], cluster_root: Path, *,
           restart_postgres: Callable[[float], object],
           restart_kafka: Callable[[float], object]) -> str | None:
    """Cause one failure of ``kind``; its victim's name, or None when there was none."""
    if kind == "driver":
        running = [j for j in jobs if j.proc is not None and j.proc.poll() is None]
        if not running:
            return None
        job = rng.choice(running)
        return f"{job.name} driver" if job.kill() else None
    if kind == "executor":
        pids = executors(cluster_root)
        return f"executor {pid}" if pids and _kill(pid := rng.choice(pids)) else None
    if kind == "python_worker":
        pids = python_workers(cluster_root)
        return f"python worker {pid}" if pids and _kill(pid := rng.choice(pids)) else None
    downtime = rng.uniform(0.0, 5.0)
    if kind == "postgres":
        restart_postgres(downtime)
        return f"PostgreSQL (immediate, {downtime:.1f} s down)"
    if kind == "kafka":
        restart_kafka(downtime)
        return f"Kafka broker (SIGKILL, {downtime:.1f} s down)"
    raise ValueError(kind)

