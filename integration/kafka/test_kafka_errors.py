"""KafkaSink's error cases on real Spark and a real Kafka broker: each bad batch raises a
clear error, aborts what it wrote and leaves nothing visible to ``read_committed``
consumers (and no open transaction); after the fix, running the same batch again delivers
every record exactly once.

The sink is called directly as ``sink(df, batch_id)`` (a batch job) on the shared
in-process ``spark`` session (``local[2]``).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)

from connectors import (
    BadInputError,
    ConfigurationError,
    NonDeterministicReplayError,
    TransientError,
)
from connectors.core.protocol.crash import SimulatedCrash, armed
from connectors.core.states import CrashPoint
from connectors.kafka import KafkaSink
from integration.support._kafka import (
    KafkaTarget,
    _admin,
    ledger_batches,
    markers,
    open_transactions,
    target_fixture,
)

pytestmark = [pytest.mark.integration]

ROWS = 400


kafka = target_fixture("err", partitions=2, create=False)


def _rows(spark: Any, n: int = ROWS, big: int | None = None, big_size: int = 0) -> Any:
    """``n`` records, key = id, value = JSON with the id; record ``big`` gets a large pad."""
    from pyspark.sql import functions as sf

    df = spark.range(n).select(
        sf.col("id").cast("string").alias("key"),
        sf.to_json(sf.struct(
            sf.col("id"),
            sf.when(sf.col("id") == sf.lit(big if big is not None else -1),
                    sf.repeat(sf.lit("x"), big_size)).otherwise(sf.lit("")).alias("pad"),
        )).alias("value"),
    )
    return df


def _sink(kafka: KafkaTarget, **kwargs: Any) -> KafkaSink:
    config = {"bootstrap.servers": kafka.bootstrap, **kwargs.pop("config", {})}
    kwargs.setdefault("slots", 2)
    return KafkaSink(kwargs.pop("topic", kafka.topic), config, sink_id=kafka.sink_id, **kwargs)


def _nothing_visible(kafka: KafkaTarget) -> None:
    existing = set(_admin(kafka.bootstrap).list_topics(timeout=30).topics)
    if kafka.topic in existing:
        assert kafka.messages() == [], "a read_committed consumer sees records of a bad batch"
    if kafka.marker_topic in existing:
        assert markers(kafka.bootstrap, kafka.marker_topic) == {}
        topics = [t for t in (kafka.topic, kafka.marker_topic) if t in existing]
        assert not open_transactions(kafka.bootstrap, topics)
    if kafka.ledger_topic in existing:
        assert ledger_batches(kafka.bootstrap, kafka.ledger_topic) == {}


def _high_watermark(kafka: KafkaTarget, topic: str) -> int:
    from integration.support._kafka import _offsets

    return sum(hi for _, hi in _offsets(kafka.bootstrap, topic, "read_uncommitted").values())


def test_missing_value_column_then_fixed(spark: Any, kafka: KafkaTarget) -> None:
    kafka.create()
    sink = _sink(kafka)
    with pytest.raises(BadInputError, match="no 'value' column"):
        sink(_rows(spark).withColumnRenamed("value", "payload"), 0)
    _nothing_visible(kafka)
    sink(_rows(spark), 0)
    kafka.assert_exact(ROWS)


def test_wrong_column_types_are_named(spark: Any, kafka: KafkaTarget) -> None:
    kafka.create()
    sink = _sink(kafka)
    bad = spark.range(3).selectExpr("id AS value", "CAST(id AS INT) AS key",
                                    "'x' AS headers", "'p' AS partition")
    with pytest.raises(BadInputError) as info:
        sink(bad, 0)
    text = str(info.value)
    for part in ("'value' is int64", "'key' is int32", "'headers' is string",
                 "'partition' is string"):
        assert part in text, text
    _nothing_visible(kafka)
    sink(_rows(spark), 0)
    kafka.assert_exact(ROWS)


@pytest.mark.parametrize("barrier", [pytest.param(True, id="barrier"),
                                     pytest.param(False, id="no-barrier")])
def test_record_larger_than_max_message_bytes_commits_nothing_then_fixed(
    barrier: bool, spark: Any, kafka: KafkaTarget
) -> None:
    """One record of one slot is too large: no slot commits (barrier: the other slot wrote
    and flushed, then aborted; no barrier: the check job stops the batch before any
    slot runs). Raising the topic's limit fixes it; the same batch is then exact."""
    kafka.create(config={"max.message.bytes": "20000"})
    sink = _sink(kafka, barrier=barrier)
    df = _rows(spark, big=123, big_size=30_000)
    with pytest.raises(BadInputError, match="larger than the 20000 bytes") as info:
        sink(df, 0)
    assert "max.message.bytes" in str(info.value)
    _nothing_visible(kafka)
    if barrier:  # records were produced, then aborted: invisible, not absent
        assert _high_watermark(kafka, kafka.topic) > 0
    admin = _admin(kafka.bootstrap)
    resource = ConfigResource(ConfigResource.Type.TOPIC, kafka.topic, incremental_configs=[
        ConfigEntry("max.message.bytes", "100000",
                    incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)
    sink(df, 0)
    kafka.assert_exact(ROWS)


def test_partition_out_of_range_for_the_given_topic_commits_nothing_then_fixed(
    spark: Any, kafka: KafkaTarget
) -> None:
    """The default mode checks records in the slotting shuffle's map stage: one record
    names partition 5 of a 2-partition topic; the job fails before any slot runs, with the
    fix in the message; nothing is visible and no transaction stays open. Without the bad
    partition, the same batch is then exact."""
    from pyspark.sql import functions as sf

    kafka.create()
    sink = _sink(kafka)
    part = sf.when(sf.col("key") == "7", sf.lit(5)).otherwise(sf.lit(None).cast("int"))
    with pytest.raises(BadInputError, match=r"holds 5, but topic .* has 2 partitions"):
        sink(_rows(spark).withColumn("partition", part), 0)
    _nothing_visible(kafka)
    assert _high_watermark(kafka, kafka.topic) == 0  # no slot produced anything
    sink(_rows(spark).withColumn("partition", sf.lit(None).cast("int")), 0)
    kafka.assert_exact(ROWS)


def test_unknown_topic_then_create_topic(spark: Any, kafka: KafkaTarget) -> None:
    sink = _sink(kafka)
    with pytest.raises(BadInputError, match="does not exist: create it, or pass create_topic"):
        sink(_rows(spark), 0)
    _nothing_visible(kafka)
    sink = _sink(kafka, create_topic=True, topic_partitions=3)
    sink(_rows(spark), 0)
    kafka.created.append(kafka.topic)
    kafka.assert_exact(ROWS)


def test_unknown_topic_in_topic_column_commits_nothing(spark: Any, kafka: KafkaTarget) -> None:
    from pyspark.sql import functions as sf

    kafka.create()
    sink = _sink(kafka, topic=None)
    df = _rows(spark).withColumn(
        "topic", sf.when(sf.col("key") == "7", sf.lit(f"{kafka.topic}-missing"))
        .otherwise(sf.lit(kafka.topic)))
    with pytest.raises(BadInputError, match="does not exist"):
        sink(df, 0)
    _nothing_visible(kafka)
    sink(_rows(spark).withColumn("topic", sf.lit(kafka.topic)), 0)
    kafka.assert_exact(ROWS)


def test_unreachable_broker_is_a_clear_error(spark: Any, kafka: KafkaTarget) -> None:
    sink = KafkaSink(kafka.topic, {"bootstrap.servers": "127.0.0.1:1"}, sink_id=kafka.sink_id,
                     operation_timeout=3, outage_timeout=5)  # the batch runs again for 5 s
    with pytest.raises(TransientError, match="no answer from the Kafka cluster") as info:
        sink(_rows(spark, 5), 0)
    assert "127.0.0.1:1" in str(info.value)
    kafka.create()  # the fix: the right address
    _sink(kafka)(_rows(spark), 0)
    kafka.assert_exact(ROWS)


def test_sasl_failure_is_a_clear_error_and_never_shows_the_password(
    spark: Any, kafka: KafkaTarget, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "hunter2-very-secret"
    caplog.set_level(logging.DEBUG)
    sink = _sink(kafka, operation_timeout=4, config={
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
        "sasl.username": "app", "sasl.password": secret})
    with pytest.raises(ConfigurationError, match="refused authentication") as info:
        sink(_rows(spark, 5), 0)
    for text in (str(info.value), repr(info.value), repr(sink), str(sink.config), caplog.text):
        assert secret not in text
    assert "sasl.password" in str(info.value)  # the fix names the setting
    _nothing_visible(kafka)
    kafka.create()  # the fix: this broker's listener is PLAINTEXT
    _sink(kafka)(_rows(spark), 0)
    kafka.assert_exact(ROWS)


def test_transaction_timeout_above_the_broker_maximum_is_refused(
    spark: Any, kafka: KafkaTarget
) -> None:
    kafka.create()
    sink = _sink(kafka, config={"transaction.timeout.ms": 3_600_000})
    with pytest.raises(ConfigurationError, match=r"transaction\.max\.timeout\.ms=900000"):
        sink(_rows(spark, 5), 0)
    _nothing_visible(kafka)


def test_barrier_needs_a_task_slot_per_sink_slot(spark: Any, kafka: KafkaTarget) -> None:
    kafka.create()
    with pytest.raises(ConfigurationError, match="barrier=True needs one free task slot"):
        _sink(kafka, slots=4, barrier=True)(_rows(spark, 5), 0)
    _nothing_visible(kafka)


def test_replay_with_other_rows_in_a_committed_slot_is_refused(
    spark: Any, kafka: KafkaTarget
) -> None:
    """The driver dies after every slot committed batch 0 and before the ledger records
    it; the replay holds other rows: the slots find their markers, compare fingerprints,
    and the batch fails with NonDeterministicReplayError instead of writing twice. The
    same rows replay cleanly. Meanwhile the slot count cannot change."""
    kafka.create()
    with armed(CrashPoint.BEFORE_DECISION, batch_id=0), pytest.raises(SimulatedCrash):
        _sink(kafka)(_rows(spark), 0)
    assert set(markers(kafka.bootstrap, kafka.marker_topic)) == {0, 1}
    with pytest.raises(NonDeterministicReplayError, match="differs from what was committed"):
        _sink(kafka)(_rows(spark, ROWS + 1), 0)
    with pytest.raises(ConfigurationError, match="cannot change to 1 while batch 0"):
        _sink(kafka, slots=1)(_rows(spark), 0)
    sink = _sink(kafka)
    sink(_rows(spark), 0)
    assert sink.last_metrics is not None and sink.last_metrics.outcome == "replayed"
    kafka.assert_exact(ROWS)
    # Batch 0 is complete: now the slot count may change.
    from pyspark.sql import functions as sf

    more = _rows(spark, 2 * ROWS).where(sf.col("key").cast("int") >= ROWS)
    _sink(kafka, slots=1)(more, 1)
    kafka.assert_exact(2 * ROWS)
