"""Batch produce (``connectors.kafka._native``) against a real broker.

Each test produces Arrow batches with librdkafka's ``rd_kafka_produce_batch`` on a real
transactional confluent-kafka ``Producer`` and reads them back with a ``read_committed``
consumer: the records must be byte for byte those ``Producer.produce()`` writes for the
same rows (null vs empty values and keys, explicit partitions, order), a full queue must
wait rather than drop, a refusal must raise, and a delivery the broker refuses must fail
the transaction's commit although no delivery report reaches Python.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewPartitions  # type: ignore[attr-defined]
from pyspark.sql import SparkSession

from connectors.kafka._native import murmur2
from connectors.kafka._native_produce import NativeProducer, attach
from connectors.kafka._produce import BatchProducer, produce_records
from integration.support._kafka import (
    KafkaTarget,
    Message,
    target_fixture,
    wait_no_open_transactions,
)

pytestmark = [pytest.mark.integration]


kafka = target_fixture("native")


def produce_batch(produce: object, poll: object, batch: pa.RecordBatch, topic: str | None,
                  fast: NativeProducer | BatchProducer | None = None) -> int:
    """Rows produced by :func:`connectors.kafka._records.produce_batch`."""
    from connectors.kafka._produce import produce_batch as produce_with_path

    rows, path = produce_with_path(produce, poll, batch, topic, fast)  # type: ignore[arg-type]
    assert path == ("record" if fast is None else fast.path)
    return rows


def _producer(bootstrap: str, **extra: object) -> tuple[Producer, list[KafkaError]]:
    reports: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            reports.append(err)

    producer = Producer({
        "bootstrap.servers": bootstrap, "transactional.id": f"native-{uuid.uuid4().hex}",
        "linger.ms": 5, "on_delivery": on_delivery, "delivery.report.only.error": True,
        **extra,
    })
    producer.init_transactions(30)
    return producer, reports


def _native(producer: Producer) -> NativeProducer:
    native = attach(producer)
    assert native is not None, "batch produce must be available on this platform"
    return native


def _batch() -> pa.RecordBatch:
    n = 3000
    keys: list[str | None] = [None if i % 7 == 0 else ("" if i % 11 == 0 else f"k{i}")
                              for i in range(n)]
    values: list[bytes | None] = [
        None if i % 13 == 0 else (b"" if i % 17 == 0 else f"v{i}-".encode() * (i % 40))
        for i in range(n)]
    parts: list[int | None] = [None if i % 5 == 0 else i % 3 for i in range(n)]
    batch = pa.record_batch({"key": pa.array(keys, pa.string()),
                             "value": pa.array(values, pa.binary()),
                             "partition": pa.array(parts, pa.int32())})
    return batch.slice(1, n - 1)  # an offset into every buffer


def _by_partition(messages: list[Message]) -> dict[int, list[tuple[bytes | None, bytes | None]]]:
    out: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
    for m in sorted(messages, key=lambda m: (m.partition, m.offset)):
        out.setdefault(m.partition, []).append((m.key, m.value))
    return out


def test_batch_produce_writes_what_produce_writes(kafka: KafkaTarget) -> None:
    other = kafka.create(f"{kafka.topic}-py", partitions=3)
    batch = _batch()
    # Rows with an explicit partition go there; rows with a null partition are placed by
    # the partitioner of their key, which both paths share (a null or empty key: at
    # random, so those rows are left out of the comparison).
    keys, parts = batch.column(0), batch.column(2)
    placed = pc.or_(pc.is_valid(parts), pc.fill_null(pc.greater(pc.utf8_length(keys), 0), False))
    keyed = batch.filter(placed)
    assert keyed.num_rows > 2000

    producer, reports = _producer(kafka.bootstrap)
    producer.begin_transaction()
    assert _native(producer).produce(kafka.topic, keyed.column(1), keyed.column(0),
                                     keyed.column(2)) == keyed.num_rows
    producer.commit_transaction(30)
    producer.begin_transaction()
    assert produce_batch(producer.produce, producer.poll, keyed, other) == keyed.num_rows
    producer.commit_transaction(30)
    assert not reports

    native_side, python_side = kafka.messages(), kafka.messages(other)
    assert len(native_side) == keyed.num_rows
    assert _by_partition(native_side) == _by_partition(python_side)
    # Every record once, in the batch's order within its partition.
    expected = {(k.encode() if k is not None else None, v) for k, v in zip(
        keyed.column(0).to_pylist(), keyed.column(1).to_pylist(), strict=True)}
    assert {(m.key, m.value) for m in native_side} == expected
    kafka.assert_no_open_transactions()


def test_keyed_records_are_placed_per_partition_like_librdkafka_places_them(
    kafka: KafkaTarget,
) -> None:
    """Under a murmur2 partitioner the slot places keyed records itself and enqueues them
    one partition at a time: the same partition as librdkafka's partitioner, and in each
    partition the batch's order. A chunk with a null key leaves placement to librdkafka."""
    n = 20_000  # more than one chunk of rd_kafka_produce_batch
    names = [f"key-{i * 7919 % 1000}" for i in range(n)]
    values = pa.array([f"{i}".encode() for i in range(n)], pa.binary())
    parts = pa.array([1 if i % 10 == 0 else None for i in range(n)], pa.int32())
    with_null = pa.array([None if i % 1000 == 0 else k for i, k in enumerate(names)], pa.string())
    cases = ((pa.array(names, pa.string()), None), (pa.array(names, pa.string()), parts),
             (with_null, parts))
    for case, (keys, partitions) in enumerate(cases):
        mine = kafka.create(f"{kafka.topic}-{case}", partitions=3)
        other = kafka.create(f"{kafka.topic}-{case}-py", partitions=3)
        producer, reports = _producer(kafka.bootstrap, partitioner="murmur2_random")
        native = attach(producer, partitioner="murmur2_random")
        assert native is not None and native.by_key
        producer.begin_transaction()
        assert native.produce(mine, values, keys, partitions) == n
        producer.commit_transaction(30)
        producer.begin_transaction()
        batch = pa.record_batch({"key": keys, "value": values, **(
            {"partition": partitions} if partitions is not None else {})})
        assert produce_batch(producer.produce, producer.poll, batch, other) == n
        producer.commit_transaction(30)
        assert not reports
        native_side, python_side = _by_partition(kafka.messages(mine)), _by_partition(
            kafka.messages(other))
        assert sum(len(r) for r in native_side.values()) == n and len(native_side) == 3
        for records in native_side.values():  # the batch's order within each partition
            ids = [int(v or b"") for _, v in records]
            assert ids == sorted(ids)
        if case < 2:
            assert native_side == python_side
        else:  # null keys go to random partitions: compare the others only
            assert ({p: [r for r in rs if r[0] is not None] for p, rs in native_side.items()}
                    == {p: [r for r in rs if r[0] is not None] for p, rs in python_side.items()})
        wait = wait_no_open_transactions(kafka.bootstrap, [mine])
        assert not wait, wait


