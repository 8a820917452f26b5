"""Barrier mode that Spark can retry: the slots' barrier stage as a shuffle-map stage.

Spark never retries a failed barrier *result* stage ("Could not recover from a failed
barrier ResultStage": its tasks may have committed output). ``mapInArrow(...,
barrier=True).collect()`` is such a result stage, so one lost executor would fail the whole
streaming query. Followed by a one-partition exchange, the barrier stage becomes a
shuffle-map stage, which Spark retries as a whole (``spark.stage.maxConsecutiveAttempts``):
every slot fences its previous attempt, committed slots find their markers, the others
write again. Only the collected results change their path; nothing else differs from
:class:`connectors.spark.batch.SparkBatch`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from connectors.core.batch import BatchInput, TaskFunction, TaskOutcome
from connectors.core.fingerprint import Fingerprint

__all__ = ["ErrorMappingBatch", "RetryableBarrierBatch", "WrappedBatch"]


class WrappedBatch(BatchInput):
    """A :class:`BatchInput` around another one: everything is the inner batch's, and
    :meth:`slotted` wraps the slotted batch the same way (:meth:`_wrap`). Subclasses
    change :meth:`run_tasks`."""

    def __init__(self, inner: BatchInput) -> None:
        self._inner = inner

    def _wrap(self, inner: BatchInput) -> BatchInput:
        return type(self)(inner)

    @property
    def schema(self) -> pa.Schema:
        return self._inner.schema

    @property
    def spark_df(self) -> Any:
        return self._inner.spark_df

    def estimated_partitions(self) -> int | None:
        return self._inner.estimated_partitions()

    def run_tasks(self, fn: TaskFunction, *, barrier: bool = False) -> list[TaskOutcome]:
        return self._inner.run_tasks(fn, barrier=barrier)

    def slotted(self, slots: int, columns: list[str] | None = None, *,
                key: str | None = None) -> BatchInput:
        return self._wrap(self._inner.slotted(slots, columns, key=key))

    def fingerprint(self) -> Fingerprint:
        return self._inner.fingerprint()

    def to_arrow(self) -> pa.Table:
        return self._inner.to_arrow()


class RetryableBarrierBatch(WrappedBatch):
    """Wraps a Spark :class:`BatchInput`; barrier task runs become retryable stages."""

    def run_tasks(self, fn: TaskFunction, *, barrier: bool = False) -> list[TaskOutcome]:
        from connectors.spark.batch import SparkBatch, outcome_task

        inner = self._inner
        if not barrier or not isinstance(inner, SparkBatch):
            return inner.run_tasks(fn, barrier=barrier)
        rows = (inner.task_frame().mapInArrow(outcome_task(fn), "outcome binary", barrier=True)
                .repartition(1).collect())
        return [TaskOutcome.from_bytes(bytes(row[0])) for row in rows]


class ErrorMappingBatch(WrappedBatch):
    """Wraps a :class:`BatchInput`; an exception of its task runs that ``translate`` knows
    (a record refused by a check in the shuffle's map stage) becomes the error it returns.
    """

    def __init__(self, inner: BatchInput,
                 translate: Callable[[Exception], BaseException | None]) -> None:
        super().__init__(inner)
        self._translate = translate

    def _wrap(self, inner: BatchInput) -> BatchInput:
        return ErrorMappingBatch(inner, self._translate)

    def run_tasks(self, fn: TaskFunction, *, barrier: bool = False) -> list[TaskOutcome]:
        try:
            return self._inner.run_tasks(fn, barrier=barrier)
        except Exception as exc:
            translated = self._translate(exc)
            if translated is None:
                raise
            raise translated from None
