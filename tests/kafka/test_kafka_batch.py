"""The public batch path (``connectors.kafka._produce``) against a stand-in producer that
behaves as confluent-kafka 2.16's ``Producer.produce_batch`` does (per-message
``partition`` ignored, ``_error`` on refused messages, no exception on a full queue)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from connectors.kafka._placement import PARTITION_UA, murmur2
from connectors.kafka._produce import BatchProducer, has_public_batch, produce_batch

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


@dataclass
class FakeProducer:
    """``partitions``: per topic. ``room``: messages the queue takes before it is full
    (``None``: unbounded); a ``poll`` frees everything. ``refuse``: an error code for
    every message."""

    partitions: dict[str, int]
    room: int | None = None
    refuse: int | None = None
    #: (topic, partition, [(key, value), ...]) per call that queued something.
    calls: list[tuple[str, int, list[tuple[Any, Any]]]] = field(default_factory=list)
    polls: int = 0
    queued: int = 0
    refill_midway: bool = False

    def list_topics(self, topic: str, timeout: float) -> Any:
        count = self.partitions.get(topic)
        found = None if count is None else SimpleNamespace(
            error=None, partitions=dict.fromkeys(range(count)))
        return SimpleNamespace(topics={} if found is None else {topic: found})

    def produce_batch(self, topic: str, messages: list[dict[str, Any]],
                      partition: int = PARTITION_UA) -> int:
        good: list[tuple[Any, Any]] = []
        for i, m in enumerate(messages):
            assert "partition" not in m  # 2.16 would ignore it: the sink never relies on it
            if self.refuse is not None:
                m["_error"] = KafkaError(self.refuse)
                continue
            if self.room is not None and self.queued >= self.room:
                m["_error"] = KafkaError(KafkaError._QUEUE_FULL)
                if self.refill_midway and i == len(messages) - 2:
                    self.queued = 0  # the broker thread freed room meanwhile
                continue
            self.queued += 1
            good.append((m.get("key"), m.get("value")))
        if good:
            self.calls.append((topic, partition, good))
        return len(good)

    def poll(self, timeout: float) -> int:
        self.polls += 1
        self.queued = 0
        return 0

    def __len__(self) -> int:
        return self.queued


def _records(calls: list[tuple[str, int, list[tuple[Any, Any]]]]) -> list[tuple[Any, ...]]:
    return [(t, p, k, v) for t, p, recs in calls for k, v in recs]


def test_the_installed_confluent_kafka_has_the_public_batch_api() -> None:
    assert has_public_batch(Producer({"bootstrap.servers": "127.0.0.1:9", "log_level": 0}))
    assert not has_public_batch(object())


def test_keyed_records_go_one_partition_per_call_in_input_order() -> None:
    producer = FakeProducer({"t": 3})
    keys = pa.array([f"k{i % 17}" for i in range(200)], pa.string())
    values = pa.array([f"v{i}".encode() for i in range(200)], pa.binary())
    fast = BatchProducer(producer, 5.0, by_key=True)
    assert fast.produce("t", values, keys, None) == 200
    expected = ((murmur2(keys) & np.uint32(0x7FFFFFFF)) % np.uint32(3)).tolist()
    assert sorted(p for _, p, _ in producer.calls) == [0, 1, 2]  # one call per partition
    seen = _records(producer.calls)
    assert len(seen) == 200
    for topic, part, key, value in seen:
        i = int(value[1:])
        assert (topic, key, part) == ("t", f"k{i % 17}", expected[i])
    for part in range(3):  # each partition in input order
        order = [int(v[1:]) for _, p, _, v in seen if p == part]
        assert order == sorted(order)


def test_explicit_partitions_and_unknown_placement_keep_input_order() -> None:
    """A null key under a murmur2 partitioner is placed by librdkafka: the records then go
    in runs of input order, each run to its partition (-1: the partitioner)."""
    producer = FakeProducer({"t": 4})
    keys = pa.array(["a", None, "a", "b", None], pa.string())
    parts = pa.array([3, None, None, 2, 1], pa.int32())
    values = pa.array([b"0", b"1", b"2", b"3", b"4"])
    fast = BatchProducer(producer, 5.0, by_key=True)
    assert fast.produce("t", values, keys, parts) == 5
    a_part = int((murmur2(pa.array(["a"])) & np.uint32(0x7FFFFFFF))[0] % 4)
    seen = _records(producer.calls)
    assert [v for *_, v in seen] == [b"0", b"1", b"2", b"3", b"4"]
    assert [p for _, p, _, _ in seen] == [3, PARTITION_UA, a_part, 2, 1]


def test_unkeyed_records_without_partitions_go_through_the_partitioner() -> None:
    producer = FakeProducer({"t": 2})
    values = pa.array([b"x", None, b""], pa.binary())
    assert BatchProducer(producer, 5.0, by_key=True).produce("t", values, None, None) == 3
    assert producer.calls == [("t", PARTITION_UA, [(None, b"x"), (None, None), (None, b"")])]


def test_a_full_queue_waits_and_retries_the_refused_tail_in_order() -> None:
    producer = FakeProducer({"t": 1}, room=3)
    values = pa.array([str(i).encode() for i in range(10)])
    parts = pa.array([0] * 10, pa.int32())
    fast = BatchProducer(producer, 5.0, queue_limit=1_000)
    assert fast.produce("t", values, None, parts) == 10
    assert [v for *_, v in _records(producer.calls)] == [str(i).encode() for i in range(10)]
    assert producer.polls >= 3


def test_a_record_queued_after_a_refused_one_raises_rather_than_reorder() -> None:
    producer = FakeProducer({"t": 1}, room=2, refill_midway=True)
    values = pa.array([str(i).encode() for i in range(6)])
    with pytest.raises(KafkaException) as info:
        BatchProducer(producer, 5.0, queue_limit=1_000).produce(
            "t", values, None, pa.array([0] * 6, pa.int32()))
    assert info.value.args[0].code() == KafkaError._QUEUE_FULL


def test_another_refusal_raises_its_code_and_names_no_value() -> None:
    producer = FakeProducer({"t": 1}, refuse=KafkaError.MSG_SIZE_TOO_LARGE)
    with pytest.raises(KafkaException) as info:
        BatchProducer(producer, 5.0).produce("t", pa.array([b"secret-value"]),
                                             pa.array([b"secret-key"]), None)
    assert info.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert "secret" not in str(info.value)


def test_a_partition_the_topic_lacks_is_refused_before_anything_is_queued() -> None:
    producer = FakeProducer({"t": 2})
    with pytest.raises(KafkaException) as info:
        BatchProducer(producer, 5.0).produce("t", pa.array([b"v", b"w"]), None,
                                             pa.array([0, 5], pa.int32()))
    err = info.value.args[0]
    assert err.code() == KafkaError._UNKNOWN_PARTITION and "partition 5" in err.str()
    assert producer.calls == []


def test_records_with_headers_go_record_by_record() -> None:
    """``produce_batch`` drops headers: a batch with any header takes ``produce()``; a
    headers column without any header does not."""
    producer = FakeProducer({"t": 1})
    fast = BatchProducer(producer, 5.0)
    produced: list[dict[str, Any]] = []

    def produce(topic: str, **kwargs: Any) -> None:
        produced.append(kwargs)

    with_headers = pa.record_batch({"value": pa.array([b"a", b"b"]), "headers": pa.array(
        [[{"key": "h", "value": b"1"}], None], HEADERS)})
    assert produce_batch(produce, producer.poll, with_headers, "t", fast) == (2, "record")
    assert produced[0]["headers"] == [("h", b"1")] and producer.calls == []
    empty = pa.record_batch({"value": pa.array([b"a"]), "headers": pa.array([[]], HEADERS)})
    assert produce_batch(produce, producer.poll, empty, "t", fast) == (1, "batch")
    assert producer.calls == [("t", PARTITION_UA, [(None, b"a")])]


def test_a_topic_column_keeps_each_topic_s_order() -> None:
    producer = FakeProducer({"x": 1, "y": 1})
    batch = pa.record_batch({"value": pa.array([b"1", b"2", b"3", b"4"]),
                             "topic": pa.array(["x", "y", "x", "y"])})
    fast = BatchProducer(producer, 5.0)
    assert produce_batch(producer.produce_batch, producer.poll, batch, None, fast) == (
        4, "batch")
    assert [(t, v) for t, _, _, v in _records(producer.calls)] == [
        ("x", b"1"), ("x", b"3"), ("y", b"2"), ("y", b"4")]