def test_keyed_records_follow_partitions_added_to_the_topic(kafka: KafkaTarget) -> None:
    """The partition count the slot hashes keys into is refreshed as often as librdkafka
    refreshes its own metadata (``topic.metadata.refresh.interval.ms``)."""
    producer, reports = _producer(kafka.bootstrap, partitioner="murmur2_random",
                                  **{"topic.metadata.refresh.interval.ms": 1000})
    native = attach(producer, partitioner="murmur2_random", refresh_ms=1000)
    assert native is not None
    keys = pa.array([f"k{i}" for i in range(300)], pa.string())
    values = pa.array([b"v"] * 300, pa.binary())
    producer.begin_transaction()
    native.produce(kafka.topic, values, keys, None)
    producer.commit_transaction(30)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.create_partitions([NewPartitions(kafka.topic, 6)])[kafka.topic].result(30)
    time.sleep(2.5)  # past both refresh intervals
    producer.begin_transaction()
    native.produce(kafka.topic, values, keys, None)
    producer.commit_transaction(30)
    assert not reports
    placed = sorted((m.key or b"", m.partition) for m in kafka.messages())
    hashes = (murmur2(keys) & np.uint32(0x7FFFFFFF)).astype(np.int64)
    expected = sorted([(f"k{i}".encode(), int(h % count)) for i, h in enumerate(hashes)
                       for count in (3, 6)])
    assert placed == expected
    assert {p for _, p in placed} == set(range(6))


