"""Small batches without the slotting shuffle (``small_batch_rows``): the slots run in the
driver, every row in the slot the shuffle would have chosen.

- The two routes place every row alike, for each placement rule (content, key, named
  columns) and slot count, with equal fingerprints per slot: a replay by either route
  finds the other route's markers valid. The driver route keeps the input order in a slot.
- KafkaSink on a real broker: the driver route writes exactly once, keeps per-key order,
  and a batch whose slots committed by one route (the driver killed before the decision)
  is finished by the other, writing nothing twice.
- Real drivers SIGKILLed at both task crash points while the slots run in the driver, then
  restarted: every record once, no transaction left open.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from connectors.core.batch import TaskInfo, TaskOutcome
from connectors.core.errors import BadInputError
from connectors.core.fingerprint import split_row_hash
from connectors.core.ledgers.ledger import TaskCommit
from connectors.core.metrics import BatchMetrics
from connectors.core.protocol.crash import SimulatedCrash, armed
from connectors.core.states import CrashPoint
from connectors.kafka import KafkaSink
from connectors.spark.frames import SparkBatch
from integration.kafka.test_kafka_kill import SLOTS, KafkaJob
from integration.support._driver import reached
from integration.support._kafka import KafkaTarget, target_fixture

pytestmark = [pytest.mark.integration]

kafka = target_fixture("small", partitions=2, create=False)


def _capture(info: TaskInfo, batches: Iterator[pa.RecordBatch]) -> TaskOutcome:
    """A task that returns the ids it got, in order (its figures, by position), and their
    fingerprint."""
    ids: list[int] = []
    from connectors.core.fingerprint import Fingerprint

    fp = Fingerprint()
    for batch in batches:
        batch_fp, data = split_row_hash(batch)
        fp = fp + batch_fp
        ids += data.column("id").to_pylist()
    return TaskOutcome(commit=TaskCommit("t", info.partition, info.task_attempt_id, fp),
                       figures={f"{i:09d}": float(v) for i, v in enumerate(ids)})


def _slots(outcomes: list[TaskOutcome]) -> dict[int, tuple[list[int], Any]]:
    found = {}
    for o in outcomes:
        assert o.commit is not None, o.error
        ids = [int(v) for _, v in sorted(o.figures.items())]
        found[o.commit.partition] = (ids, o.commit.fingerprint)
    return found


@pytest.mark.parametrize("slots", [2, 3])
@pytest.mark.parametrize("rule", ["content", "key", "columns"])
def test_both_routes_put_every_row_in_the_same_slot(spark: Any, rule: str, slots: int) -> None:
    from pyspark.sql import functions as sf

    df = spark.range(0, 300, 1, 3).select(
        "id",
        sf.when(sf.col("id") % 7 == 0, sf.lit(None))
          .otherwise((sf.col("id") % 11).cast("string")).alias("key"),
        sf.concat(sf.lit("v"), sf.col("id").cast("string")).alias("value"))
    columns = ["value"] if rule == "columns" else None
    key = "key" if rule == "key" else None

    shuffled = SparkBatch(df).slotted(slots, columns, key=key)
    by_shuffle = _slots(shuffled.run_tasks(_capture))
    assert shuffled.run_figures() == {}
    local = SparkBatch(df).slotted(slots, columns, key=key, local_rows=300)
    by_driver = _slots(local.run_tasks(_capture))
    assert local.run_figures()["driver_slots"] == 1.0, local.run_figures()

    assert sorted(by_driver) == sorted(by_shuffle) == list(range(slots))
    for slot in range(slots):
        ids, fp = by_driver[slot]
        assert sorted(ids) == sorted(by_shuffle[slot][0]), slot
        assert fp == by_shuffle[slot][1], slot
        assert ids == sorted(ids), f"slot {slot} lost the input order: {ids[:20]}"
    assert sum(len(ids) for ids, _ in by_driver.values()) == 300

    # More rows than allowed: the same batch takes the shuffle.
    bigger = SparkBatch(df).slotted(slots, columns, key=key, local_rows=299)
    assert _slots(bigger.run_tasks(_capture)).keys() == by_shuffle.keys()
    assert bigger.run_figures()["driver_slots"] == 0.0
    assert bigger.run_figures()["driver_rows"] == 300.0  # 100 per partition: all collected
    # Far more rows than allowed: at most local_rows + 1 of each input partition reach the
    # driver (3 partitions of 100 rows, 21 each), then the batch takes the shuffle, whole.
    bounded = SparkBatch(df).slotted(slots, columns, key=key, local_rows=20)
    found = _slots(bounded.run_tasks(_capture))
    assert bounded.run_figures()["driver_slots"] == 0.0
    assert bounded.run_figures()["driver_rows"] == 63.0, bounded.run_figures()
    assert {s: sorted(ids) for s, (ids, _) in found.items()} == \
        {s: sorted(ids) for s, (ids, _) in by_shuffle.items()}


def _records(spark: Any, batch: int, rows: int = 100) -> Any:
    """``rows`` records: ids ``batch*rows..``, 10 keys, the id as value (JSON); one input
    partition, so that every key's records have one input order to keep."""
    from pyspark.sql import functions as sf

    start = batch * rows
    return spark.range(start, start + rows, 1, 1).select(
        (sf.col("id") % 10).cast("string").alias("key"),
        sf.to_json(sf.struct("id")).alias("value"))


