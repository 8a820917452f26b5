"""Crash points: named places in the protocol where a test kills the process.

The template calls :func:`crash_point` at every :class:`~connectors.core.states.CrashPoint`
that applies to its family. Nothing happens unless a crash is armed, either

- in the environment, for real processes (Spark drivers, Python workers), with two
  switches: ``CONNECTORS_TEST_MODE=1`` and the point. ``CONNECTORS_CRASH_AT`` alone arms
  nothing (a stray variable must not SIGKILL a production driver); it logs one WARNING::

      CONNECTORS_TEST_MODE=1
      CONNECTORS_CRASH_AT="after_decision:batch=3"            # SIGKILL the driver at batch 3
      CONNECTORS_CRASH_AT="before_precommit:batch=1:once=/tmp/c1:action=exit"
      CONNECTORS_CRASH_LOG=/tmp/reached.log                   # proof the point was reached

  Entries are separated by ``;``; each is a point name then ``:key=value`` filters and
  options: ``batch`` (batch id), ``sink`` (sink id, exact), ``action`` (``kill`` =
  SIGKILL, the default; ``exit`` = ``os._exit(137)``; ``raise`` = :class:`SimulatedCrash`;
  ``stall`` = sleep ``seconds`` and go on, to make a straggler for speculation tests),
  ``once`` (a file created when the crash fires; while it exists the entry is spent, so a
  restarted driver or a retried task goes on), ``partition`` (task side: only that
  partition).
- or in-process with :func:`arm`, for unit tests (default action ``raise``).

Before acting, the point is recorded (appended and fsynced to ``CONNECTORS_CRASH_LOG``, and
kept in :data:`reached`), so a test can assert that its crash point really was reached.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from connectors.core.states import CrashPoint

__all__ = [
    "ENV_CRASH_AT",
    "ENV_CRASH_LOG",
    "ENV_TEST_MODE",
    "ArmedCrash",
    "SimulatedCrash",
    "arm",
    "armed",
    "crash_point",
    "disarm_all",
    "parse_spec",
    "reached",
    "set_kill_scope_to_group",
]

ENV_CRASH_AT = "CONNECTORS_CRASH_AT"
ENV_CRASH_LOG = "CONNECTORS_CRASH_LOG"
#: The second switch: ``CONNECTORS_CRASH_AT`` arms crash points only when this is ``1``.
ENV_TEST_MODE = "CONNECTORS_TEST_MODE"
_ACTIONS = ("kill", "exit", "raise", "stall")


class SimulatedCrash(BaseException):
    """Raised by an armed crash point with ``action="raise"``.

    A ``BaseException``, so that the template's ``except Exception`` clean-up (aborting
    the task's transaction) does not run: a crashed process cleans nothing up either.
    """


@dataclass(frozen=True)
class ArmedCrash:
    """One armed crash: where, for which sink/batch/partition, and what to do."""

    point: CrashPoint
    batch_id: int | None = None
    sink_id: str | None = None
    partition: int | None = None
    action: str = "kill"
    once: str | None = None
    seconds: float = 0.0

    def matches(
        self, point: CrashPoint, sink_id: str, batch_id: int, partition: int | None
    ) -> bool:
        return (
            self.point is point
            and (self.batch_id is None or self.batch_id == batch_id)
            and (self.sink_id is None or self.sink_id == sink_id)
            and (self.partition is None or self.partition == partition)
        )


logger = logging.getLogger(__name__)
_lock = threading.Lock()
#: Whether the WARNING about an unarmed ``CONNECTORS_CRASH_AT`` was logged (once a process).
_warned: set[str] = set()
_armed: list[ArmedCrash] = []
_fired: set[ArmedCrash] = set()
#: Whether a ``kill`` takes this process's whole group (see :func:`set_kill_scope_to_group`).
_scope = {"group": False}


def set_kill_scope_to_group() -> None:
    """From now on a ``kill`` in this process SIGKILLs the driver too: this process does a
    driver's work for it (the DataSource form's commit worker, which the driver's JVM
    starts), so a crash here is the driver's crash, JVM and Python together. The driver is
    the leading process group of this process's session (a test harness starts the driver
    in a session of its own; PySpark's worker daemon makes a group of its own in it)."""
    _scope["group"] = True


#: Every crash point reached in this process, as ``(point, sink_id, batch_id)``.
reached: list[tuple[CrashPoint, str, int]] = []


