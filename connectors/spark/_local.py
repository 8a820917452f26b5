"""Small slotted batches without the shuffle: the slots' tasks run in the driver.

A task-commit sink places rows into slots with a shuffle (``repartition(slots, <hash>)``)
and runs one Spark task per slot: for a batch of a few hundred rows that is a two-stage
job with a Python stage, several times what Spark's own Kafka writer takes (the figures:
benchmarks/README.md). When the
sink allows it (``local_rows``) and expects a small batch, :class:`SmallBatchInDriver` instead

1. collects the batch to the driver, each row with the slot the shuffle would have put it
   in (``pmod(hash(<placement>), slots)``: the expression of Spark's ``HashPartitioning``),
   in one Spark job of one stage without Python workers, and at most ``local_rows + 1``
   rows of each input partition (a filter on the row's number within its partition, the
   low 33 bits of ``monotonically_increasing_id``), so a burst after small batches costs
   the driver a bounded collect, not the burst; where the sink gave its record check as a
   function of rows too (``rows_check`` of
   :meth:`~connectors.core.batch.BatchInput.with_frame`), without that check in the plan
   (its expression costs the collect Spark's analysis, optimizer and codegen);
2. if that gives more than ``local_rows`` rows, gives up (the caller runs the shuffle as
   usual); otherwise runs the sink's check function on the rows, so a bad record fails
   the batch before any slot writes, as the check in the shuffle's map stage does;
3. runs the sink's task function once per slot, in a thread each, on a pickled copy of it
   (what a Spark task would receive), with the slot's rows in input order.

The slots' threads start before the collect: a task opens its slot (a Kafka slot begins
its transaction and proves its kept producer with a round trip) and reads its marker while
the collect runs, then waits for its rows (:class:`_Rows`). When the batch turns out not
small, or its check refuses a record, every slot's rows end in :class:`NotCollected`
instead: the task aborts what it opened, and nothing is written.

Every row lands in the slot the shuffle would have chosen, so which route a batch took
changes nothing a replay sees: a replay by either route finds the same rows in the same
slots and compares them with the slots' committed markers. The equality of the two
placements is checked once per Spark (:func:`placement_matches`, one small job);
where it does not hold, every batch takes the shuffle. A slot task that raises (a broker
error, not bad input: that is returned) sends the whole batch to the shuffle route, where
Spark retries tasks as usual; slots that committed meanwhile find their markers there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from connectors.core.batch import TaskFunction, TaskInfo, TaskOutcome
from connectors.core.fingerprint import ROW_HASH_COLUMN
from connectors.spark._rows import per_spark, row_hash_of

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["ROW_NUMBER_MASK", "SLOT_COLUMN", "SmallBatchInDriver", "placement_matches"]

logger = logging.getLogger(__name__)

#: The column that carries each row's slot to the driver (dropped before the task sees it).
SLOT_COLUMN = "__connectors_slot"
#: The bits of ``monotonically_increasing_id`` that number a row within its partition
#: (Spark's documentation: the partition id in the upper 31 bits, the row in the lower 33).
ROW_NUMBER_MASK = (1 << 33) - 1

def placement_matches(spark: SparkSession) -> bool:
    """Whether ``pmod(hash(cols), n)`` is the partition ``repartition(n, cols)`` puts a row
    in, on this Spark: one job over 600 rows and three partition counts, once per Spark
    (:func:`~connectors.spark._rows.per_spark`: its answer kept). ``False`` (logged once as
    a WARNING) when it differs or fails."""
    return per_spark(spark, ("placement_matches",), lambda: _check_placement(spark))


def _check_placement(spark: SparkSession) -> bool:
    from pyspark.sql import functions as F  # noqa: N812

    ok = True
    try:
        base = spark.range(0, 600, 1, 3).select(
            F.xxhash64("id").alias("h"), F.col("id").cast("string").alias("s"))
        parts = []
        for n in (2, 3, 7):
            parts.append(base.repartition(n, "h", "s").select(
                (F.spark_partition_id() != F.pmod(F.hash("h", "s"), F.lit(n))).alias("bad")))
        union = parts[0].unionAll(parts[1]).unionAll(parts[2])
        bad = union.where("bad").count()
        ok = bad == 0
        if not ok:
            logger.warning("this Spark places rows by repartition(n, cols) other than by "
                           "pmod(hash(cols), n) (%d of 1,800 rows): small batches take the "
                           "slotting shuffle like every other batch", bad)
    except Exception as exc:
        ok = False
        logger.warning("checking Spark's hash placement failed (%s): small batches take the "
                       "slotting shuffle like every other batch", type(exc).__name__)
    return ok


class SmallBatchInDriver:
    """Runs a slotted batch of at most ``limit`` rows in the driver (see the module
    docstring). ``frame`` builds the batch's rows before the shuffle, the row hash last if
    the tasks expect it; ``placement`` is the expression the shuffle partitions by.

    ``placement_of`` (instead of ``placement``): ``frame`` comes without the row hash the
    tasks expect, and this gives the placement for the row hash's expression; the collect
    then adds the row hash and the slot in one projection (Spark analyses each DataFrame
    operation of a classic PySpark plan as it is built: one operation fewer per batch)."""

    def __init__(self, frame: Callable[[], DataFrame], placement: list[Column], slots: int,
                 limit: int, placement_id: tuple[object, ...] | None = None,
                 check: Callable[[pa.Table], None] | None = None,
                 placement_of: Callable[[Column], list[Column]] | None = None) -> None:
        self._frame = frame
        self._placement_of = placement_of
        #: The rows' check, when ``frame`` is without the one the shuffle's rows carry: it
        #: runs on the collected rows before any slot (and raises for a bad row).
        self._check = check
        self._placement = placement
        #: What identifies ``placement`` (:func:`~connectors.spark._rows.placement_id`):
        #: the slot and bound columns are then built once per Spark, not per batch.
        self._placement_id = placement_id
        self.slots = slots
        self.limit = limit
        #: What the last :meth:`run` did, for the batch's metrics.
        self.figures: dict[str, float] = {}

    def collect(self) -> pa.Table | None:
        """The batch's rows with their slots, or ``None`` when there are more than
        ``limit`` (or the collect failed: the shuffle route then reports it).

        One stage, bounded per input partition: a filter keeps the first ``limit + 1`` rows
        of each (their number within the partition: the low 33 bits of Spark's documented
        ``monotonically_increasing_id``), so at most ``partitions * (limit + 1)`` rows
        reach the driver whatever the batch holds (a batch of 500,000 rows of 1 KB after
        small ones ran a 3 GB driver out of memory before this bound). The tasks still
        read their whole partition. A ``limit`` instead would add a second stage (Spark's
        ``CollectLimitExec`` gathers through a single-partition exchange for an Arrow
        collect), which costs far more than the filter (benchmarks/README.md).
        """
        from pyspark.sql import functions as F  # noqa: N812

        df = self._frame()
        if not placement_matches(df.sparkSession):
            return None
        placement_of = self._placement_of
        hashed = None if placement_of is None else row_hash_of(df)

        def build() -> tuple[Column, Column]:
            placement = (self._placement if placement_of is None or hashed is None
                         else placement_of(hashed))
            slot = F.pmod(F.hash(*placement), F.lit(self.slots)).cast("int")
            within = F.monotonically_increasing_id().bitwiseAND(F.lit(ROW_NUMBER_MASK))
            return slot, within <= F.lit(self.limit)

        slot, bound = build() if self._placement_id is None else per_spark(
            df.sparkSession, ("driver_slots", self._placement_id, self.slots, self.limit,
                              None if hashed is None else df.schema.json()), build)
        started = time.monotonic()
        try:
            kept = df.where(bound)
            table: pa.Table = (kept.withColumn(SLOT_COLUMN, slot) if hashed is None else
                               kept.withColumns({ROW_HASH_COLUMN: hashed, SLOT_COLUMN: slot})
                               ).toArrow()
        except Exception as exc:
            logger.info("collecting a small batch to the driver failed (%s): it takes the "
                        "slotting shuffle", type(exc).__name__)
            return None
        finally:
            self.figures["driver_collect_ms"] = (time.monotonic() - started) * 1000
        self.figures["driver_rows"] = float(table.num_rows)
        if table.num_rows > self.limit:
            logger.info("a batch of more than %d rows (%d collected, at most %d per input "
                        "partition): it takes the slotting shuffle", self.limit,
                        table.num_rows, self.limit + 1)
            return None
        return table

    def run(self, fn: TaskFunction) -> list[TaskOutcome] | None:
        """One outcome per slot, or ``None``: the batch is not small (or a slot task
        raised), run it with the shuffle. The slots open while the batch is collected."""
        from pyspark import cloudpickle

        self.figures = {"driver_slots": 0.0}
        shipped = cloudpickle.dumps(fn)  # type: ignore[no-untyped-call]  # a task's copy
        feeds = [_Rows() for _ in range(self.slots)]

        def task(slot: int) -> TaskOutcome:
            info = TaskInfo(partition=slot, attempt_number=0, task_attempt_id=-1 - slot)
            copy: TaskFunction = cloudpickle.loads(shipped)
            return copy(info, feeds[slot].batches())

        handed = time.monotonic()
        with ThreadPoolExecutor(self.slots, thread_name_prefix="connectors-slot") as pool:
            running = [pool.submit(task, slot) for slot in range(self.slots)]
            try:
                table = self.collect()
                if table is not None:
                    slots_of = table.column(SLOT_COLUMN).to_numpy(zero_copy_only=False)
                    rows = table.drop_columns([SLOT_COLUMN])
                    if self._check is not None:  # before any slot writes: a bad row fails
                        self._check(rows)
                    mine = [rows.take(pa.array(np.flatnonzero(slots_of == slot)))
                            for slot in range(self.slots)]  # input order kept; all or none
                    for feed, table_of_slot in zip(feeds, mine, strict=True):
                        feed.give(table_of_slot)
                    handed = time.monotonic()
            finally:
                for feed in feeds:  # not collected, or the check raised: the slots abort
                    feed.give(None)
            if table is None:
                wait(running)
                return None
            try:
                outcomes = [future.result() for future in running]
            except Exception as exc:
                logger.warning("a slot of a small batch failed in the driver (%s): the batch "
                               "runs again with the slotting shuffle, where Spark retries "
                               "tasks; slots that committed find their markers there",
                               type(exc).__name__)
                return None
        # The slots' time after the hand-over of their rows (they opened during the collect).
        self.figures.update(driver_slots=1.0, driver_tasks_ms=(time.monotonic() - handed) * 1000)
        return outcomes


class NotCollected(Exception):  # not an error: the batch takes the shuffle
    """A slot task's rows when the driver did not collect them (the batch is not small,
    the collect failed, or the check refused a record): the task aborts its slot."""


class _Rows:
    """One slot's rows, handed over once the batch is collected (or :class:`NotCollected`);
    the first :meth:`give` counts."""

    def __init__(self) -> None:
        self._given = threading.Event()
        self._table: pa.Table | None = None

    def give(self, table: pa.Table | None) -> None:
        if not self._given.is_set():
            self._table = table
            self._given.set()

    def batches(self) -> Iterator[pa.RecordBatch]:
        self._given.wait()
        if self._table is None:
            raise NotCollected("the batch was not collected to the driver")
        yield from self._table.to_batches()
