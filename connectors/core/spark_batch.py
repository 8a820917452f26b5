"""The Spark side of :class:`~connectors.core.batch.BatchInput`: tasks run in ``mapInArrow``.

Each task receives its partition as Arrow record batches (no Python ``Row`` objects: an
order of magnitude faster), runs the protocol's task function and yields one row holding
its pickled :class:`~connectors.core.batch.TaskOutcome`. The driver collects those rows:
Spark returns exactly one result per partition, from the attempt it accepted.

Row hashes for fingerprints are computed in one of two places, fixed per batch by the sink
and the schema (:attr:`SparkBatch.hashes_in_tasks`), and both sides of every comparison use
the same one:

- **the JVM** (default): every row's ``xxhash64`` (seeded by the column count; maps as
  JSON, which ``xxhash64`` refuses) travels to the tasks as the last column
  :data:`~connectors.core.fingerprint.ROW_HASH_COLUMN`, which the tasks sum, and
  :meth:`SparkBatch.fingerprint` sums the same hashes in one aggregation job. The digest
  is the sum of the row hashes modulo 2**64, computed as two 32-bit halves so that the
  ``long`` sums cannot overflow under ANSI mode below 2**31 rows. Cheapest for long
  values (~0.3 ns per byte), but the extra column costs a projection (a copy of every
  row when nothing else projects) and its Arrow hand-over: ~60-80 ns per row.
- **the tasks** (sinks that ask for it, flat schemas only): the tasks hash the Arrow
  batches they receive with :func:`~connectors.core.fingerprint.fingerprint_batch`
  (vectorised numpy, ~5 ns per fixed-width value, ~3 ns per string byte), and
  :meth:`SparkBatch.fingerprint` runs the same function in a ``mapInArrow`` job (replays
  only). Cheapest for rows of numbers, timestamps and short strings.

A reused PySpark worker runs a full ``gc.collect()`` after every task, which scans every
object the worker ever imported (pyspark, pyarrow, psycopg...): 10-15 ms of CPU per task,
right when the driver commits, on two cores. So the first task of a worker calls
:func:`gc.freeze` twice: before it runs, and after it ran (after one collection, so no
garbage is frozen), because that task itself imports and keeps ~29,000 more objects
(modules loaded on first use, kept clients): measured 13-37 ms per collection with the
first freeze only. Frozen, a collection scans only what later tasks create.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from connectors.core.batch import BatchInput, TaskFunction, TaskInfo, TaskOutcome
from connectors.core.errors import BadInputError
from connectors.core.fingerprint import ROW_HASH_COLUMN, Fingerprint, fingerprint_batches

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType, StructType

__all__ = ["SparkBatch", "check_columns", "combine_fingerprint", "current_query_id",
           "fingerprint_aggregates", "flat_schema", "has_map", "outcome_task", "row_hash",
           "spark_fingerprint", "with_row_hash"]

_OUTCOME_SCHEMA = pa.schema([("outcome", pa.binary())])
_FINGERPRINT_SCHEMA = pa.schema([("rows", pa.int64()), ("digest", pa.string())])
_MASK = (1 << 64) - 1


def has_map(t: DataType) -> bool:
    """Whether a Spark type is or holds a map (which ``xxhash64`` and sorting refuse)."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(t, MapType):
        return True
    if isinstance(t, ArrayType):
        return has_map(t.elementType)
    if isinstance(t, StructType):
        return any(has_map(f.dataType) for f in t.fields)
    return False


def flat_schema(schema: StructType) -> bool:
    """Whether every column is of an atomic type (numbers, strings, binary, dates,
    timestamps, decimals, booleans, nulls): what tasks hash without the JVM's help."""
    from pyspark.sql.types import AtomicType, NullType

    return all(isinstance(f.dataType, (AtomicType, NullType)) for f in schema.fields)


