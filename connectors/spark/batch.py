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

**Handing rows to the tasks.** Spark (4.0+) ends an Arrow batch for a Python task at
``spark.sql.execution.arrow.maxRecordsPerBatch`` rows (10,000) or at
``spark.sql.execution.arrow.maxBytesPerBatch`` (64 MB), and to know the bytes it asks the
Arrow writer for its size after *every row*, unless that setting is exactly ``2**31 - 1``.
That question walks the Arrow vectors: it was 47 % of the JVM's CPU in a ``mapInArrow``
over 500k rows of 100 bytes (Java Flight Recorder), and without it the JVM spent 0.31
instead of 0.48 CPU-seconds. A sink that knows an upper bound ``B`` of every row's bytes
passes a :class:`Handover`: its tasks then run with the size check off and
``maxBytesPerBatch // B`` rows per batch (at most ``maxRecordsPerBatch``), so a batch still
holds at most ``maxBytesPerBatch`` bytes; both settings are set on the session for the
job only and restored after it (:func:`arrow_settings`). A bound that is only assumed is
enforced by a guard: a filter before the slotting shuffle that fails the map stage (no
task has run then) with :data:`ROW_BOUND_MARK` for a larger row; :meth:`SparkBatch.run_tasks`
then runs the job again without the guard (:attr:`Handover.fallback`, built only then) and
with Spark's own batching, and tells the sink (:attr:`Handover.tripped`), which assumes a
larger bound for its next batches.

**Adaptive query execution.** With AQE on (Spark's default, in ``foreachBatch`` too), the
slot job runs its shuffle's map stage as a job of its own, re-plans, then runs the slots:
a 100-record batch of ``KafkaSink`` took 169 ms with AQE and 119 ms without. The sink's one
exchange has a fixed partition count, so AQE has nothing to change in it. When the input
itself needs no exchange (its plan holds only :data:`NARROW_NODES`: scans, projections,
filters, a ``foreachBatch`` batch), :meth:`SparkBatch.slotted` marks the batch and its
slot job runs with ``spark.sql.adaptive.enabled=false``, set on the session for the job
only (:func:`session_settings`). An input with a join, an aggregation, a sort or its own
repartitioning keeps AQE, which may well improve those.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import logging
import os
import re
import socket
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from connectors.core.batch import BatchInput, TaskFunction, TaskInfo, TaskOutcome
from connectors.core.errors import BadInputError
from connectors.core.fingerprint import ROW_HASH_COLUMN, Fingerprint, fingerprint_batches

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType, StructType

__all__ = ["ADAPTIVE", "ENV_GC_FREEZE", "NARROW_NODES", "ROW_BOUND_MARK", "Handover",
           "SparkBatch", "arrow_schema", "arrow_settings", "check_columns",
           "combine_fingerprint", "current_query_id", "fingerprint_aggregates", "flat_schema",
           "front_end", "gc_freeze_enabled", "handover_budget", "handover_rows", "has_map",
           "narrow_plan", "outcome_task", "row_hash", "session_settings", "spark_fingerprint",
           "with_row_hash"]

logger = logging.getLogger(__name__)

_OUTCOME_SCHEMA = pa.schema([("outcome", pa.binary())])
_FINGERPRINT_SCHEMA = pa.schema([("rows", pa.int64()), ("digest", pa.string())])
_MASK = (1 << 64) - 1


@functools.cache
def _outcome_type() -> Any:
    """:data:`_OUTCOME_SCHEMA` as Spark's type (a DDL string would be parsed by the JVM on
    every ``mapInArrow``)."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    return StructType([StructField("outcome", BinaryType())])


def arrow_schema(schema: StructType, *, timezone: str, large_types: bool = False) -> pa.Schema:
    """The Arrow schema of the record batches ``mapInArrow`` hands tasks for ``schema``.

    Spark's JVM writes every ``TimestampType`` value, nested ones too, as
    ``timestamp[us, tz=<session time zone>]`` (``TimestampNTZType`` without a zone). PySpark's
    ``to_arrow_schema`` says so only from 4.2 on (its ``timezone`` argument); 4.0 and 4.1
    take ``timestamp_utc`` and name UTC instead, so there the zone is set afterwards.
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    if "timezone" in inspect.signature(to_arrow_schema).parameters:  # pyspark >= 4.2
        return to_arrow_schema(schema, timezone=timezone, prefers_large_types=large_types)
    converted = to_arrow_schema(schema, prefers_large_types=large_types)
    return pa.schema([f.with_type(_zoned(f.type, timezone)) for f in converted],
                     metadata=converted.metadata)


def _zoned(t: pa.DataType, timezone: str) -> pa.DataType:
    """``t`` with every zoned timestamp in it, at any depth, in ``timezone``."""
    if pa.types.is_timestamp(t):
        return pa.timestamp(t.unit, tz=timezone) if t.tz is not None else t
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(_zoned(t.key_type, timezone)),
                       t.item_field.with_type(_zoned(t.item_type, timezone)),
                       keys_sorted=t.keys_sorted)
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_zoned(t.value_type, timezone)))
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_zoned(t.value_type, timezone)))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_zoned(f.type, timezone)) for f in t])
    return t


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