def _sink(kafka: KafkaTarget, **kwargs: Any) -> KafkaSink:
    return KafkaSink(kafka.topic, {"bootstrap.servers": kafka.bootstrap},
                     sink_id=kafka.sink_id, slots=SLOTS, create_topic=True,
                     topic_partitions=2, **kwargs)


def _assert_per_key_order(kafka: KafkaTarget) -> None:
    """Each key's ids arrive in increasing order in its partition (one input partition
    holds a key's ids in order here, so the sink must keep that order)."""
    last: dict[bytes, int] = collections.defaultdict(lambda: -1)
    for m in kafka.messages():
        assert m.key is not None
        i = int(m.json()["id"])
        assert i > last[m.key], f"key {m.key!r}: {i} after {last[m.key]}"
        last[m.key] = i


def test_small_batches_are_exact_in_order_and_finish_across_routes(
    spark: Any, kafka: KafkaTarget
) -> None:
    sink = _sink(kafka)
    for b in range(4):
        sink(_records(spark, b), b)
        m = sink.last_metrics
        assert m is not None and m.outcome == "committed"
        # The first batch of a driver run takes the shuffle; later small ones the driver.
        assert m.extra.get("driver_slots", 0.0) == (0.0 if b == 0 else 1.0), m.extra
    kafka.assert_exact(400)
    _assert_per_key_order(kafka)

    # Batch 4: both slots commit in the driver, the driver "dies" before the decision.
    with armed(CrashPoint.BEFORE_DECISION, batch_id=4), pytest.raises(SimulatedCrash):
        sink(_records(spark, 4), 4)
    sink.close()
    # A restarted driver whose slots run as Spark tasks finds both markers valid.
    restarted = _sink(kafka, small_batch_rows=0)
    restarted(_records(spark, 4), 4)
    m = restarted.last_metrics
    assert m is not None and m.outcome == "replayed", m
    assert m.extra.get("driver_slots", 0.0) == 0.0
    # Batch 5: committed by the shuffle's tasks, then the driver dies before the decision.
    with armed(CrashPoint.BEFORE_DECISION, batch_id=5), pytest.raises(SimulatedCrash):
        restarted(_records(spark, 5), 5)
    restarted.close()
    again = _sink(kafka)
    # As if this driver had just written a small batch: its first batch takes the driver.
    again.last_metrics = BatchMetrics(again.sink_id, 4, "commit_in_task", "committed", rows=100)
    again(_records(spark, 5), 5)
    m = again.last_metrics
    assert m is not None and m.outcome == "replayed" and m.extra["driver_slots"] == 1.0, m
    again(_records(spark, 6), 6)
    again.close()
    kafka.assert_exact(700)
    _assert_per_key_order(kafka)


@pytest.mark.parametrize("bad", ["size", "partition"])
def test_a_bad_record_in_a_driver_route_batch_commits_nothing_then_fixed(
    spark: Any, kafka: KafkaTarget, bad: str
) -> None:
    """On the driver route the record checks run in Python on the collected rows, before
    any slot writes (not in the collect's plan): one record too large, or naming partition
    5 of a 2-partition topic, fails the batch with the fix in the message; the slots,
    opened during the collect (their kept producers' probes), abort: no slot wrote
    anything, no transaction stays open; the fixed batch is then exact."""
    from pyspark.sql import functions as sf

    kafka.create(partitions=2, config={"max.message.bytes": "20000"})

    def records(batch: int, broken: bool) -> Any:
        ids = spark.range(batch * 100, batch * 100 + 100, 1, 1)
        value = sf.to_json(sf.struct("id"))
        partition = (sf.col("id") % 2).cast("int")
        if broken and bad == "size":
            value = sf.when(sf.col("id") == 150, sf.concat(value, sf.repeat(sf.lit(" "), 30_000))
                            ).otherwise(value)
        if broken and bad == "partition":
            partition = sf.when(sf.col("id") == 150, sf.lit(5)).otherwise(partition)
        return ids.select((sf.col("id") % 10).cast("string").alias("key"),
                          value.alias("value"), partition.alias("partition"))

    sink = _sink(kafka)
    sink(records(0, False), 0)
    fix = "max.message.bytes" if bad == "size" else "has 2 partitions"
    with pytest.raises(BadInputError, match=fix) as info:
        sink(records(1, True), 1)
    if bad == "size":  # the Python check's words ("a record is about" from Spark's plan)
        assert "record 50 of a batch is about" in str(info.value), info.value
    m = sink.last_metrics
    assert m is not None and m.outcome == "failed", m
    # Collected to the driver, checked there, and no slot committed.
    assert m.extra["driver_rows"] == 100.0 and m.extra["driver_slots"] == 0.0, m.extra
    kafka.assert_exact(100)
    sink(records(1, False), 1)
    sink.close()
    kafka.assert_exact(200)
    _assert_per_key_order(kafka)


