"""``LocalBatch``: run a sink's tasks in-process, with simulated retries and speculation.

Spark never retries a task in ``local[N]`` mode and never speculates in local mode; this
engine does both on demand, so that the protocol's handling of extra attempts is tested
in milliseconds. (The integration tests prove the same on real Spark, ``local[N,F]``.)
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from connectors.core.batch import BatchInput, TaskFunction, TaskInfo, TaskOutcome
from connectors.core.errors import ConnectorError, TransientError
from connectors.core.fingerprint import Fingerprint, fingerprint_batches

__all__ = ["Attempt", "LocalBatch", "SimulatedTaskFailure"]

logger = logging.getLogger(__name__)


class SimulatedTaskFailure(TransientError):
    """Raised inside a task's input by :class:`LocalBatch` to fail an attempt mid-write."""


@dataclass(frozen=True)
class Attempt:
    """One task attempt that ran: which partition, which attempt, and how it ended."""

    partition: int
    attempt_number: int
    task_attempt_id: int
    kind: str  # "failed", "accepted" or "speculative"


_next_task_attempt_id = 0


def _new_task_attempt_id() -> int:
    global _next_task_attempt_id  # noqa: PLW0603 - process-wide like Spark's counter
    _next_task_attempt_id += 1
    return _next_task_attempt_id


