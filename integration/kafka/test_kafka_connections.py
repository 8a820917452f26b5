"""KafkaSink's client connections on a real (one-broker) cluster.

On a cluster of at most ``DENSE_MAX_BROKERS`` brokers the sink's clients connect to every
broker at once (``enable.sparse.connections=false``): a new slot producer no longer waits
for librdkafka's spacing of sparse connections. A config that sets the property keeps its
value. Either way every record arrives exactly once, a slot task that starts a new
producer included.
"""

from __future__ import annotations

import json
import time
import uuid

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from connectors.core.fingerprint import fingerprint_batch
from connectors.core.templates.tasks import SlotMarker, SlotTransaction
from connectors.kafka import KafkaSink
from connectors.kafka._config import KafkaConfig
from connectors.kafka._io import Admin, TopicInfo, read_committed
from connectors.kafka._ledger import KafkaLedger
from connectors.kafka._pool import MarkerReaders, SlotProducers
from integration.support._kafka import KafkaTarget, target_fixture

pytestmark = [pytest.mark.integration]

kafka = target_fixture("conn", partitions=2)


def _rows(ids: range) -> list[tuple[str]]:
    return [(json.dumps({"id": i}),) for i in ids]


def _new_producer_slot(sink: KafkaSink, batch_id: int, ids: range) -> None:
    """Slot 0 of ``batch_id`` as a task on a worker that keeps nothing: a new producer."""
    SlotProducers.clear()
    schema = pa.schema([("value", pa.binary())])
    records = pa.record_batch(
        {"value": pa.array([json.dumps({"id": i}).encode() for i in ids], pa.binary())})
    handle = sink.open_slot(SlotTransaction(sink.sink_id, 0, batch_id, "connrun", 0,
                                            batch_id, schema))
    assert not handle.reused
    assert sink.read_marker(handle) is None
    sink.write(handle, records)
    figures = sink.commit_slot(handle, SlotMarker(
        sink.sink_id, 0, batch_id, 0, "connrun", fingerprint_batch(records)))
    assert figures["reused"] == 0


@pytest.mark.parametrize("configured", [None, True, False])
def test_small_cluster_connects_densely_unless_the_config_says(
    spark: SparkSession, kafka: KafkaTarget, configured: bool | None
) -> None:
    config: dict[str, object] = {"bootstrap.servers": kafka.bootstrap}
    if configured is not None:
        config["enable.sparse.connections"] = configured
    sink = KafkaSink(kafka.topic, config, sink_id=kafka.sink_id, slots=2)
    try:
        sink(spark.createDataFrame(_rows(range(0, 50)), "value string"), 0)
        # The local cluster has one broker: dense unless the config set the property.
        expected = False if configured is None else configured
        assert sink.config["enable.sparse.connections"] is expected
        assert sink.config.producer("t", 60_000)["enable.sparse.connections"] is expected
        assert sink.config.consumer()["enable.sparse.connections"] is expected
        _new_producer_slot(sink, 1, range(50, 60))
        sink(spark.createDataFrame(_rows(range(60, 100)), "value string"), 2)
        kafka.assert_exact(100)
    finally:
        sink.close()
        SlotProducers.clear()


def test_topics_are_read_right_after_they_are_created(kafka: KafkaTarget) -> None:
    """A broker's metadata shows a new topic a few milliseconds after ``CreateTopics``
    returns. Without waiting for it, about one read in four failed here ("Unknown partition",
    "Not leader for partition"), and a new sink's first batch failed reading its new ledger.
    Readers wait for their partition (a broker may still answer "not leader" after its
    metadata shows the leader); the sink's admin client waits until a topic it created shows
    every partition with a leader."""
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    config = KafkaConfig({"bootstrap.servers": kafka.bootstrap})
    admin = Admin(config, 30.0, kafka.sink_id)
    raw = admin.client

    def new_name() -> str:
        name = f"{kafka.topic}-new-{uuid.uuid4().hex[:8]}"
        kafka.created.append(name)
        return name

    for _ in range(15):  # created by someone else: the reader waits
        name = new_name()
        raw.create_topics([NewTopic(name, num_partitions=2)])[name].result(30)
        assert read_committed(config, name, 1, timeout=30.0) == []
    for _ in range(15):  # created by the sink: its next look sees every partition
        name = new_name()
        admin.create_topic(name, 2, -1, {})
        assert admin.topic(name) == TopicInfo(name, 2)
        assert read_committed(config, name, 1, timeout=30.0) == []
    # A kept marker reader knows the topic with 2 partitions; the driver adds one (more
    # slots). The client's own metadata would not show it for minutes: the read refreshes it.
    MarkerReaders.clear()
    assert read_committed(config, name, 1, reuse=True) == []
    admin.add_partitions(name, 3)
    started = time.monotonic()
    assert read_committed(config, name, 2, reuse=True) == []
    assert time.monotonic() - started < 5
    assert MarkerReaders.clear() == 1  # the same reader, kept
    for _ in range(5):  # the ledger of a new sink: created, lease taken, read at once
        sink_id = f"{kafka.sink_id}-{uuid.uuid4().hex[:8]}"
        ledger = KafkaLedger(config, f"_connectors.{sink_id}.ledger", sink_id=sink_id,
                             admin=admin)
        kafka.created.append(ledger.topic)
        try:
            assert ledger.bound_query() is None
            assert ledger.bind_query("q") == 0
        finally:
            ledger.close()