def parse_spec(spec: str) -> list[ArmedCrash]:
    """Parse a ``CONNECTORS_CRASH_AT`` value; raise ``ValueError`` naming a bad part."""
    crashes = []
    for entry in filter(None, (e.strip() for e in spec.split(";"))):
        name, *options = entry.split(":")
        try:
            point = CrashPoint(name.strip())
        except ValueError:
            names = ", ".join(p.value for p in CrashPoint)
            msg = f"unknown crash point {name!r} in {ENV_CRASH_AT}; one of {names}"
            raise ValueError(msg) from None
        kwargs: dict[str, str] = {}
        for option in options:
            key, eq, value = option.partition("=")
            if not eq or key not in ("batch", "sink", "partition", "action", "once", "seconds"):
                raise ValueError(f"bad option {option!r} in {ENV_CRASH_AT} entry {entry!r}")
            kwargs[key] = value
        action = kwargs.get("action", "kill")
        if action not in _ACTIONS:
            raise ValueError(f"bad action {action!r} in {ENV_CRASH_AT}; one of {_ACTIONS}")
        crashes.append(
            ArmedCrash(
                point,
                batch_id=int(kwargs["batch"]) if "batch" in kwargs else None,
                sink_id=kwargs.get("sink"),
                partition=int(kwargs["partition"]) if "partition" in kwargs else None,
                action=action,
                once=kwargs.get("once"),
                seconds=float(kwargs.get("seconds", "0")),
            )
        )
    return crashes


def arm(
    point: CrashPoint,
    *,
    batch_id: int | None = None,
    sink_id: str | None = None,
    partition: int | None = None,
    action: str = "raise",
) -> ArmedCrash:
    """Arm a crash in this process; it fires once. Returns the handle."""
    if action not in _ACTIONS:
        raise ValueError(f"action must be one of {_ACTIONS}")
    crash = ArmedCrash(point, batch_id, sink_id, partition, action)
    with _lock:
        _armed.append(crash)
    return crash


def disarm_all() -> None:
    """Forget every in-process crash and the :data:`reached` record."""
    with _lock:
        _armed.clear()
        _fired.clear()
        reached.clear()


@contextlib.contextmanager
def armed(point: CrashPoint, **kwargs: object) -> Iterator[ArmedCrash]:
    """Context manager around :func:`arm` that disarms at exit."""
    crash = arm(point, **kwargs)  # type: ignore[arg-type]
    try:
        yield crash
    finally:
        with _lock:
            if crash in _armed:
                _armed.remove(crash)


def _record(point: CrashPoint, sink_id: str, batch_id: int, partition: int | None) -> None:
    reached.append((point, sink_id, batch_id))
    path = os.environ.get(ENV_CRASH_LOG)
    if path:
        line = f"{point.value} sink={sink_id} batch={batch_id} partition={partition} "
        line += f"pid={os.getpid()}\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)


def _claim_once(path: str) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    os.fsync(fd)
    os.close(fd)
    return True


def test_mode() -> bool:
    """Whether ``CONNECTORS_TEST_MODE=1``: the switch that lets ``CONNECTORS_CRASH_AT`` arm."""
    return os.environ.get(ENV_TEST_MODE, "").strip() == "1"


def _env_spec() -> str | None:
    """``CONNECTORS_CRASH_AT`` when test mode is on; else ``None`` (warned about once)."""
    spec = os.environ.get(ENV_CRASH_AT)
    if not spec or test_mode():
        return spec or None
    if ENV_CRASH_AT not in _warned:
        _warned.add(ENV_CRASH_AT)
        logger.warning("%s is set but %s is not 1: crash points stay disarmed (a test harness "
                       "sets both)", ENV_CRASH_AT, ENV_TEST_MODE)
    return None


def crash_point(
    point: CrashPoint, *, sink_id: str, batch_id: int, partition: int | None = None
) -> None:
    """Kill (or pretend to kill) the process here if a matching crash is armed."""
    spec = _env_spec()
    with _lock:
        candidates = [c for c in _armed if c not in _fired]
    if spec:
        candidates += parse_spec(spec)
    for crash in candidates:
        if not crash.matches(point, sink_id, batch_id, partition):
            continue
        if crash.once is not None and not _claim_once(crash.once):
            continue
        with _lock:
            if crash in _fired:
                continue
            _fired.add(crash)
        _record(point, sink_id, batch_id, partition)
        if crash.action == "stall":
            time.sleep(crash.seconds)
            return
        if crash.action == "raise":
            raise SimulatedCrash(f"crash point {point.value} (sink {sink_id}, batch {batch_id})")
        if crash.action == "exit":
            os._exit(137)
        if _scope["group"]:
            os.killpg(os.getsid(0), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
