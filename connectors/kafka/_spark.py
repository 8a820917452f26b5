"""The wrappers of a batch input that :class:`~connectors.kafka.KafkaSink` hands the
protocol: everything is the inner batch's, and :class:`ErrorMappingBatch` turns a record
refused by the check in the slotting shuffle's map stage into the library's error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from connectors.core.batch import BatchInput, TaskFunction, TaskOutcome
from connectors.core.fingerprint import Fingerprint
from connectors.spark.inputs import SparkInput, batch_handover, spark_frame, with_frame
from connectors.spark.toolkit import Handover

__all__ = ["ErrorMappingBatch", "WrappedBatch"]


class WrappedBatch(SparkInput):
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
        return spark_frame(self._inner)

    @property
    def handover(self) -> Handover | None:
        return batch_handover(self._inner)

    def with_frame(self, frame: Any, *, handover: Handover | None = None,
                   schema: pa.Schema | None = None,
                   rows_check: Callable[[pa.Table], None] | None = None) -> BatchInput:
        return self._wrap(with_frame(self._inner, frame, handover=handover, schema=schema,
                                     rows_check=rows_check))

    def task_slots(self) -> int | None:
        return self._inner.task_slots()

    def barrier_refusal(self) -> str | None:
        return self._inner.barrier_refusal()

    def estimated_partitions(self) -> int | None:
        return self._inner.estimated_partitions()

    def run_tasks(self, fn: TaskFunction, *, barrier: bool = False) -> list[TaskOutcome]:
        return self._inner.run_tasks(fn, barrier=barrier)

    def slotted(self, slots: int, columns: list[str] | None = None, *,
                key: str | None = None, local_rows: int = 0) -> BatchInput:
        return self._wrap(self._inner.slotted(slots, columns, key=key, local_rows=local_rows))

    def run_figures(self) -> dict[str, float]:
        return self._inner.run_figures()

    def fingerprint(self) -> Fingerprint:
        return self._inner.fingerprint()

    def to_arrow(self) -> pa.Table:
        return self._inner.to_arrow()


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