def check_columns(df: DataFrame) -> None:
    """Refuse what no sink can write unambiguously: the reserved row-hash column name, and
    two columns whose names differ only in case (Spark's resolution is case-insensitive)."""
    fields = df.schema.fields
    if any(f.name == ROW_HASH_COLUMN for f in fields):
        raise BadInputError(f"the column name {ROW_HASH_COLUMN!r} is reserved: rename it")
    names = [f.name.lower() for f in fields]
    twice = sorted({f.name for f in fields if names.count(f.name.lower()) > 1})
    if twice:
        raise BadInputError(
            f"the batch has several columns named {', '.join(twice)} (after a join?): give "
            "every column its own name, e.g. with select(a.id.alias('a_id'), ...)")


def row_hash(df: DataFrame) -> Column:
    """Every row's 64-bit hash: ``xxhash64`` of its columns in order, seeded by their count
    (so that an added all-null column changes it); maps as JSON (deterministic for the same
    map; ``xxhash64`` refuses maps)."""
    from pyspark.sql import functions as F  # noqa: N812

    check_columns(df)
    fields = df.schema.fields
    cols = [F.to_json(F.col(f"`{f.name}`")) if has_map(f.dataType) else F.col(f"`{f.name}`")
            for f in fields]
    return F.xxhash64(F.lit(len(cols)), *cols)


#: Built row-hash columns by schema (unresolved expressions, valid for any DataFrame with
#: that schema): building one takes some 15 py4j calls, ~13 ms per micro-batch.
_ROW_HASHES: dict[tuple[int, str], Column] = {}
_ROW_HASHES_MAX = 64


def with_row_hash(df: DataFrame) -> DataFrame:
    """``df`` with :func:`row_hash` as its last column, named ``ROW_HASH_COLUMN``."""
    key = (id(df.sparkSession), df.schema.json())
    column = _ROW_HASHES.get(key)
    if column is None:
        column = row_hash(df)
        if len(_ROW_HASHES) >= _ROW_HASHES_MAX:
            _ROW_HASHES.clear()
        _ROW_HASHES[key] = column
    return df.withColumn(ROW_HASH_COLUMN, column)


def fingerprint_aggregates(df: DataFrame) -> list[Column]:
    """``rows``, ``hi`` and ``lo``: the aggregates :func:`spark_fingerprint` combines."""
    from pyspark.sql import functions as F  # noqa: N812

    h = row_hash(df)
    return [
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.shiftright(h, 32)).alias("hi"),
        F.sum(h.bitwiseAND(F.lit(0xFFFFFFFF))).alias("lo"),
    ]


def combine_fingerprint(rows: Any, hi: Any, lo: Any) -> Fingerprint:
    """The fingerprint from the aggregates: ``(hi << 32) + lo`` is the sum of the hashes."""
    digest = ((int(hi or 0) << 32) + int(lo or 0)) & _MASK
    return Fingerprint(int(rows or 0), digest)


def spark_fingerprint(df: DataFrame) -> Fingerprint:
    """The fingerprint of ``df`` as one aggregation job; equal to the sum of what the tasks
    compute from :data:`ROW_HASH_COLUMN` for the same rows."""
    row = df.agg(*fingerprint_aggregates(df)).first()
    if row is None:  # pragma: no cover - a global aggregate always has one row
        return Fingerprint()
    return combine_fingerprint(row["rows"], row["hi"], row["lo"])


@functools.cache
def _freeze_gc_once() -> None:
    """Move what this Python worker holds so far out of the garbage collector's scans (see
    the module docstring); once per process: later objects are collected as usual."""
    gc.freeze()


@functools.cache
def _freeze_gc_after_first_task() -> None:
    """After a worker's first task: collect once, then freeze what that task loaded and
    kept (see the module docstring)."""
    gc.collect()
    gc.freeze()


def _task_info() -> TaskInfo:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:  # pragma: no cover - only outside a Spark task
        raise RuntimeError("not running in a Spark task")
    return TaskInfo(
        partition=ctx.partitionId(),
        attempt_number=ctx.attemptNumber(),
        task_attempt_id=ctx.taskAttemptId(),
    )