def test_batch_produce_with_a_topic_column_and_null_keys(kafka: KafkaTarget) -> None:
    second = kafka.create(f"{kafka.topic}-b", partitions=1)
    n = 1000
    batch = pa.record_batch({
        "value": pa.array([f"{i}".encode() for i in range(n)], pa.binary()),
        "topic": pa.array([kafka.topic if i % 3 else second for i in range(n)]),
    })
    producer, reports = _producer(kafka.bootstrap)
    producer.begin_transaction()
    assert produce_batch(producer.produce, producer.poll, batch, None,
                         _native(producer)) == n
    producer.commit_transaction(30)
    assert not reports
    first_ids = sorted(int(m.value or b"") for m in kafka.messages())
    second_values = [m.value for m in kafka.messages(second)]
    assert first_ids == [i for i in range(n) if i % 3]
    # One partition: the order of the batch is kept.
    assert second_values == [f"{i}".encode() for i in range(n) if i % 3 == 0]


def test_a_full_queue_waits_and_loses_nothing(kafka: KafkaTarget) -> None:
    n = 60_000
    values = pa.array([f"{i:08d}".encode() * 8 for i in range(n)], pa.binary())
    producer, reports = _producer(kafka.bootstrap, **{"queue.buffering.max.messages": 1000})
    producer.begin_transaction()
    parts = pa.array([0] * n, pa.int32())
    assert _native(producer).produce(kafka.topic, values, None, parts) == n
    producer.commit_transaction(60)
    assert not reports
    got = [m.value for m in sorted(kafka.messages(), key=lambda m: m.offset)]
    assert got == values.to_pylist()


def test_a_refused_record_raises_and_the_transaction_aborts(kafka: KafkaTarget) -> None:
    producer, _ = _producer(kafka.bootstrap)
    native = _native(producer)
    producer.begin_transaction()
    values = pa.array([b"a", b"b", b"c"])
    for parts in ([0, 3, 1], [0, -2, 1]):
        with pytest.raises(KafkaException) as info:
            native.produce(kafka.topic, values, None, pa.array(parts, pa.int32()))
        assert info.value.args[0].code() == KafkaError._UNKNOWN_PARTITION
    # Nothing was queued: the abort (and a later flush) has nothing to wait for.
    assert len(producer) == 0
    producer.abort_transaction(30)
    assert kafka.messages() == []
    kafka.assert_no_open_transactions()


def test_a_fenced_producer_raises_a_fatal_error(kafka: KafkaTarget) -> None:
    tid = f"native-fenced-{uuid.uuid4().hex}"
    producer, _ = _producer(kafka.bootstrap, **{"transactional.id": tid})
    native = _native(producer)
    producer.begin_transaction()
    native.produce(kafka.topic, pa.array([b"before"]), None, pa.array([0], pa.int32()))
    assert producer.flush(30) == 0
    # Another owner of the transactional id fences this producer (and aborts its
    # transaction); the fenced state shows once this producer talks to the broker again.
    Producer({"bootstrap.servers": kafka.bootstrap,
              "transactional.id": tid}).init_transactions(30)
    with pytest.raises(KafkaException) as info:
        for _ in range(100):
            native.produce(kafka.topic, pa.array([b"after"]), None, pa.array([1], pa.int32()))
            producer.flush(0.5)
    err = info.value.args[0]
    assert err.fatal() and err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                          KafkaError.INVALID_PRODUCER_EPOCH), err
    assert kafka.messages() == []
    kafka.assert_no_open_transactions()


