"""What runs in a Spark task: the protocol's task function as a ``mapInArrow`` function.

Each task receives its partition as Arrow record batches (no Python ``Row`` objects: an
order of magnitude faster), runs the protocol's task function and yields one row holding
its pickled :class:`~connectors.core.batch.TaskOutcome` (:func:`outcome_task`). The driver
collects those rows: Spark returns exactly one result per partition, from the attempt it
accepted. :class:`~connectors.core.batch.TaskInfo` comes from Spark's task context, with a
:class:`~connectors.core.batch.TaskBarrier` in a barrier stage.

A reused PySpark worker runs a full ``gc.collect()`` after every task, which scans every
object the worker ever imported (pyspark, pyarrow, psycopg...): 10-15 ms of CPU per task,
right when the driver commits, on two cores. So the first task of a worker calls
:func:`gc.freeze` twice: before it runs, and after it ran (after one collection, so no
garbage is frozen), because that task itself imports and keeps ~29,000 more objects
(modules loaded on first use, kept clients): measured 13-37 ms per collection with the
first freeze only. Frozen, a collection scans only what later tasks create.
The worker is shared with the job's other Python code; ``CONNECTORS_GC_FREEZE=0`` in the
executors' environment (``spark.executorEnv.CONNECTORS_GC_FREEZE=0``; in local mode, the
driver's environment) turns both freezes off (:data:`ENV_GC_FREEZE`).

A Python task used to wait ~40 ms for its first Arrow batch: the JVM writes to its worker
over TCP without ``TCP_NODELAY``, so Nagle's algorithm holds the small message that
starts the data until the worker ACKs what came before, and the worker's kernel delays
that ACK by up to 40 ms (a no-op ``mapInArrow`` over 100 rows: 42 ms from the function's
start to its first batch). Every task therefore first sets ``TCP_QUICKACK`` on its
process's TCP sockets (:func:`_ack_now`, Linux), which sends the pending ACK at once: the
wait fell to ~2 ms and such a job from 139 to 93 ms. (``spark.python.unix.domain.socket
.enabled=true``, a static setting, avoids the TCP socket altogether.)
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import socket
import stat
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from connectors.core.batch import TaskFunction, TaskInfo, TaskOutcome
from connectors.core.fingerprint import fingerprint_batches

__all__ = ["ENV_GC_FREEZE", "ArrowFunction", "gc_freeze_enabled", "outcome_task", "run_in_task"]

logger = logging.getLogger(__name__)

_OUTCOME_SCHEMA = pa.schema([("outcome", pa.binary())])
_FINGERPRINT_SCHEMA = pa.schema([("rows", pa.int64()), ("digest", pa.string())])


@functools.cache
def outcome_type() -> Any:
    """:data:`_OUTCOME_SCHEMA` as Spark's type (a DDL string would be parsed by the JVM on
    every ``mapInArrow``)."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    return StructType([StructField("outcome", BinaryType())])


#: ``0`` (or ``false``/``off``/``no``) in a Python worker's environment: no ``gc.freeze()``.
ENV_GC_FREEZE = "CONNECTORS_GC_FREEZE"


def gc_freeze_enabled() -> bool:
    """Whether the tasks may call :func:`gc.freeze` in this worker (:data:`ENV_GC_FREEZE`)."""
    value = os.environ.get(ENV_GC_FREEZE, "1").strip().lower()
    return value not in ("0", "false", "off", "no")


@functools.cache
def _freeze_gc_once() -> None:
    """Move what this Python worker holds so far out of the garbage collector's scans (see
    the module docstring); once per process: later objects are collected as usual."""
    if gc_freeze_enabled():
        gc.freeze()


@functools.cache
def _freeze_gc_after_first_task() -> None:
    """After a worker's first task: collect once, then freeze what that task loaded and
    kept (see the module docstring)."""
    if gc_freeze_enabled():
        gc.collect()
        gc.freeze()


_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


def _ack_now() -> None:
    """Send the pending TCP ACKs of this process's sockets now (``TCP_QUICKACK``; see the
    module docstring): the JVM's next message to this worker then leaves without waiting
    for the delayed-ACK timer. Best effort, Linux only; ACK timing is all it changes."""
    if _QUICKACK is None:
        return
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        try:
            fd = int(name)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            with socket.socket(fileno=os.dup(fd)) as sock:
                if sock.type == socket.SOCK_STREAM and sock.family in (
                        socket.AF_INET, socket.AF_INET6):
                    sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        except (OSError, ValueError):
            continue


class _SparkBarrier:
    """:class:`~connectors.core.batch.TaskBarrier` of a Spark barrier stage's task."""

    def __init__(self, context: Any) -> None:
        self._context = context  # pyspark.BarrierTaskContext

    def tasks(self) -> int:
        return len(self._context.getTaskInfos())

    def all_gather(self, message: str) -> list[str]:
        return list(self._context.allGather(message))


def _task_info() -> TaskInfo:
    from pyspark import BarrierTaskContext, TaskContext

    ctx = TaskContext.get()
    if ctx is None:  # pragma: no cover - only outside a Spark task
        raise RuntimeError("not running in a Spark task")
    barrier = (_SparkBarrier(BarrierTaskContext.get())
               if isinstance(ctx, BarrierTaskContext) else None)
    return TaskInfo(
        partition=ctx.partitionId(),
        attempt_number=ctx.attemptNumber(),
        task_attempt_id=ctx.taskAttemptId(),
        barrier=barrier,
    )


ArrowFunction = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def run_in_task(fn: TaskFunction, batches: Iterator[pa.RecordBatch]) -> TaskOutcome:
    """Run ``fn`` in this Spark task on its partition's record batches (with the worker's
    ACK and garbage-collector settings of the module docstring)."""
    _ack_now()
    _freeze_gc_once()
    outcome = fn(_task_info(), batches)
    _freeze_gc_after_first_task()
    return outcome


def outcome_task(fn: TaskFunction) -> ArrowFunction:
    """``fn`` as a ``mapInArrow`` function: one row holding its pickled outcome."""

    def spark_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        outcome = run_in_task(fn, batches)
        yield pa.record_batch([pa.array([outcome.to_bytes()], pa.binary())], _OUTCOME_SCHEMA)

    return spark_task


def fingerprint_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` function: the partition's fingerprint as the tasks compute it."""
    _ack_now()
    _freeze_gc_once()
    fp = fingerprint_batches(batches)
    _freeze_gc_after_first_task()
    yield pa.record_batch([pa.array([fp.rows], pa.int64()), pa.array([fp.hex], pa.string())],
                          _FINGERPRINT_SCHEMA)