ArrowFunction = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def outcome_task(fn: TaskFunction) -> ArrowFunction:
    """``fn`` as a ``mapInArrow`` function: one row holding its pickled outcome."""

    def spark_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        _freeze_gc_once()
        outcome = fn(_task_info(), batches)
        _freeze_gc_after_first_task()
        yield pa.record_batch([pa.array([outcome.to_bytes()], pa.binary())], _OUTCOME_SCHEMA)

    return spark_task


def _fingerprint_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` function: the partition's fingerprint as the tasks compute it."""
    _freeze_gc_once()
    fp = fingerprint_batches(batches)
    _freeze_gc_after_first_task()
    yield pa.record_batch([pa.array([fp.rows], pa.int64()), pa.array([fp.hex], pa.string())],
                          _FINGERPRINT_SCHEMA)


def current_query_id(df: DataFrame) -> str | None:
    """The id of the streaming query running ``foreachBatch``, or ``None`` in a batch job.

    Stable across restarts of the same checkpoint; a new checkpoint gets a new id.
    """
    try:
        value = df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
    except Exception:  # Spark Connect has no SparkContext
        return None
    return str(value) if value else None


class SparkBatch(BatchInput):
    """A Spark DataFrame as the input of one batch.

    ``hash_in_tasks``: the sink prefers tasks to hash rows themselves (see the module
    docstring); honoured for flat schemas only, and then by :meth:`fingerprint` too.
    """

    def __init__(self, df: DataFrame, *, hash_in_tasks: bool = False) -> None:
        self._df = df
        self._schema: pa.Schema | None = None
        self._hash_in_tasks = hash_in_tasks

    @property
    def hashes_in_tasks(self) -> bool:
        """Whether tasks hash rows themselves (else the JVM hands them row hashes)."""
        return self._hash_in_tasks and flat_schema(self._df.schema)

    def task_frame(self) -> DataFrame:
        """The DataFrame the tasks read: with the JVM's row hashes unless they hash."""
        if self.hashes_in_tasks:
            check_columns(self._df)
            return self._df
        return with_row_hash(self._df)

    @property
    def spark_df(self) -> DataFrame:
        return self._df

    @property
    def schema(self) -> pa.Schema:
        if self._schema is None:
            from pyspark.sql.pandas.types import to_arrow_schema

            spark = self._df.sparkSession
            self._schema = to_arrow_schema(
                self._df.schema,
                timezone=spark.conf.get("spark.sql.session.timeZone") or "UTC",
                prefers_large_types=spark.conf.get(
                    "spark.sql.execution.arrow.useLargeVarTypes", "false"
                ) == "true",
            )
        return self._schema

    def estimated_partitions(self) -> int | None:
        try:
            return int(self._df.rdd.getNumPartitions())
        except Exception:
            return None

    def run_tasks(self, fn: TaskFunction, *, barrier: bool = False) -> list[TaskOutcome]:
        rows = (self.task_frame()
                .mapInArrow(outcome_task(fn), "outcome binary", barrier=barrier).collect())
        return [TaskOutcome.from_bytes(bytes(row[0])) for row in rows]

    def slotted(self, slots: int, columns: list[str] | None = None) -> SparkBatch:
        cols = columns if columns is not None else list(self._df.columns)
        return SparkBatch(self._df.repartition(slots, *cols), hash_in_tasks=self._hash_in_tasks)

    def fingerprint(self) -> Fingerprint:
        if not self.hashes_in_tasks:
            return spark_fingerprint(self._df)
        check_columns(self._df)
        total = Fingerprint()
        for row in self._df.mapInArrow(_fingerprint_task, "rows long, digest string").collect():
            total = total + Fingerprint(int(row[0]), int(row[1], 16))
        return total

    def to_arrow(self) -> pa.Table:
        table: pa.Table = self._df.toArrow()
        return table