class LocalBatch(BatchInput):
    """A batch of rows split into partitions, run as in-process "tasks".

    Args:
        data: a table, or a list of partitions (each a list of record batches).
        partitions: with a table, how many partitions to split it into (round robin).
        fail_first_attempt: partitions whose first attempt fails mid-write (then retried).
        speculate: partitions that get a second, speculative attempt after the accepted
            one; its outcome is discarded, as Spark discards the slower attempt's (its
            failure with a library error too: the task succeeded already).
        max_failures: attempts per partition before the "job" fails (like
            ``spark.task.maxFailures``).

    ``run_tasks(fn, barrier=True)`` runs a barrier stage as Spark does: every task at once
    (a thread each) with a real :class:`~connectors.core.batch.TaskBarrier`; a failed task
    fails the stage attempt (the others' ``all_gather`` raises ``BrokenBarrierError``) and
    the whole stage runs again.
        spark: a SparkSession, for a sink that writes the batch's DataFrame itself (a
            driver-commit sink such as DeltaSink): :attr:`spark_df` is then the same rows
            as a DataFrame of that session (tasks still run in-process).

    Example::

        from connectors.testing import InMemoryPreparedSink, InMemoryTarget

        sink = InMemoryPreparedSink(InMemoryTarget(), sink_id="mem")
        batch = LocalBatch(pa.table({"x": [1, 2, 3]}), partitions=2, speculate={0})
        sink.write_batch(batch, batch_id=0)
    """

    def __init__(
        self,
        data: pa.Table | Sequence[Sequence[pa.RecordBatch]],
        *,
        partitions: int = 2,
        fail_first_attempt: Sequence[int] = (),
        speculate: Sequence[int] = (),
        max_failures: int = 4,
        spark: Any = None,
    ) -> None:
        if isinstance(data, pa.Table):
            self._schema = data.schema
            rows = data.to_pylist()
            parts: list[list[pa.RecordBatch]] = []
            for p in range(partitions):
                chunk = rows[p::partitions]
                parts.append([pa.RecordBatch.from_pylist(chunk, schema=data.schema)])
            self._partitions = parts
        else:
            self._partitions = [list(p) for p in data]
            first = next((b for p in self._partitions for b in p), None)
            if first is None:
                raise ValueError("give a table, or partitions holding at least one batch")
            self._schema = first.schema
        self.fail_first_attempt = set(fail_first_attempt)
        self.speculate = set(speculate)
        self.max_failures = max_failures
        self.spark = spark
        self._frame: Any = None
        self._files: tempfile.TemporaryDirectory[str] | None = None  # pyspark 3.5's frame
        #: Every attempt that ran, in order (what a Spark listener would have seen).
        self.attempts: list[Attempt] = []

    @property
    def spark_df(self) -> Any:
        """The rows as a DataFrame of :attr:`spark` (``None`` without a session)."""
        if self.spark is None:
            return None
        if self._frame is None:
            table = self.to_arrow()
            try:
                self._frame = self.spark.createDataFrame(table)
            except TypeError:  # pyspark 3.5 takes no Arrow table: a Parquet file keeps types
                self._files = tempfile.TemporaryDirectory(prefix="connectors-local-")
                path = os.path.join(self._files.name, "rows.parquet")
                pq.write_table(table, path)
                self._frame = self.spark.read.parquet(path)
        return self._frame

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def estimated_partitions(self) -> int:
        return len(self._partitions)

    def _input(self, partition: int, fail: bool) -> Iterator[pa.RecordBatch]:
        for i, batch in enumerate(self._partitions[partition]):
            if fail and i == len(self._partitions[partition]) - 1:
                yield batch.slice(0, batch.num_rows // 2)
                raise SimulatedTaskFailure(f"simulated failure of a task of partition {partition}")
            yield batch
        if fail and not self._partitions[partition]:
            raise SimulatedTaskFailure(f"simulated failure of a task of partition {partition}")

    def run_tasks(self, fn: TaskFunction, *, barrier: bool = False) -> list[TaskOutcome]:
        if barrier:
            return self._run_barrier_stage(fn)
        outcomes = []
        for p in range(len(self._partitions)):
            attempt = 0
            while True:
                info = TaskInfo(p, attempt, _new_task_attempt_id())
                fail = attempt == 0 and p in self.fail_first_attempt
                try:
                    outcome = fn(info, self._input(p, fail))
                except SimulatedTaskFailure:
                    self.attempts.append(Attempt(p, attempt, info.task_attempt_id, "failed"))
                    attempt += 1
                    if attempt >= self.max_failures:
                        raise
                    continue
                self.attempts.append(Attempt(p, attempt, info.task_attempt_id, "accepted"))
                outcomes.append(outcome)
                break
            if p in self.speculate:
                spec = TaskInfo(p, attempt + 1, _new_task_attempt_id())
                try:
                    fn(spec, self._input(p, False))  # its result is discarded, like Spark's
                except ConnectorError as exc:
                    # So is its failure: the task succeeded already. (An upsert's duplicate
                    # attempt waits on the rows the accepted attempt's prepared transaction
                    # locks, and fails when its lock wait ends.)
                    logger.info("partition %d: the speculative attempt failed (%s): "
                                "discarded, as Spark does once the task succeeded", p,
                                type(exc).__name__)
                self.attempts.append(Attempt(p, attempt + 1, spec.task_attempt_id, "speculative"))
        return outcomes

    def _run_barrier_stage(self, fn: TaskFunction) -> list[TaskOutcome]:
        """Spark's barrier execution mode: every partition's task at once (a thread each),
        sharing one :class:`~connectors.core.batch.TaskBarrier`. A failed task fails the
        stage attempt: the others' barrier waits break (Spark kills them) and the whole
        stage runs again, for a :class:`SimulatedTaskFailure` (``fail_first_attempt``); any
        other error is raised. ``speculate``: see :meth:`_speculate_barrier`."""
        for attempt in range(self.max_failures):
            outcomes, errors = self._barrier_attempt(fn, attempt)
            causes = [e for e in errors
                      if e is not None and not isinstance(e, threading.BrokenBarrierError)]
            if not any(errors):
                self._speculate_barrier(fn, attempt + 1)
                return [o for o in outcomes if o is not None]
            cause = causes[0] if causes else next(e for e in errors if e is not None)
            if not isinstance(cause, SimulatedTaskFailure) or attempt + 1 >= self.max_failures:
                raise cause
        raise AssertionError("unreachable")  # pragma: no cover

    def _speculate_barrier(self, fn: TaskFunction, attempt: int) -> None:
        """``speculate``: after the accepted stage, the chosen partitions run once more, as
        a stage of their own (results discarded). Spark does not speculate barrier stages;
        these extra attempts stand for any late duplicate a sink must not let commit (they
        see a barrier of fewer tasks than the slots, like a partly resubmitted stage)."""
        chosen = sorted(self.speculate)
        if not chosen:
            return
        stage = _LocalStage(len(chosen))
        infos = [TaskInfo(p, attempt, _new_task_attempt_id(), barrier=stage.task(i))
                 for i, p in enumerate(chosen)]

        def run(info: TaskInfo) -> None:
            try:
                fn(info, self._input(info.partition, False))
            except BaseException:  # a discarded attempt's failure, like Spark's
                stage.abort()

        threads = [threading.Thread(target=run, args=(info,), daemon=True) for info in infos]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.attempts += [Attempt(i.partition, attempt, i.task_attempt_id, "speculative")
                          for i in infos]

    def _barrier_attempt(self, fn: TaskFunction, attempt: int
                         ) -> tuple[list[TaskOutcome | None], list[BaseException | None]]:
        """One attempt of a barrier stage: every task in a thread of its own; the outcome
        or the error of each."""
        count = len(self._partitions)
        stage = _LocalStage(count)
        outcomes: list[TaskOutcome | None] = [None] * count
        errors: list[BaseException | None] = [None] * count
        infos = [TaskInfo(p, attempt, _new_task_attempt_id(), barrier=stage.task(p))
                 for p in range(count)]

        def run(p: int) -> None:
            fail = attempt == 0 and p in self.fail_first_attempt
            try:
                outcomes[p] = fn(infos[p], self._input(p, fail))
            except BaseException as exc:  # the stage attempt's failure
                errors[p] = exc
                stage.abort()

        threads = [threading.Thread(target=run, args=(p,), daemon=True) for p in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for p, info in enumerate(infos):
            self.attempts.append(Attempt(p, attempt, info.task_attempt_id,
                                         "failed" if errors[p] else "accepted"))
        return outcomes, errors

    def slotted(self, slots: int, columns: list[str] | None = None, *,
                key: str | None = None, local_rows: int = 0) -> LocalBatch:
        table = self.to_arrow()
        cols = columns if columns is not None else table.column_names
        by_key = key is not None and key in table.column_names
        buckets: list[list[dict[str, object]]] = [[] for _ in range(slots)]
        for row in table.to_pylist():  # in input order: a slot keeps it per input partition
            if by_key and row[key] is not None:
                placed = b"key:" + repr(row[key]).encode()
            else:
                placed = repr([row[c] for c in cols]).encode()
            h = int.from_bytes(hashlib.blake2b(placed, digest_size=8).digest(), "little")
            buckets[h % slots].append(row)
        parts = [[pa.RecordBatch.from_pylist(b, schema=self._schema)] for b in buckets]
        slotted = LocalBatch(
            parts,
            fail_first_attempt=sorted(self.fail_first_attempt),
            speculate=sorted(self.speculate),
            max_failures=self.max_failures,
            spark=self.spark,
        )
        slotted.attempts = self.attempts  # one record of every attempt of this batch
        return slotted

    def fingerprint(self) -> Fingerprint:
        return fingerprint_batches(b for p in self._partitions for b in p)

    def to_arrow(self) -> pa.Table:
        batches = [b for p in self._partitions for b in p]
        return pa.Table.from_batches(batches, schema=self._schema)


class _LocalStage:
    """One attempt of a barrier stage of :class:`LocalBatch`: its tasks' barrier."""

    #: A task that waits longer has a partner that hangs: the stage fails instead.
    TIMEOUT_S = 120.0

    def __init__(self, tasks: int) -> None:
        self.tasks = tasks
        self._barrier = threading.Barrier(tasks)
        self._messages = [""] * tasks

    def abort(self) -> None:
        self._barrier.abort()

    def task(self, partition: int) -> _LocalTaskBarrier:
        return _LocalTaskBarrier(self, partition)

    def all_gather(self, partition: int, message: str) -> list[str]:
        self._messages[partition] = message
        self._barrier.wait(self.TIMEOUT_S)  # every message written
        messages = list(self._messages)
        self._barrier.wait(self.TIMEOUT_S)  # every copy taken: the next round may write
        return messages


class _LocalTaskBarrier:
    """What one task of a :class:`_LocalStage` sees (Spark's ``BarrierTaskContext``)."""

    def __init__(self, stage: _LocalStage, partition: int) -> None:
        self._stage = stage
        self._partition = partition

    def tasks(self) -> int:
        return self._stage.tasks

    def all_gather(self, message: str) -> list[str]:
        return self._stage.all_gather(self._partition, message)
