"""``barrier=False``: the record checks on the batch's DataFrame, in Spark SQL.

:class:`FrameChecks` places them before the slotting shuffle (they cost no job of their
own) with a given topic, or runs one Spark aggregation (no Python) with a ``topic``
column, and sizes the Arrow hand-over from them. The sink asks the batch input for these
capabilities (:func:`~connectors.spark.inputs.spark_frame`,
:func:`~connectors.spark.inputs.with_frame`), never for its
type: an input without a DataFrame is checked by a job of plain tasks instead
(:class:`~connectors.kafka._checks.RecordChecks`).

The same checks as :func:`connectors.kafka._records.scan_batch` (which every slot still
runs before it produces), expressed in Spark SQL so that the check job runs in the JVM
only: no Arrow transfer, no Python worker. The record size is the same sum as
:func:`~connectors.kafka._records.record_sizes` (UTF-8/binary lengths of key and value, of
every header's key and value plus 16 when a record has headers, plus the per-record
overhead), so a batch this check passes also passes every slot's check.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from connectors.core.batch import BatchInput
from connectors.core.errors import BadInputError
from connectors.core.fingerprint import without_row_hash
from connectors.kafka._records import (
    QUOTED_BYTES,
    RECORD_OVERHEAD,
    RecordLimits,
    partition_beyond,
    partition_record,
    quote,
    scan_batch,
)
from connectors.spark.inputs import spark_frame, with_frame
from connectors.spark.toolkit import ROW_BOUND_MARK, Handover, handover_budget, handover_rows

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["DataFrameScan", "FrameChecks", "bad_input_message", "check_condition",
           "row_bytes", "scan_dataframe"]

logger = logging.getLogger(__name__)


def _size(names: list[str]) -> Column:
    from pyspark.sql import functions as F  # noqa: N812

    def length(c: Column) -> Column:
        return F.coalesce(F.octet_length(c).cast("long"), F.lit(0).cast("long"))

    size = length(F.col("value"))
    if "key" in names:
        size = size + length(F.col("key"))
    if "headers" in names:
        summed = F.aggregate(
            F.col("headers"), F.lit(0).cast("long"),
            lambda acc, h: acc + length(h.getField("key")) + length(h.getField("value")),
        )
        size = size + F.when(F.coalesce(F.size("headers"), F.lit(0)) > 0, summed + 16) \
            .otherwise(F.lit(0).cast("long"))
    return size + F.lit(RECORD_OVERHEAD).cast("long")


def row_bytes(names: list[str]) -> Column:
    """An upper bound of the bytes a row of these columns takes in the slot tasks' Arrow
    batches: the record's size (whose fixed part, 64 bytes, covers the offsets, the
    partition, the row hash and the validity bits), the topic's name when it is a column,
    and two offsets and validity bits (12 bytes) per header."""
    from pyspark.sql import functions as F  # noqa: N812

    size = _size(names)
    if "topic" in names:
        size = size + F.coalesce(F.octet_length(F.col("topic")).cast("long"),
                                 F.lit(0).cast("long"))
    if "headers" in names:
        size = size + F.coalesce(F.size("headers"), F.lit(0)).cast("long") * F.lit(12)
    return size


@dataclass(frozen=True)
class DataFrameScan:
    """What :func:`scan_dataframe` found: topic -> largest explicit partition (-1: none
    given), for the caller to check against the cluster; the largest :func:`row_bytes`."""

    topics: dict[str, int]
    max_row_bytes: int


def scan_dataframe(
    df: DataFrame, limits: RecordLimits, fixed_topic: str | None,
    error: Callable[[str], BadInputError], *, values_in_errors: bool = False,
) -> DataFrameScan:
    """Check every record of ``df``: size, partition >= 0, topic present.

    Raises ``error(message)`` for a record that cannot be written: sizes, topics and
    partitions, never a record's key or value unless ``values_in_errors`` (then one more
    query finds an offending record to quote).
    """
    from pyspark.sql import functions as F  # noqa: N812

    names = df.columns
    has_partition = "partition" in names
    partition = F.col("partition") if has_partition else F.lit(None).cast("int")
    aggs = [
        F.count(F.lit(1)).alias("rows"),
        F.max(_size(names)).alias("max_size"),
        F.min(partition).alias("low"),
        F.max(partition).alias("top"),
        F.max(row_bytes(names)).alias("row_bytes"),
    ]
    if fixed_topic is not None:
        rows = [(fixed_topic, r) for r in df.agg(*aggs).collect()]
    else:
        rows = [(r["topic"], r) for r in df.groupBy("topic").agg(*aggs).collect()]
    topics: dict[str, int] = {}
    largest = 0
    for topic, r in rows:
        if not r["rows"]:
            continue
        largest = max(largest, int(r["row_bytes"]))
        if int(r["max_size"]) > limits.max_record_bytes:
            where = "" if fixed_topic is not None else f" for topic {topic!r}"
            if values_in_errors:
                where += _offending(df, _size(names) > F.lit(limits.max_record_bytes))
            raise error(
                f"a record{where} is about {int(r['max_size'])} bytes, larger than the "
                f"{limits.max_record_bytes} bytes the producer/topic accept (message.max.bytes "
                "in the config, max.message.bytes of the topic): raise those limits or write "
                "smaller values")
        if r["low"] is not None and int(r["low"]) < 0:
            what = _offending(df, F.col("partition") < 0) if values_in_errors else ""
            raise error(f"the 'partition' column holds {int(r['low'])}{what}: partitions are "
                        ">= 0")
        if topic is None:
            raise error("the 'topic' column holds null: every record needs its topic")
        top = -1 if r["top"] is None else int(r["top"])
        topics[str(topic)] = max(topics.get(str(topic), -1), top)
    return DataFrameScan(topics, largest)


def _offending(df: DataFrame, condition: Column) -> str:
    """`` (key ..., value ...)`` of one record of ``df`` meeting ``condition`` (one more
    query; ``values_in_errors=True`` only)."""
    names = [n for n in ("key", "value") if n in df.columns]
    rows = df.where(condition).select(*names).limit(1).collect()
    if not rows:
        return ""
    return " (" + ", ".join(f"{n} {quote(rows[0][n])}" for n in names) + ")"


#: Prefix of the messages that :func:`check_condition` raises inside Spark tasks.
MARK = "[connectors.kafka check] "
_MARKED = re.compile(re.escape(MARK) + r"(.*?)(?:\s+SQLSTATE: \w+)?\s*$", re.MULTILINE)


def check_condition(
    columns: list[str], limits: RecordLimits, topic: str, partitions: int | None,
    row_bound: int | None = None, *, values_in_errors: bool = False,
) -> Column:
    """A filter that raises (Spark's ``raise_error``) on a record larger than the limit or
    with a partition out of ``0..partitions-1``, and keeps every other record (unresolved:
    reusable for every batch with these columns and limits).

    Put before the slotting shuffle, it runs in the shuffle's map stage, which must finish
    before any slot task starts: a bad record fails the job before anything is written,
    without a job of its own. :func:`bad_input_message` finds the message in the failure.

    ``row_bound``: also the guard of a :class:`~connectors.spark.toolkit.Handover`
    assumed for rows of at most that many bytes (:func:`row_bytes`): a larger row (that
    passes every other check) raises :data:`~connectors.spark.toolkit.ROW_BOUND_MARK`.

    The messages name sizes, partitions and the topic; a record's key and value (their
    first bytes) only with ``values_in_errors``.
    """
    from pyspark.sql import functions as F  # noqa: N812

    size = _size(columns)
    what = _quoted_columns(columns) if values_in_errors else F.lit("")
    check = F.when(
        size > F.lit(limits.max_record_bytes),
        F.raise_error(F.concat(
            F.lit(f"{MARK}a record"), what, F.lit(" is about "), size.cast("string"),
            F.lit(f" bytes, larger than the {limits.max_record_bytes} bytes the producer/topic "
                  "accept (message.max.bytes in the config, max.message.bytes of the topic): "
                  "raise those limits or write smaller values"))),
    )
    if "partition" in columns:
        part = F.col("partition")
        check = check.when(part < 0, F.raise_error(F.concat(
            F.lit(f"{MARK}the 'partition' column holds "), part.cast("string"), what,
            F.lit(": partitions are >= 0"))))
        if partitions is not None:
            check = check.when(part >= F.lit(partitions), F.raise_error(F.concat(
                F.lit(f"{MARK}the 'partition' column holds "), part.cast("string"), what,
                F.lit(f", but topic {topic!r} has {partitions} partitions"))))
    if row_bound is not None:
        bound = row_bytes(columns)
        check = check.when(bound > F.lit(row_bound), F.raise_error(F.concat(
            F.lit(f"{ROW_BOUND_MARK}a row of about "), bound.cast("string"),
            F.lit(f" bytes, over the {row_bound} bytes assumed for the Arrow batches"))))
    return check.otherwise(F.lit(True))


def _quoted_columns(columns: list[str]) -> Column:
    """`` (key '...', value '...')``: the first :data:`QUOTED_BYTES` bytes of a record's key
    and value, as a Spark string (``values_in_errors=True`` only)."""
    from pyspark.sql import functions as F  # noqa: N812

    parts: list[Column] = []
    for name in ("key", "value"):
        if name not in columns:
            continue
        head = F.substring(F.col(name).cast("binary"), 1, QUOTED_BYTES).cast("string")
        parts += [F.lit(f"{', ' if parts else ''}{name} '"),
                  F.coalesce(head, F.lit("null")), F.lit("'")]
    return F.concat(F.lit(" ("), *parts, F.lit(")")) if parts else F.lit("")


def bad_input_message(exc: BaseException) -> str | None:
    """The message :func:`check_condition` raised, if ``exc`` is that failure.

    Not a classification of a foreign error by its text: :data:`MARK` is this module's own
    prefix, raised by this module's own check (Spark's ``raise_error``) inside the job and
    carried back in the job's failure, whose Python type and error class depend on the
    Spark version and front end (classic or Connect); the prefix does not.
    """
    text = str(exc)
    if MARK not in text:
        return None
    match = _MARKED.search(text)
    return match.group(1).strip() if match else None


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
        #: The last :meth:`prescan`'s checks left to the slots' job (a given topic): the
        #: batch filtered by them, built on demand by :meth:`run_pending`.
        self.pending: Callable[[], Any] | None = None

    def shipped(self) -> FrameChecks:
        """A copy without the JVM references, for the tasks."""
        copy = FrameChecks(self.sink_id, self.values_in_errors)
        copy.row_bound = self.row_bound
        return copy

    def condition(self, columns: list[str], limits: RecordLimits, topic: str,
                  partitions: int | None, row_bound: int | None = None) -> Any:
        """:func:`check_condition` for a batch with these columns
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
                    what = (partition_record(without_row_hash(part), partitions)
                            if self.values_in_errors else "")
                    raise error(partition_beyond(top, topic, partitions, what))

        return check

    def run_pending(self, batch_id: int) -> None:
        """The last :meth:`prescan`'s checks as a Spark job of their own, now (a fan-out,
        before its decision: Spark's ``noop`` writer evaluates every row); a refused record
        raises :class:`BadInputError`."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        try:
            pending().write.format("noop").mode("overwrite").save()
        except Exception as exc:
            message = bad_input_message(exc)
            if message is None:
                raise
            raise BadInputError(message, sink_id=self.sink_id, batch_id=batch_id) from None

    def raise_row_bound(self) -> None:
        """A row of a batch exceeded the assumed bound: assume 8x larger rows from now on
        (:func:`~connectors.spark.toolkit.handover_rows` turns the bound off once it would
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
        job of their own: :func:`check_condition`); with a ``topic``
        column, one JVM aggregation first finds the topics and partitions to check.

        Either way the slot tasks then receive their Arrow batches without Spark's per-row
        size check (:class:`~connectors.spark.toolkit.Handover`): with a ``topic`` column,
        sized from the largest row the aggregation found; with a given topic, from an
        assumed bound that the record check also guards.
        """
        self.pending = None
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
            self.pending = lambda: df.where(self.condition(columns, limits, topic, partitions))
            in_rows = self.rows_check(batch_id, limits, topic, partitions)
            # The checked frames are built on first use: a small batch whose slots run in
            # the driver collects the batch without them and checks its rows with in_rows.
            if rows is None:
                check = self.condition(columns, limits, topic, partitions)
                return with_frame(batch, lambda: df.where(check), schema=schema,
                                  rows_check=in_rows), {}
            bound = self.row_bound
            guarded = self.condition(columns, limits, topic, partitions, bound)
            handover = Handover(
                rows, lambda: df.where(self.condition(columns, limits, topic, partitions)),
                self.raise_row_bound)
            return with_frame(batch, lambda: df.where(guarded), handover=handover,
                              schema=schema, rows_check=in_rows), {}
        scan = scan_dataframe(  # one JVM aggregation, no Python workers
            df, limits, topic,
            lambda message: BadInputError(message, sink_id=self.sink_id, batch_id=batch_id),
            values_in_errors=self.values_in_errors,
        )
        rows = handover_rows(df.sparkSession, scan.max_row_bytes)
        if rows is not None:  # measured: no guard
            batch = with_frame(batch, df, handover=Handover(rows), schema=schema)
        return batch, scan.topics