def test_a_delivery_the_broker_refuses_fails_the_commit(kafka: KafkaTarget) -> None:
    small = kafka.create(f"{kafka.topic}-small", partitions=1,
                         config={"max.message.bytes": "2000"})
    producer, reports = _producer(kafka.bootstrap)
    producer.begin_transaction()
    _native(producer).produce(small, pa.array([b"ok", b"x" * 50_000, b"ok"]), None, None)
    with pytest.raises(KafkaException) as info:
        producer.commit_transaction(30)
    assert info.value.args[0].txn_requires_abort()
    assert reports == []  # batch-produced records have no delivery report in Python
    producer.abort_transaction(30)
    # Record by record (the sink's redo), the delivery report names the cause.
    producer.begin_transaction()
    producer.produce(small, b"x" * 50_000)
    producer.flush(30)
    assert [e.code() for e in reports] == [KafkaError.MSG_SIZE_TOO_LARGE]
    producer.abort_transaction(30)
    assert kafka.messages(small) == []


def _await_metadata(producer: Any, topic: str, partitions: int, timeout: float = 30.0) -> None:
    """Until ``producer``'s broker lists the new topic with its partitions: a topic created
    a moment ago may still be unknown there (UNKNOWN_TOPIC_OR_PART), more so under load."""
    deadline = time.monotonic() + timeout
    while True:
        found = producer.list_topics(topic=topic, timeout=10).topics.get(topic)
        if found is not None and found.error is None and len(found.partitions) == partitions:
            return
        assert time.monotonic() < deadline, f"topic {topic} not in the metadata: {found}"
        time.sleep(0.1)


@pytest.mark.parametrize("partitioner", ["murmur2_random", "murmur2"])
def test_the_public_batch_path_writes_what_the_accelerator_writes_in_the_same_order(
    kafka: KafkaTarget, partitioner: str,
) -> None:
    """The public fallback (``Producer.produce_batch``) against the ctypes accelerator and
    ``produce()`` on the same rows: keyed records under a murmur2 partitioner, explicit
    partitions, null keys, more than one chunk. Every partition holds the same records in
    the same order on all three paths (null-keyed records, which librdkafka places at
    random, are compared as a multiset)."""
    n = 40_000  # more than two chunks of either batch path
    names = [f"key-{i * 7919 % 1000}" for i in range(n)]
    values = pa.array([f"{i}".encode() for i in range(n)], pa.binary())
    parts = pa.array([1 if i % 10 == 0 else None for i in range(n)], pa.int32())
    with_null = pa.array([None if i % 1000 == 0 else k for i, k in enumerate(names)], pa.string())
    cases = ((pa.array(names, pa.string()), None), (pa.array(names, pa.string()), parts),
             (with_null, parts), (with_null, None))
    for case, (keys, partitions) in enumerate(cases):
        producer, reports = _producer(kafka.bootstrap, partitioner=partitioner)
        native = attach(producer, partitioner=partitioner)
        assert native is not None and native.by_key
        public = BatchProducer(producer, 30.0, by_key=True, queue_limit=100_000)
        batch = pa.record_batch({"key": keys, "value": values, **(
            {"partition": partitions} if partitions is not None else {})})
        seen = {}
        for path in ("native", "batch", "record"):
            topic = kafka.create(f"{kafka.topic}-{case}-{path}", partitions=3)
            _await_metadata(producer, topic, 3)
            producer.begin_transaction()
            if path == "native":
                assert native.produce(topic, values, keys, partitions) == n
            elif path == "batch":
                assert public.produce(topic, values, keys, partitions) == n
            else:
                assert produce_records(producer.produce, producer.poll, batch, topic) == n
            producer.commit_transaction(30)
            seen[path] = _by_partition(kafka.messages(topic))
            assert sum(len(r) for r in seen[path].values()) == n and len(seen[path]) == 3
        assert not reports
        for path in ("batch", "record"):
            for p in range(3):
                mine, theirs = seen["native"][p], seen[path][p]
                assert [r for r in mine if r[0] is not None] == [
                    r for r in theirs if r[0] is not None], (case, path, p)
                if case == 3:  # null keys: librdkafka's partitioner, at random
                    continue
                assert mine == theirs, (case, path, p)
        for records in seen["batch"].values():  # the batch's order within each partition
            ids = [int(v or b"") for _, v in records]
            assert ids == sorted(ids)


