"""KafkaSink's Spark-facing part: the record checks of ``barrier=False`` on the batch's
DataFrame (before the slotting shuffle, so they cost no job of their own) and the Arrow
hand-over sized from them; and the wrappers of a batch input the sink hands the protocol.

The sink asks the batch input for these capabilities (:func:`~connectors.spark.inputs.spark_frame`,
:func:`~connectors.spark.inputs.with_frame`), never for its type: an input without a DataFrame is
checked by a job of plain tasks instead (:func:`connectors.kafka._input._scan_task`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from connectors.core.batch import BatchInput, TaskFunction, TaskOutcome
from connectors.core.errors import BadInputError
from connectors.core.fingerprint import Fingerprint, without_row_hash
from connectors.kafka._records import RecordLimits, partition_beyond, scan_batch
from connectors.kafka._scan import check_condition, scan_dataframe
from connectors.kafka._slot import _partition_record
from connectors.spark._handover import Handover, handover_budget, handover_rows
from connectors.spark.inputs import SparkInput, batch_handover, spark_frame, with_frame

logger = logging.getLogger(__name__)

__all__ = ["ErrorMappingBatch", "FrameChecks", "WrappedBatch"]


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


class FrameChecks:
    """KafkaSink's record checks of ``barrier=False`` on a batch's DataFrame, and the row
    size it assumes for the slot tasks' Arrow batches. Driver only (holds JVM references:
    a sink ships to its tasks without them, :meth:`shipped`)."""

    def __init__(self, sink_id: str, values_in_errors: bool) -> None:
        self.sink_id = sink_id
        self.values_in_errors = values_in_errors
        #: The record checks (Spark Columns) by what they were built for.
        self._checks: dict[tuple[Any, ...], Any] = {}
        #: The row size assumed for the slot tasks' Arrow batches (given topic; ``None``:
        #: not derived yet), raised when a batch proves it too small.
        self.row_bound: int | None = None

    def shipped(self) -> FrameChecks:
        """A copy without the JVM references, for the tasks."""
        copy = FrameChecks(self.sink_id, self.values_in_errors)
        copy.row_bound = self.row_bound
        return copy

    def condition(self, columns: list[str], limits: RecordLimits, topic: str,
                  partitions: int | None, row_bound: int | None = None) -> Any:
        """:func:`~connectors.kafka._scan.check_condition` for a batch with these columns
        (and the guard of ``row_bound``), built once (some 30 py4j calls) and reused."""
        key = (tuple(columns), limits, topic, partitions, row_bound)
        check = self._checks.get(key)
        if check is None:
            if len(self._checks) >= 8:
                self._checks.clear()
            check = self._checks[key] = check_condition(
                list(columns), *key[1:], values_in_errors=self.values_in_errors)
        return check

    def rows_check(self, batch_id: int, limits: RecordLimits, topic: str,
                   partitions: int | None) -> Callable[[pa.Table], None]:
        """:meth:`condition`'s checks (without the row bound's guard) as a function of rows
        collected to the driver (a small batch whose slots run there: see
        :mod:`connectors.spark._local`): the same sizes and partitions, in Arrow
        (:func:`~connectors.kafka._records.scan_batch`, which every slot runs too)."""
        def error(message: str) -> BadInputError:
            return BadInputError(message, sink_id=self.sink_id, batch_id=batch_id)

        def check(table: pa.Table) -> None:
            for part in table.to_batches():
                scan = scan_batch(without_row_hash(part), limits, topic, error,
                                  values_in_errors=self.values_in_errors)
                top = scan.topics.get(topic, -1)
                if partitions is not None and top >= partitions:
                    what = (_partition_record(without_row_hash(part), partitions)
                            if self.values_in_errors else "")
                    raise error(partition_beyond(top, topic, partitions, what))

        return check

    def raise_row_bound(self) -> None:
        """A row of a batch exceeded the assumed bound: assume 8x larger rows from now on
        (:func:`~connectors.spark._handover.handover_rows` turns the bound off once it would
        leave fewer than 1,024 rows per Arrow batch)."""
        if self.row_bound:
            self.row_bound *= 8
        logger.info("sink %s: rows of up to %s bytes assumed for the Arrow batches from now on",
                    self.sink_id, self.row_bound)

    def prescan(self, batch: BatchInput, batch_id: int, limits: RecordLimits,
                topic: str | None, partitions: int | None
                ) -> tuple[BatchInput, dict[str, int]] | None:
        """The batch to write and the topics (with their highest partition) still to check
        against the cluster; ``None`` when the batch has no DataFrame.

        With a given ``topic`` (of ``partitions`` partitions), the checks become a filter
        that raises, placed before the slotting shuffle, so they run in its map stage (no
        job of their own: :func:`~connectors.kafka._scan.check_condition`); with a ``topic``
        column, one JVM aggregation first finds the topics and partitions to check.

        Either way the slot tasks then receive their Arrow batches without Spark's per-row
        size check (:class:`~connectors.spark._handover.Handover`): with a ``topic`` column,
        sized from the largest row the aggregation found; with a given topic, from an
        assumed bound that the record check also guards.
        """
        df = spark_frame(batch)
        if df is None:
            return None
        schema = batch.schema
        if topic is not None:
            spark = df.sparkSession
            if self.row_bound is None:
                budget = handover_budget(spark)
                self.row_bound = budget[0] // (budget[1] or 10_000) if budget else 0
            rows = handover_rows(spark, self.row_bound) if self.row_bound else None
            columns = df.columns
            in_rows = self.rows_check(batch_id, limits, topic, partitions)
            if rows is None:
                check = self.condition(columns, limits, topic, partitions)
                return with_frame(batch, df.where(check), schema=schema,
                                        rows_check=in_rows), {}
            guarded = df.where(self.condition(columns, limits, topic, partitions,
                                              self.row_bound))
            handover = Handover(
                rows, lambda: df.where(self.condition(columns, limits, topic, partitions)),
                self.raise_row_bound)
            return with_frame(batch, guarded, handover=handover, schema=schema,
                                    rows_check=in_rows), {}
        scan = scan_dataframe(  # one JVM aggregation, no Python workers
            df, limits, topic,
            lambda message: BadInputError(message, sink_id=self.sink_id, batch_id=batch_id),
            values_in_errors=self.values_in_errors,
        )
        rows = handover_rows(df.sparkSession, scan.max_row_bytes)
        if rows is not None:  # measured: no guard
            batch = with_frame(batch, df, handover=Handover(rows), schema=schema)
        return batch, scan.topics