def test_a_burst_after_small_batches_reaches_the_driver_bounded_then_takes_the_shuffle(
    spark: Any, kafka: KafkaTarget
) -> None:
    """After small batches a large one is offered the driver route: at most
    ``small_batch_rows + 1`` records of each input partition reach the driver (a burst of
    500,000 records of 1 KB once ran a 3 GB driver out of memory), then the whole batch
    takes the shuffle, exactly (each key's records span input partitions here, so no order
    across them is asserted: Spark's writer keeps none either)."""
    from pyspark.sql import functions as sf

    def records(start: int, end: int, partitions: int) -> Any:
        return spark.range(start, end, 1, partitions).select(
            (sf.col("id") % 10).cast("string").alias("key"),
            sf.to_json(sf.struct("id")).alias("value"))

    sink = _sink(kafka, small_batch_rows=50)
    sink(records(0, 40, 1), 0)
    sink(records(40, 80, 1), 1)
    m = sink.last_metrics
    assert m is not None and m.extra["driver_slots"] == 1.0, m
    sink(records(80, 6080, 3), 2)
    m = sink.last_metrics
    assert m is not None and m.outcome == "committed" and m.rows == 6000, m
    assert m.extra["driver_slots"] == 0.0 and m.extra["driver_rows"] == 3 * 51, m.extra
    sink.close()
    kafka.assert_exact(6080)


@pytest.mark.slow
def test_driver_killed_inside_its_slots_then_restarts_are_exact(
    tmp_path: Path, kafka: KafkaTarget
) -> None:
    """The rate source, 4 batches of 400 records, slots in the driver from the second
    batch of each run on: the driver is SIGKILLed while slot 1 has produced but not
    committed (slot 0 may have committed), then in the next run after slot 0 committed;
    the third run finishes. Every record once, no transaction left open."""
    kafka.create(partitions=2)
    job = KafkaJob(tmp_path, kafka, source="rate", small_batch_rows=1000)
    plan = [(CrashPoint.BEFORE_PRECOMMIT, 2, 1), (CrashPoint.AFTER_PRECOMMIT, 3, 0)]
    for point, batch, slot in plan:
        run = job.run(crash=f"{point.value}:batch={batch}:partition={slot}")
        # A task's crash point kills its Python worker, never the driver: -9 proves the
        # slot ran in the driver.
        assert run.returncode == -9, f"the driver was not SIGKILLed:\n{run.tail()}"
        assert job.reached(point, batch, partition=slot), reached(job.crash_log)
        routes = {int(m["batch_id"]): float(m.get("driver_slots", 0)) for m in run.metrics()}
        assert routes.get(batch - 1) == (1.0 if batch == 2 else 0.0), routes
    final = job.run()
    assert final.returncode == 0, final.tail()
    job.assert_exact()
    for slot, ms in job.markers().items():
        batches = [m["batch_id"] for m in ms]
        assert len(batches) == len(set(batches)), (slot, batches)


def test_the_placement_check_runs_once_per_spark_not_once_per_stream_batch(
    spark: Any, tmp_path: Path
) -> None:
    """Classic ``foreachBatch`` hands every batch a new Python ``SparkSession``: the check
    (one job with three shuffles) and the built Columns (~140 py4j calls a batch) must
    still be keyed by the one Spark behind them."""
    import time

    from connectors.spark._rows import placement_columns, spark_key

    keys: list[object] = []
    built: set[int] = set()  # the placement's Columns: built once too, not per batch

    def record(df: Any, _batch: int) -> None:
        keys.append(spark_key(df.sparkSession)[0])
        built.add(id(placement_columns(df.sparkSession, ["value"], "key")))

    stream = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 5).load()
              .writeStream.option("checkpointLocation", str(tmp_path / "ckpt"))
              .foreachBatch(record).start())
    try:
        deadline = time.monotonic() + 120
        while len(keys) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stream.stop()
    assert len(keys) >= 3 and set(keys) == {spark_key(spark)[0]}, keys
    assert built == {id(placement_columns(spark, ["value"], "key"))}, built
