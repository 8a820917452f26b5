"""The engine adapter's :class:`~connectors.core.batch.BatchInput`: a Spark DataFrame
whose partitions run the protocol's tasks in ``mapInArrow``.

:class:`SparkBatch` is a Spark DataFrame as the input of one batch: it runs the protocol's
tasks (as one barrier stage when asked), places rows into slots with one shuffle and
fingerprints them; :func:`front_end` makes one of a DataFrame for the engine, classic or
Spark Connect, with the streaming query's id. Its parts (import a name from the module
that defines it):

- :mod:`connectors.spark.inputs`: :class:`~connectors.spark.inputs.SparkInput`, the
  Spark-only capabilities a sink asks a batch input for (``spark_df``, ``with_frame``,
  ``handover``);
- :mod:`connectors.spark._tasks`: what runs in a task (the ``mapInArrow`` wrapper, the
  task's :class:`~connectors.core.batch.TaskInfo`, ``gc.freeze`` and ``TCP_QUICKACK``);
- :mod:`connectors.spark._rows`: the tasks' Arrow schema, row hashes and fingerprints, and
  where rows are hashed (the JVM or the tasks); Columns built once per Spark;
- :mod:`connectors.spark._handover`: handing rows to the tasks in Arrow batches sized by
  the sink's row bound (:class:`~connectors.spark._handover.Handover`), and settings set
  on the session for one job;
- :mod:`connectors.spark._plan`: whether a slot job may run without adaptive execution;
- :mod:`connectors.spark._local`: a small batch's slots run in the driver;
- :mod:`connectors.spark._binding`: which query called the sink, and what a Connect
  session offers instead of a ``SparkContext``;
- :mod:`connectors.spark._failures`: a job that failed on a task's transient error, as one.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa

from connectors.core.batch import BatchInput, TaskFunction, TaskOutcome
from connectors.core.engine import EngineCall
from connectors.core.fingerprint import ROW_HASH_COLUMN, Fingerprint
from connectors.spark._binding import (
    classic_query_id,
    connect_barrier_refusal,
    connect_task_slots,
    is_connect,
    is_spark_frame,
    publish_metrics,
    query_id_for,
    stop_flag,
)
from connectors.spark._connect_gc import collect_between_batches
from connectors.spark._failures import transient_task_error
from connectors.spark._handover import ROW_BOUND_MARK, Handover, arrow_settings, session_settings
from connectors.spark._local import SmallBatchInDriver
from connectors.spark._plan import ADAPTIVE, narrow_plan
from connectors.spark._require import require_spark
from connectors.spark._rows import (
    arrow_schema,
    check_columns,
    flat_schema,
    placement_columns,
    placement_id,
    spark_fingerprint,
    with_row_hash,
)
from connectors.spark._tasks import fingerprint_task, outcome_task, outcome_type
from connectors.spark.inputs import SparkInput

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["SparkBatch", "current_query_id", "front_end"]

logger = logging.getLogger(__name__)


def current_query_id(df: DataFrame) -> str | None:
    """The id of the classic streaming query running ``foreachBatch``, or ``None`` in a
    batch job (and under Spark Connect, which has no such property: see
    :mod:`connectors.spark._binding`).

    Stable across restarts of the same checkpoint; a new checkpoint gets a new id.
    """
    if is_connect(df):
        return None
    return classic_query_id(df)


def front_end(data: Any, call: EngineCall) -> tuple[BatchInput, str | None] | None:
    """The engine front end of classic PySpark and Spark Connect
    (:mod:`connectors.core.engine`): a Spark DataFrame as a :class:`SparkBatch`, with its
    streaming query's id; ``None`` for anything else."""
    if not is_spark_frame(data):
        return None
    require_spark("a sink called with a Spark DataFrame")  # the version: cached after once
    collect_between_batches(data)  # Connect: earlier frames' finalizers before any RPC
    query_id = query_id_for(data, call)
    return SparkBatch(data, hash_in_tasks=call.hash_rows_in_tasks), query_id


