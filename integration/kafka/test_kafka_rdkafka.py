"""The prototype of issue 55 (:mod:`connectors.kafka._rdkafka`) on a real broker: a
producer handle created and owned through librdkafka's public C API, fed from Arrow.

Records produced in a transaction read back (``read_committed``) record by record: keys
(null and empty ones included), values, partitions, each partition in input order,
timestamps (given, or the broker-visible CreateTime of the call); an aborted transaction
leaves nothing visible; a second producer with the same ``transactional.id`` fences the
first.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pytest

from connectors.kafka._rdkafka import ArrowProducer, RdKafkaError, load
from integration.support._kafka import (
    KafkaTarget,
    read_all,
    target_fixture,
    wait_no_open_transactions,
)

pytestmark = [pytest.mark.integration]

ROWS = 3000
PARTITIONS = 3

kafka = target_fixture("rdk", partitions=PARTITIONS)


@dataclass(frozen=True)
class Got:
    partition: int
    key: bytes | None
    value: bytes | None
    timestamp: int


def _read(bootstrap: str, topic: str) -> list[Got]:
    """Every record ``read_committed`` sees in ``topic`` (``read_all``), partition order
    kept."""
    assert not wait_no_open_transactions(bootstrap, [topic])
    return [Got(m.partition, m.key, m.value, int(m.timestamp or 0))
            for m in read_all(bootstrap, topic)]


def _batch(n: int) -> tuple[pa.Array, pa.Array, pa.Array]:
    """Keys (every 7th null, every 11th empty), values (every 13th empty), partitions."""
    keys = pa.array([None if i % 7 == 0 else b"" if i % 11 == 0 else f"k{i}".encode()
                     for i in range(n)], pa.binary())
    values = pa.array([b"" if i % 13 == 0 else f"value {i} ".encode() * (i % 5 + 1)
                       for i in range(n)], pa.binary())
    parts = pa.array((np.arange(n) * 7919) % PARTITIONS, pa.int32())
    return keys, values, parts


@pytest.fixture
def producer(kafka: KafkaTarget) -> Iterator[ArrowProducer]:
    with ArrowProducer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5,
                        "transactional.id": f"rdk-{kafka.sink_id}"}) as made:
        made.init_transactions()
        yield made


def _expected(keys: pa.Array, values: pa.Array, parts: pa.Array) -> dict[int, list[tuple]]:
    per: dict[int, list[tuple]] = {p: [] for p in range(PARTITIONS)}
    for k, v, p in zip(keys.to_pylist(), values.to_pylist(), parts.to_pylist(), strict=True):
        per[p].append((k, v))
    return per


def test_version_and_library() -> None:
    lib = load()
    assert lib.version >= 0x020000FF, lib.version_str


def test_committed_records_read_back_record_by_record(kafka: KafkaTarget,
                                                      producer: ArrowProducer) -> None:
    keys, values, parts = _batch(ROWS)
    stamps = pa.array(1_600_000_000_000 + np.arange(ROWS, dtype=np.int64) * 1000, pa.int64())
    before = int(time.time() * 1000)
    producer.begin_transaction()
    # Half through produce_batch (CreateTime: now), half with a timestamp each (produceva).
    half = ROWS // 2
    producer.produce(kafka.topic, values[:half], keys[:half], parts[:half])
    producer.produce(kafka.topic, values[half:], keys[half:], parts[half:], stamps[half:])
    done = producer.commit_transaction()
    after = int(time.time() * 1000)
    assert (done.enqueued, done.delivered, done.failed) == (ROWS, ROWS, {})

    got = _read(kafka.bootstrap, kafka.topic)
    assert len(got) == ROWS
    want = _expected(keys, values, parts)
    stamp_of = dict(zip(values[half:].to_pylist(), stamps[half:].to_pylist(), strict=False))
    first = set(values[:half].to_pylist())
    for p in range(PARTITIONS):
        mine = [g for g in got if g.partition == p]
        assert [(g.key, g.value) for g in mine] == [
            (k if k is not None else None, v) for k, v in want[p]], f"partition {p}"
    for g in got:
        if g.value in first and g.value not in stamp_of:
            assert before - 1000 <= g.timestamp <= after + 1000
    given = {v: s for v, s in stamp_of.items() if v not in first}
    seen = {g.value: g.timestamp for g in got if g.value in given}
    assert seen == given


def test_aborted_transaction_leaves_nothing(kafka: KafkaTarget,
                                            producer: ArrowProducer) -> None:
    keys, values, parts = _batch(ROWS)
    producer.begin_transaction()
    producer.produce(kafka.topic, values, keys, parts)
    assert producer.flush().delivered == ROWS  # on the broker, undecided
    producer.abort_transaction()
    assert _read(kafka.bootstrap, kafka.topic) == []
    # The same producer goes on: its next transaction commits.
    producer.begin_transaction()
    producer.produce(kafka.topic, values[:10], keys[:10])
    producer.commit_transaction()
    assert sorted(g.value or b"" for g in _read(kafka.bootstrap, kafka.topic)) == sorted(
        v or b"" for v in values[:10].to_pylist())


def test_same_transactional_id_fences_the_older_producer(kafka: KafkaTarget,
                                                         producer: ArrowProducer) -> None:
    keys, values, parts = _batch(100)
    producer.begin_transaction()
    producer.produce(kafka.topic, values, keys, parts)
    producer.flush()
    with ArrowProducer({"bootstrap.servers": kafka.bootstrap,
                        "transactional.id": f"rdk-{kafka.sink_id}"}) as newer:
        newer.init_transactions()  # aborts the older producer's open transaction
        with pytest.raises(RdKafkaError) as fenced:
            producer.commit_transaction(timeout_s=30)
        assert fenced.value.fatal, fenced.value
        assert _read(kafka.bootstrap, kafka.topic) == []
        newer.begin_transaction()
        newer.produce(kafka.topic, values, keys, parts)
        newer.commit_transaction()
    assert len(_read(kafka.bootstrap, kafka.topic)) == 100


def test_records_without_a_partition_go_to_the_partitioner(kafka: KafkaTarget,
                                                           producer: ArrowProducer) -> None:
    # Some partitions null: no grouping, each record's own partition (F_PARTITION).
    keys, values, parts = _batch(600)
    given = pa.array([None if i % 5 == 0 else p for i, p in enumerate(parts.to_pylist())],
                     pa.int32())
    producer.begin_transaction()
    producer.produce(kafka.topic, values, keys, given)
    producer.commit_transaction()
    got = _read(kafka.bootstrap, kafka.topic)
    assert sorted(g.value or b"" for g in got) == sorted(v or b"" for v in values.to_pylist())
    where = {g.value: g.partition for g in got}
    for v, p in zip(values.to_pylist(), given.to_pylist(), strict=True):
        if p is not None and v:
            assert where[v] == p
    for p in range(PARTITIONS):  # each partition in input order
        wanted = [v for v, q in zip(values.to_pylist(), given.to_pylist(), strict=True)
                  if q == p and v]  # empty values are not unique
        assert [g.value for g in got if g.partition == p and g.value in set(wanted)] == wanted


def test_a_failed_delivery_is_reported_and_the_transaction_aborts(
        kafka: KafkaTarget, producer: ArrowProducer) -> None:
    # The broker refuses a record above the topic's max.message.bytes (the client allows it).
    small = kafka.create(f"{kafka.topic}-small", config={"max.message.bytes": "2000"})
    values = pa.array([b"ok"] * 50 + [b"x" * 5000] + [b"ok"] * 50, pa.binary())
    producer.begin_transaction()
    producer.produce(small, values, partitions=pa.array([0] * 101, pa.int32()))
    with pytest.raises(RdKafkaError) as failed:
        producer.commit_transaction(timeout_s=30)
    assert failed.value.abortable and sum(producer.delivery.failed.values()) >= 1, failed.value
    producer.abort_transaction()
    assert _read(kafka.bootstrap, small) == []