@pytest.mark.parametrize("topic_column", [False, True])
def test_the_sink_writes_the_same_records_with_and_without_batch_produce(
    spark: SparkSession, kafka: KafkaTarget, topic_column: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two sinks, one per path, over the same rows (keys, null and empty values, explicit
    and null partitions, a topic column): every record once, the same per partition.
    On confluent-kafka's Producer (the paths of ``batch_produce``; the owned handle's
    comparison is integration/kafka/test_kafka_owned.py)."""
    from connectors.kafka import KafkaSink

    monkeypatch.setenv("CONNECTORS_KAFKA_PRODUCER", "confluent")

    other = kafka.create(f"{kafka.topic}-rec", partitions=3)
    n = 5000
    df = spark.range(n).selectExpr(
        "CAST(id AS STRING) AS key",
        "CASE WHEN id % 13 = 0 THEN NULL WHEN id % 17 = 0 THEN X'' "
        "ELSE CAST(concat('v', id) AS BINARY) END AS value",
        "CASE WHEN id % 4 = 0 THEN NULL ELSE CAST(id % 3 AS INT) END AS partition",
        "id")
    public = kafka.create(f"{kafka.topic}-pub", partitions=3)
    seen: dict[bool | str, dict[int, list[tuple[bytes | None, bytes | None]]]] = {}
    paths = {True: "produce_native_rows", "public": "produce_batch_rows",
             False: "produce_record_rows"}
    for batch_produce, topic in ((True, kafka.topic), ("public", public), (False, other)):
        rows = df.selectExpr("*", f"'{topic}' AS topic") if topic_column else df
        sink = KafkaSink(None if topic_column else topic, {"bootstrap.servers": kafka.bootstrap},
                         sink_id=f"{kafka.sink_id}-{batch_produce}", slots=2,
                         batch_produce=batch_produce)
        try:
            sink(rows, 0)
            metrics = sink.last_metrics
            assert metrics is not None and metrics.extra[paths[batch_produce]] == n, metrics
            assert sum(metrics.extra[p] for p in paths.values()) == n
            # the path the metrics' `path` label shows (docs/metrics.md)
            assert f"produce_{metrics.path}_rows" == paths[batch_produce]
            sink(rows, 0)  # a replay: nothing written twice
        finally:
            sink.close()
        messages = kafka.messages(topic)
        assert sorted(int(m.key or b"-1") for m in messages) == list(range(n))
        seen[batch_produce] = _by_partition(messages)
        for suffix in ("markers", "ledger"):
            kafka.created.append(f"_connectors.{kafka.sink_id}-{batch_produce}.{suffix}")
    # Same records in each partition (the order across the two slots may interleave
    # differently, so compare as sets); within a slot the order is the batch's.
    for other_path in ("public", False):
        assert {p: sorted(r, key=repr) for p, r in seen[True].items()} == {
            p: sorted(r, key=repr) for p, r in seen[other_path].items()}
    empty = [v for rs in seen[True].values() for _, v in rs if v == b""]
    null = [v for rs in seen[True].values() for _, v in rs if v is None]
    assert len(empty) == sum(1 for i in range(n) if i % 13 and i % 17 == 0)
    assert len(null) == sum(1 for i in range(n) if i % 13 == 0)


def test_keyed_records_land_where_spark_s_kafka_writer_puts_them(
    spark: SparkSession, kafka: KafkaTarget,
) -> None:
    """Kafka's Java producer (Spark's writer) places a keyed record by murmur2 of its key;
    the sink's producers do the same (``partitioner=murmur2_random``), so moving a job from
    Spark's writer to KafkaSink keeps every key in its partition."""
    from connectors.kafka import KafkaSink

    theirs = kafka.create(f"{kafka.topic}-spark", partitions=3)
    df = spark.range(600).selectExpr("concat('key-', id) AS key",
                                     "CAST(id AS STRING) AS value")
    (df.write.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap)
     .option("topic", theirs).save())
    sink = KafkaSink(kafka.topic, {"bootstrap.servers": kafka.bootstrap},
                     sink_id=kafka.sink_id, slots=2)
    try:
        sink(df, 0)
    finally:
        sink.close()
    spark_side = {m.key: m.partition for m in kafka.messages(theirs)}
    sink_side = {m.key: m.partition for m in kafka.messages()}
    assert len(sink_side) == 600 and sink_side == spark_side
    assert set(sink_side.values()) == {0, 1, 2}