class SparkBatch(SparkInput):
    """A Spark DataFrame as the input of one batch.

    ``hash_in_tasks``: the sink prefers tasks to hash rows themselves (see
    :mod:`connectors.spark._rows`); honoured for flat schemas only, and then by
    :meth:`fingerprint` too. ``handover``: see :mod:`connectors.spark._handover`.
    ``hashed`` (internal, :meth:`slotted`): ``df`` ends with :data:`ROW_HASH_COLUMN`.
    ``schema``: :attr:`schema`, when the caller knows it already (a filter of a batch whose
    schema it read: reading it again costs a py4j round trip, Spark's analysis and the
    conversion).
    """

    def __init__(self, df: DataFrame | Callable[[], DataFrame], *,
                 hash_in_tasks: bool = False, handover: Handover | None = None,
                 hashed: bool = False, schema: pa.Schema | None = None,
                 static_plan: bool | Callable[[], bool] = False,
                 in_driver: SmallBatchInDriver | None = None, base: DataFrame | None = None,
                 local_check: tuple[DataFrame, Callable[[pa.Table], None]] | None = None
                 ) -> None:
        if callable(df):  # built on first use (a slotted batch whose slots may run here)
            assert base is not None, "a DataFrame built later needs a base DataFrame"
            self._frame: DataFrame | None = None
            self._build: Callable[[], DataFrame] | None = df
        else:
            self._frame, self._build = df, None
        #: A DataFrame of the same session (for the session and the engine kind).
        self._base: DataFrame = base if base is not None else cast("DataFrame", df)
        #: Small batches in the driver (:mod:`connectors.spark._local`), when offered; the
        #: rows they may collect instead, with the check ``df`` adds (:meth:`with_frame`).
        self._in_driver, self._local_check = in_driver, local_check
        self._static_plan = static_plan
        self._schema: pa.Schema | None = schema
        self._hash_in_tasks = hash_in_tasks
        self._handover = handover
        self._hashed = hashed
        self._unguarded: DataFrame | None = None

    @property
    def _df(self) -> DataFrame:
        if self._frame is None:
            assert self._build is not None
            self._frame = self._build()
        return self._frame

    @property
    def static_plan(self) -> bool:
        """The slot job runs without adaptive execution (see :mod:`connectors.spark._plan`)."""
        if callable(self._static_plan):
            self._static_plan = self._static_plan()
        return self._static_plan

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
        """The batch's DataFrame (without the row hash a slotted batch carries)."""
        df = self._plain()
        return df.drop(ROW_HASH_COLUMN) if self._hashed else df

    @property
    def schema(self) -> pa.Schema:
        if self._schema is None:
            from pyspark.sql.types import StructType

            spark = self._base.sparkSession
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

    def with_frame(self, frame: Any, *, handover: Handover | None = None,
                   schema: pa.Schema | None = None,
                   rows_check: Callable[[pa.Table], None] | None = None) -> SparkBatch:
        return SparkBatch(frame, hash_in_tasks=self._hash_in_tasks, handover=handover,
                          schema=schema, base=self._base, local_check=None if rows_check is None
                          else (self.spark_df, rows_check))

    def task_slots(self) -> int | None:
        if is_connect(self._base):
            return connect_task_slots(self._base.sparkSession)
        return int(self._base.sparkSession.sparkContext.defaultParallelism)

    def barrier_refusal(self) -> str | None:
        if is_connect(self._base):
            return connect_barrier_refusal(self._base.sparkSession)
        conf = self._base.sparkSession.sparkContext.getConf()
        if conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true":
            return ("spark.dynamicAllocation.enabled=true, and Spark refuses barrier "
                    "stages then (turn dynamic allocation off)")
        return None

    def stop_requested(self, query_id: str | None) -> bool:
        """A request in this process (classic), or under Spark Connect in the session's
        configuration, which the client's :func:`connectors.stop_gracefully` sets."""
        if super().stop_requested(query_id):
            return True
        return query_id is not None and is_connect(self._base) \
            and stop_flag(self._base.sparkSession, query_id)

    def await_tasks_ended(self) -> None:
        """Classic: until the status tracker shows no running task in the batch's job
        group (at most 10 s). Connect has no status tracker: a fixed 3 s, longer than
        ``spark.python.task.killTimeout``."""
        from connectors.spark._stop import await_batch_tasks

        await_batch_tasks(self._base, is_connect(self._base))

    def tasks_ended(self) -> bool:
        """Classic: the status tracker shows no running task in the batch's job group
        (asked without waiting). Connect has no status tracker: ``False``."""
        from connectors.spark._stop import batch_tasks_ended

        return batch_tasks_ended(self._base, is_connect(self._base))

    def publish_metrics(self, metrics: dict[str, object]) -> None:
        """Under Spark Connect, into the session's configuration (the client's session,
        which the foreachBatch worker shares): :func:`connectors.spark.last_metrics` reads
        them on the client. In classic PySpark ``sink.last_metrics`` has them already."""
        if is_connect(self._base):
            publish_metrics(self._base.sparkSession, metrics)

    def run_figures(self) -> dict[str, float]:
        """``driver_slots`` (1: the last :meth:`run_tasks` ran the slots in the driver),
        ``driver_rows`` (collected), ``driver_collect_ms``, ``driver_tasks_ms``; or {}."""
        return dict(self._in_driver.figures) if self._in_driver is not None else {}

    def run_tasks(self, fn: TaskFunction, *, barrier: bool = False) -> list[TaskOutcome]:
        try:
            return self._run_tasks(fn, barrier=barrier)
        except Exception as exc:  # a task met an unavailable target: the batch may run again
            transient = transient_task_error(exc)
            if transient is None or transient is exc:
                raise
            raise transient from exc

    def _run_tasks(self, fn: TaskFunction, *, barrier: bool) -> list[TaskOutcome]:
        if self._in_driver is not None and not barrier:
            outcomes = self._in_driver.run(fn)
            if outcomes is not None:
                return outcomes

        def run(df: DataFrame) -> list[TaskOutcome]:
            rows = (self.task_frame(df)
                    .mapInArrow(outcome_task(fn), outcome_type(), barrier=barrier).collect())
            return [TaskOutcome.from_bytes(bytes(row[0])) for row in rows]

        if barrier:
            return self._run_barrier(fn)
        spark = self._base.sparkSession
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
        rows = (self.task_frame().mapInArrow(outcome_task(fn), outcome_type(), barrier=True)
                .repartition(1).collect())
        return [TaskOutcome.from_bytes(bytes(row[0])) for row in rows]

    def slotted(self, slots: int, columns: list[str] | None = None, *,
                key: str | None = None, local_rows: int = 0) -> SparkBatch:
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

        ``local_rows`` (> 0): a batch of at most that many rows may run its slots in the
        driver without the shuffle (:mod:`connectors.spark._local`); not when tasks hash.
        """
        hashed = columns is None and not self.hashes_in_tasks and not self._hashed
        # The schema the sink already read, if any: ``df.columns`` is a py4j round trip.
        names = self._schema.names if self._schema is not None else self._df.columns
        keyed = key if key is not None and key in names else None

        def content(df: DataFrame) -> list[str] | None:
            """The columns whose hash places a row (``None``: the row hash); kept exactly as
            before per-key order and the column cache, for replays."""
            if columns is not None:
                return columns
            return None if hashed or (keyed is not None and self._hashed) else df.columns

        def placement(df: DataFrame) -> tuple[DataFrame, list[Column]]:
            """The rows (the row hash added where it places them) and what places them."""
            rows = with_row_hash(df) if hashed else df
            return rows, placement_columns(df.sparkSession, content(rows), keyed)

        def place(df: DataFrame) -> DataFrame:
            rows, exprs = placement(df)
            return rows.repartition(slots, *exprs)

        @functools.cache  # only if the shuffle runs: a small batch in the driver needs
        def rows() -> DataFrame:  # no frame the sink derived (a check's filter, say)
            return with_row_hash(self._df) if hashed else self._df

        spark, placing = self._base.sparkSession, None if hashed else content(rows())
        exprs = placement_columns(spark, placing, keyed)
        handover = self._handover
        fallback = handover.fallback if handover is not None else None
        if handover is not None and fallback is not None:
            handover = Handover(handover.rows, lambda: place(fallback()), handover.tripped)
        driver, local = None, self._local_check
        if local_rows > 0 and not self.hashes_in_tasks:
            carried = self._hashed and local is None  # the frame has the row hash already

            def collected() -> DataFrame:  # without the check where it is offered (and the
                return local[0] if local is not None else self._df  # row hash: it is added)
            driver = SmallBatchInDriver(
                collected, exprs, slots, local_rows, placement_id(placing, keyed),
                None if local is None else local[1],
                None if carried else lambda row: placement_columns(spark, placing, keyed, row))
        return SparkBatch(lambda: rows().repartition(slots, *exprs),
                          hash_in_tasks=self._hash_in_tasks, handover=handover,
                          hashed=hashed or self._hashed, schema=self.schema,
                          static_plan=lambda: narrow_plan(self._df), in_driver=driver,
                          base=self._base)

    def fingerprint(self) -> Fingerprint:
        df = self.spark_df
        if self._hashed or not self.hashes_in_tasks:
            return spark_fingerprint(df)
        check_columns(df)
        total = Fingerprint()
        for row in df.mapInArrow(fingerprint_task, "rows long, digest string").collect():
            total = total + Fingerprint(int(row[0]), int(row[1], 16))
        return total

    def to_arrow(self) -> pa.Table:
        table: pa.Table = self.spark_df.toArrow()
        return table
