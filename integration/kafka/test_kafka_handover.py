"""KafkaSink hands rows to its slot tasks without Spark's per-row Arrow size check, and a
row over the assumed bound sends the batch back to Spark's batching: exactly once either
way (real Spark, a real Kafka broker).

``barrier=False`` with a given topic assumes rows of at most ``maxBytesPerBatch /
maxRecordsPerBatch`` bytes (6,710 with Spark's defaults) and guards that in the record
check before the slotting shuffle; a batch with a larger row fails that map stage before
any slot runs, runs again with Spark's batching, and the sink assumes 8x larger rows for
its next batches, until fewer than 1,024 rows would fit a batch. With a ``topic`` column
the check job measures the largest row instead.
"""

from __future__ import annotations

from typing import Any

import pytest

from connectors.kafka import KafkaSink
from connectors.spark._handover import MAX_BYTES, MAX_RECORDS, handover_rows
from integration.support._kafka import KafkaTarget, target_fixture

pytestmark = [pytest.mark.integration]

ROWS = 300

kafka = target_fixture("handover", partitions=2)


def _frame(spark: Any, batch: int, pad: int = 0, topic: str | None = None) -> Any:
    """``ROWS`` records with ids ``batch*ROWS..``; the first one padded by ``pad`` bytes."""
    from pyspark.sql import functions as sf

    start = batch * ROWS
    ids = spark.range(start, start + ROWS, 1, 2)
    cols = [
        sf.col("id").cast("string").alias("key"),
        sf.to_json(sf.struct(
            sf.col("id"),
            sf.when(sf.col("id") == sf.lit(start), sf.repeat(sf.lit("x"), pad))
            .otherwise(sf.lit("")).alias("pad"),
        )).alias("value"),
    ]
    if topic is not None:
        cols.append(sf.lit(topic).alias("topic"))
    return ids.select(*cols)


def _settings(spark: Any) -> tuple[Any, Any]:
    return spark.conf.get(MAX_RECORDS, None), spark.conf.get(MAX_BYTES, None)


def test_a_row_over_the_assumed_bound_reruns_the_batch_then_the_bound_grows(
    spark: Any, kafka: KafkaTarget
) -> None:
    # The slotting shuffle's hand-over (small batches in the driver hand nothing over:
    # the next test).
    sink = KafkaSink(kafka.topic, {"bootstrap.servers": kafka.bootstrap},
                     sink_id=kafka.sink_id, slots=2, small_batch_rows=0)
    before = _settings(spark)

    def batch(n: int, pad: int = 0) -> float:
        sink(_frame(spark, n, pad), n)
        assert _settings(spark) == before, "the session's Arrow settings were not restored"
        assert sink.last_metrics is not None
        return sink.last_metrics.extra["arrow_batch_rows"]

    assert batch(0) == 10_000  # Spark's defaults: 64 MB / 10,000 rows -> 6,710 bytes a row
    first = sink._checks.frames.row_bound
    assert first == 64 * 1024 * 1024 // 10_000
    assert batch(1, pad=20_000) == 0  # guard tripped: Spark's batching, exactly once
    assert sink._checks.frames.row_bound == 8 * first
    assert batch(2, pad=30_000) == 64 * 1024 * 1024 // (8 * first)  # fits the new bound
    assert batch(3, pad=100_000) == 0  # tripped again: 64 * first leaves < 1,024 rows
    assert batch(4) == 0  # and the sink keeps Spark's batching from then on
    kafka.assert_exact(5 * ROWS)
    padded = {m.json()["id"]: len(m.json()["pad"]) for m in kafka.messages()
              if m.json()["pad"]}
    assert padded == {ROWS: 20_000, 2 * ROWS: 30_000, 3 * ROWS: 100_000}


def test_small_batches_in_the_driver_take_rows_over_the_assumed_bound_as_they_are(
    spark: Any, kafka: KafkaTarget
) -> None:
    """A small batch whose slots run in the driver hands no Arrow batches to Python
    workers: a row over the assumed bound needs no rerun there, and the bound stays."""
    sink = KafkaSink(kafka.topic, {"bootstrap.servers": kafka.bootstrap},
                     sink_id=kafka.sink_id, slots=2)
    sink(_frame(spark, 0), 0)  # a driver run's first batch: the shuffle
    first = sink._checks.frames.row_bound
    sink(_frame(spark, 1, pad=20_000), 1)
    m = sink.last_metrics
    assert m is not None and m.outcome == "committed" and m.extra["driver_slots"] == 1.0, m
    assert sink._checks.frames.row_bound == first
    sink.close()
    kafka.assert_exact(2 * ROWS)
    padded = {m.json()["id"]: len(m.json()["pad"]) for m in kafka.messages()
              if m.json()["pad"]}
    assert padded == {ROWS: 20_000}


def test_the_user_s_arrow_settings_size_the_batches_and_are_restored(
    spark: Any, kafka: KafkaTarget
) -> None:
    sink = KafkaSink(kafka.topic, {"bootstrap.servers": kafka.bootstrap},
                     sink_id=kafka.sink_id, slots=2)
    spark.conf.set(MAX_RECORDS, "4000")
    spark.conf.set(MAX_BYTES, "16m")
    try:
        sink(_frame(spark, 0), 0)
        assert sink.last_metrics is not None
        assert sink.last_metrics.extra["arrow_batch_rows"] == 4000
        assert sink._checks.frames.row_bound == 16 * 1024 * 1024 // 4000
        assert _settings(spark) == ("4000", "16m")
    finally:
        spark.conf.unset(MAX_RECORDS)
        spark.conf.unset(MAX_BYTES)
    # Size check already off by the user: the sink leaves Spark's settings alone.
    other = KafkaSink(kafka.topic, {"bootstrap.servers": kafka.bootstrap},
                      sink_id=kafka.sink_id + "-b", slots=2)
    spark.conf.set(MAX_BYTES, str(2**31 - 1))
    try:
        other(_frame(spark, 1), 0)
        assert other.last_metrics is not None
        assert other.last_metrics.extra["arrow_batch_rows"] == 0
    finally:
        spark.conf.unset(MAX_BYTES)
    kafka.assert_exact(2 * ROWS)


def test_a_topic_column_sizes_the_batches_from_the_largest_row(
    spark: Any, kafka: KafkaTarget
) -> None:
    sink = KafkaSink(None, {"bootstrap.servers": kafka.bootstrap}, sink_id=kafka.sink_id,
                     slots=2)
    sink(_frame(spark, 0, pad=40_000, topic=kafka.topic), 0)
    assert sink.last_metrics is not None
    # The largest row: value '{"id":0,"pad":"x..."}', key "0", the topic, 64 fixed bytes.
    largest = len('{"id":0,"pad":""}') + 40_000 + 1 + len(kafka.topic) + 64
    rows = sink.last_metrics.extra["arrow_batch_rows"]
    assert rows == handover_rows(spark, largest) == 64 * 1024 * 1024 // largest
    sink(_frame(spark, 1, pad=200_000, topic=kafka.topic), 1)  # 330 rows of 200 KB a batch
    assert sink.last_metrics is not None
    assert sink.last_metrics.extra["arrow_batch_rows"] == 0
    kafka.assert_exact(2 * ROWS)