def outcome_task(fn: TaskFunction) -> ArrowFunction:
    """``fn`` as a ``mapInArrow`` function: one row holding its pickled outcome."""

    def spark_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        _ack_now()
        _freeze_gc_once()
        outcome = fn(_task_info(), batches)
        _freeze_gc_after_first_task()
        yield pa.record_batch([pa.array([outcome.to_bytes()], pa.binary())], _OUTCOME_SCHEMA)

    return spark_task


def _fingerprint_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` function: the partition's fingerprint as the tasks compute it."""
    _ack_now()
    _freeze_gc_once()
    fp = fingerprint_batches(batches)
    _freeze_gc_after_first_task()
    yield pa.record_batch([pa.array([fp.rows], pa.int64()), pa.array([fp.hex], pa.string())],
                          _FINGERPRINT_SCHEMA)


#: Spark's settings for the Arrow batches handed to Python tasks.
MAX_RECORDS = "spark.sql.execution.arrow.maxRecordsPerBatch"
MAX_BYTES = "spark.sql.execution.arrow.maxBytesPerBatch"
#: The one ``maxBytesPerBatch`` at which Spark does not measure the batch after every row.
NO_SIZE_CHECK = 2**31 - 1
#: Fewer rows per Arrow batch than this: Spark's own batching instead (rows that large make
#: the per-row size check cheap next to copying them, and a bound far above most rows
#: would cut their batches short).
MIN_HANDOVER_ROWS = 1024
#: Prefix of the message a guard raises for a row over the assumed bound.
ROW_BOUND_MARK = "[connectors row bound] "

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "p": 1 << 50,
          "pb": 1 << 50}
_BYTES = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$")


def _byte_string(text: str) -> int | None:
    """Spark's byte strings (``64MB``, ``67108864b``, ``32m``; binary units), else None."""
    match = _BYTES.match(text.lower())
    if match is None or match.group(2) not in _UNITS:
        return None
    return int(match.group(1)) * _UNITS[match.group(2)]


def handover_budget(spark: Any) -> tuple[int, int] | None:
    """The session's (bytes, rows) per Arrow batch (rows 0: no row limit), or ``None`` when
    the size check is off already or the settings cannot be read."""
    try:
        budget = _byte_string(str(spark.conf.get(MAX_BYTES)))
        rows = int(spark.conf.get(MAX_RECORDS))
    except Exception:  # Spark Connect without the setting, an odd value
        return None
    if budget is None or budget <= 0 or budget >= NO_SIZE_CHECK:
        return None
    return budget, max(rows, 0)


def handover_rows(spark: Any, row_bytes: int) -> int | None:
    """Rows per Arrow batch for rows of at most ``row_bytes`` bytes, so that a batch stays
    within the session's ``maxBytesPerBatch`` and ``maxRecordsPerBatch``; ``None`` when
    Spark's own batching is better (fewer than :data:`MIN_HANDOVER_ROWS` rows)."""
    found = handover_budget(spark)
    if found is None:
        return None
    budget, limit = found
    rows = budget // max(row_bytes, 1)
    if limit:
        rows = min(rows, limit)
    return rows if rows >= MIN_HANDOVER_ROWS else None


@contextlib.contextmanager
def session_settings(spark: Any, settings: dict[str, str]) -> Iterator[None]:
    """Within the block, ``spark``'s runtime SQL settings ``settings``; the session's own
    values are restored after (unset where they were unset).

    A job another thread starts on the same session meanwhile gets them too. The sink sets
    only settings that change no result: Arrow batch sizes, and adaptive execution for a job
    whose one exchange is the sink's. (A ``foreachBatch`` function runs on the streaming
    query's own session.)
    """
    if not settings:
        yield
        return
    before = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def arrow_settings(rows: int) -> dict[str, str]:
    """Settings under which jobs hand Arrow batches of ``rows`` rows to Python tasks without
    Spark's per-row size check (for :func:`session_settings`: batch sizes only, no change
    of results)."""
    return {MAX_RECORDS: str(rows), MAX_BYTES: str(NO_SIZE_CHECK)}


ADAPTIVE = "spark.sql.adaptive.enabled"
#: Logical plan nodes (``nodeName``, analyzed plan) that need no exchange of their own. An
#: input made of these only leaves the sink's placement as the slot job's one exchange.
NARROW_NODES = frozenset({
    "Project", "Filter", "Range", "LocalRelation", "LogicalRDD", "LogicalRelation",
    "DataSourceV2Relation", "HiveTableRelation", "InMemoryRelation", "SubqueryAlias",
    "View", "ResolvedHint", "Generate", "Sample", "Union", "LocalLimit",
    "SerializeFromObject", "DeserializeToObject", "MapElements", "MapPartitions",
    "MapInArrow", "MapInPandas", "PythonMapInArrow", "BatchEvalPython", "ArrowEvalPython",
})
#: Larger plans are not walked (each node is a few py4j calls): they keep AQE.
_MAX_PLAN_NODES = 200


def narrow_plan(df: Any) -> bool:
    """Whether ``df``'s analyzed plan holds only :data:`NARROW_NODES` (no join,
    aggregation, window, sort, limit or repartitioning). ``False`` when the plan cannot be
    read (Spark Connect) or is large."""
    try:
        stack = [df._jdf.queryExecution().analyzed()]
        seen = 0
        while stack:
            node = stack.pop()
            seen += 1
            if seen > _MAX_PLAN_NODES or str(node.nodeName()) not in NARROW_NODES:
                return False
            children = node.children()
            stack.extend(children.apply(i) for i in range(children.size()))
        return True
    except Exception:
        return False


@dataclass(frozen=True)
class Handover:
    """How a :class:`SparkBatch` hands its rows to the tasks when the sink bounds them.

    ``rows``: rows per Arrow batch (from :func:`handover_rows`), Spark's per-row size check
    off. ``fallback``: when the batch's DataFrame carries a guard (a filter that raises
    :data:`ROW_BOUND_MARK` for a row over the bound the rows were computed from), the same
    DataFrame without it, built only when needed; ``None`` when the bound is known to hold
    (measured). ``tripped``: called when the guard failed the job, before it runs again
    with Spark's own batching.
    """

    rows: int
    fallback: Callable[[], DataFrame] | None = None
    tripped: Callable[[], None] | None = None


def current_query_id(df: DataFrame) -> str | None:
    """The id of the streaming query running ``foreachBatch``, or ``None`` in a batch job.

    Stable across restarts of the same checkpoint; a new checkpoint gets a new id.
    """
    try:
        value = df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
    except Exception:  # Spark Connect has no SparkContext
        return None
    return str(value) if value else None


def front_end(data: Any, hash_rows_in_tasks: bool) -> tuple[BatchInput, str | None] | None:
    """The engine front end of classic PySpark (:mod:`connectors.core.engine`): a Spark
    DataFrame as a :class:`SparkBatch`, with its streaming query's id; ``None`` for
    anything else."""
    from pyspark.sql import DataFrame as SparkDataFrame

    if not isinstance(data, SparkDataFrame):
        return None
    return SparkBatch(data, hash_in_tasks=hash_rows_in_tasks), current_query_id(data)


class SparkBatch(BatchInput):
    """A Spark DataFrame as the input of one batch.

    ``hash_in_tasks``: the sink prefers tasks to hash rows themselves (see the module
    docstring); honoured for flat schemas only, and then by :meth:`fingerprint` too.
    ``handover``: see the module docstring. ``hashed`` (internal, :meth:`slotted`): ``df``
    already ends with :data:`ROW_HASH_COLUMN`, computed before the slotting shuffle.
    ``schema``: :attr:`schema`, when the caller knows it already (a filter of a batch whose
    schema it read: reading it again costs a py4j round trip, Spark's analysis and the
    conversion, ~4 ms).
    """

    def __init__(self, df: DataFrame, *, hash_in_tasks: bool = False,
                 handover: Handover | None = None, hashed: bool = False,
                 schema: pa.Schema | None = None, static_plan: bool = False) -> None:
        self._df = df
        #: The slot job runs without adaptive execution (see the module docstring).
        self.static_plan = static_plan
        self._schema: pa.Schema | None = schema
        self._hash_in_tasks = hash_in_tasks
        self._handover = handover
        self._hashed = hashed
        self._unguarded: DataFrame | None = None

    def _plain(self) -> DataFrame:
        """The batch's DataFrame without a handover's guard (built on first use)."""
        fallback = self._handover.fallback if self._handover is not None else None
        if fallback is None:
            return self._df
        if self._unguarded is None:
            self._unguarded = fallback()
        return self._unguarded

    @property
    def handover(self) -> Handover | None:
        """How the rows reach the tasks when the sink bounds them (else Spark's batching)."""
        return self._handover

    @property
    def hashes_in_tasks(self) -> bool:
        """Whether tasks hash rows themselves (else the JVM hands them row hashes)."""
        return not self._hashed and self._hash_in_tasks and flat_schema(self._df.schema)

    def task_frame(self, df: DataFrame | None = None) -> DataFrame:
        """The DataFrame the tasks read (``df``: default, the batch's without a guard):
        with the JVM's row hashes unless they hash."""
        df = self._plain() if df is None else df
        if self._hashed:
            return df
        if self.hashes_in_tasks:
            check_columns(df)
            return df
        return with_row_hash(df)

    @property
    def spark_df(self) -> DataFrame:
        df = self._plain()
        return df.drop(ROW_HASH_COLUMN) if self._hashed else df

    @property
    def schema(self) -> pa.Schema:
        if self._schema is None:
            from pyspark.sql.types import StructType

            spark = self._df.sparkSession
            fields = [f for f in self._df.schema.fields
                      if not (self._hashed and f.name == ROW_HASH_COLUMN)]
            self._schema = arrow_schema(
                StructType(fields),
                timezone=spark.conf.get("spark.sql.session.timeZone") or "UTC",
                large_types=spark.conf.get(
                    "spark.sql.execution.arrow.useLargeVarTypes", "false"
                ) == "true",
            )
        return self._schema

    def estimated_partitions(self) -> int | None:
        try:
            return int(self._df.rdd.getNumPartitions())
        except Exception:
            return None

    def with_frame(self, frame: Any, *, handover: Any = None,
                   schema: pa.Schema | None = None) -> SparkBatch:
        return SparkBatch(frame, hash_in_tasks=self._hash_in_tasks, handover=handover,
                          schema=schema)

    def task_slots(self) -> int | None:
        try:
            return int(self._df.sparkSession.sparkContext.defaultParallelism)
        except Exception:  # Spark Connect: no SparkContext
            return None

    def barrier_refusal(self) -> str | None:
        try:
            conf = self._df.sparkSession.sparkContext.getConf()
        except Exception:  # Spark Connect: no SparkContext
            return None
        if conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true":
            return ("spark.dynamicAllocation.enabled=true, and Spark refuses barrier "
                    "stages then (turn dynamic allocation off)")
        return None

    def run_tasks(self, fn: TaskFunction, *, barrier: bool = False) -> list[TaskOutcome]:
        def run(df: DataFrame) -> list[TaskOutcome]:
            rows = (self.task_frame(df)
                    .mapInArrow(outcome_task(fn), _outcome_type(), barrier=barrier).collect())
            return [TaskOutcome.from_bytes(bytes(row[0])) for row in rows]

        if barrier:
            return self._run_barrier(fn)
        spark = self._df.sparkSession
        plan = {ADAPTIVE: "false"} if self.static_plan else {}
        handover = self._handover
        if handover is None:
            with session_settings(spark, plan):
                return run(self._plain())
        try:
            with session_settings(spark, {**plan, **arrow_settings(handover.rows)}):
                return run(self._df)
        except Exception as exc:
            if handover.fallback is None or ROW_BOUND_MARK not in str(exc):
                raise
        # The guard failed the shuffle's map stage: no task has run. Again, Spark's batching.
        logger.info("a row exceeds the bound assumed for %d-row Arrow batches: the job runs "
                    "again with Spark's own batching", handover.rows)
        if handover.tripped is not None:
            handover.tripped()
        with session_settings(spark, plan):
            return run(self._plain())

    def _run_barrier(self, fn: TaskFunction) -> list[TaskOutcome]:
        """The tasks as one barrier stage that Spark can retry.

        Spark never retries a failed barrier *result* stage ("Could not recover from a
        failed barrier ResultStage": its tasks may have committed output), and
        ``mapInArrow(..., barrier=True).collect()`` is one: a lost executor would fail the
        whole streaming query. Followed by a one-partition exchange, the barrier stage is a
        shuffle-map stage, which Spark retries as a whole
        (``spark.stage.maxConsecutiveAttempts``): a task-commit sink's slots fence their
        previous attempt, committed slots find their markers, the others write again. Rows
        reach the tasks by Spark's own batching (no :class:`Handover`).
        """
        rows = (self.task_frame().mapInArrow(outcome_task(fn), _outcome_type(), barrier=True)
                .repartition(1).collect())
        return [TaskOutcome.from_bytes(bytes(row[0])) for row in rows]

    def slotted(self, slots: int, columns: list[str] | None = None, *,
                key: str | None = None) -> SparkBatch:
        """Rows placed into ``slots`` partitions by a hash of ``columns``; by default by
        their content: the JVM's row hash, computed before the shuffle and handed to the
        tasks as is (one ``xxhash64`` of every row instead of that after the shuffle plus
        a Murmur3 of every column for the partitioning: shuffle and hand-over of 500k rows
        of 1 KB took 0.99 instead of 1.29 s). Tasks that hash rows themselves keep a
        Murmur3 of every column.

        ``key`` (a column of the batch): rows whose ``key`` is not null are placed by the
        ``xxhash64`` of that column alone, so all rows of one key share a slot; the others
        by their content as above. Spark's shuffle hands a slot the rows of each input
        partition in their order (each map task's output for the slot is one block, read
        in sequence), so rows of one key keep their input partition's order in their slot.
        """
        from pyspark.sql import functions as F  # noqa: N812

        hashed = columns is None and not self.hashes_in_tasks and not self._hashed
        # The schema the sink already read, if any: ``df.columns`` is a py4j round trip.
        names = self._schema.names if self._schema is not None else self._df.columns
        by_key = key is not None and key in names

        def place(df: DataFrame) -> DataFrame:
            if not by_key:  # the placement before per-key order: kept exactly, for replays
                if hashed:
                    return with_row_hash(df).repartition(slots, ROW_HASH_COLUMN)
                return df.repartition(slots, *(columns if columns is not None else df.columns))
            if hashed:
                df = with_row_hash(df)
            if columns is not None:
                content: Column = F.hash(*[F.col(f"`{c}`") for c in columns])
            elif hashed or self._hashed:
                content = F.col(ROW_HASH_COLUMN)
            else:
                content = F.hash(*[F.col(f"`{c}`") for c in df.columns])
            k = F.col(f"`{key}`")
            return df.repartition(slots, F.when(k.isNull(), content).otherwise(F.xxhash64(k)))

        handover = self._handover
        if handover is not None and handover.fallback is not None:
            fallback = handover.fallback
            handover = Handover(handover.rows, lambda: place(fallback()), handover.tripped)
        return SparkBatch(place(self._df), hash_in_tasks=self._hash_in_tasks,
                          handover=handover, hashed=hashed or self._hashed,
                          static_plan=narrow_plan(self._df))

    def fingerprint(self) -> Fingerprint:
        df = self.spark_df
        if self._hashed or not self.hashes_in_tasks:
            return spark_fingerprint(df)
        check_columns(df)
        total = Fingerprint()
        for row in df.mapInArrow(_fingerprint_task, "rows long, digest string").collect():
            total = total + Fingerprint(int(row[0]), int(row[1], 16))
        return total

    def to_arrow(self) -> pa.Table:
        table: pa.Table = self.spark_df.toArrow()
        return table
