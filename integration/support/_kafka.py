"""Helpers for the Kafka integration tests: topics, a ``read_committed`` reader, LSO checks."""

from __future__ import annotations

import collections
import json
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

__all__ = [
    "KafkaTarget",
    "Message",
    "open_transactions",
    "read_all",
    "wait_no_open_transactions",
]


@dataclass(frozen=True)
class Message:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    #: The record's timestamp in ms (CreateTime as the producer gave it, or LogAppendTime).
    timestamp: int | None = None

    def json(self) -> Any:
        return json.loads(self.value or b"null")


def _admin(bootstrap: str) -> AdminClient:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.list_topics(timeout=30)  # a fresh client learns the leaders (FENCED_LEADER_EPOCH)
    return admin


def _offsets(bootstrap: str, topic: str, isolation: str) -> dict[int, tuple[int, int]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "eos-check",
                         "isolation.level": isolation, "enable.auto.commit": False})
    try:
        meta = consumer.list_topics(topic, timeout=30)
        parts = sorted(meta.topics[topic].partitions)
        found = {}
        for p in parts:
            for attempt in range(10):
                try:
                    lo, hi = consumer.get_watermark_offsets(
                        TopicPartition(topic, p), timeout=30, cached=False)
                    found[p] = (int(lo), int(hi))
                    break
                except KafkaException:
                    if attempt == 9:
                        raise
                    time.sleep(1)
        return found
    finally:
        consumer.close()


def _stable_offsets(bootstrap: str, topic: str) -> tuple[dict[int, tuple[int, int]], list[int]]:
    """``topic``'s read_committed (low, last stable offset) per partition, and the
    partitions whose last stable offset is below the high watermark."""
    committed = _offsets(bootstrap, topic, "read_committed")
    latest = _offsets(bootstrap, topic, "read_uncommitted")
    return committed, [p for p in committed if committed[p][1] != latest.get(p, (0, -1))[1]]


def open_transactions(bootstrap: str, topics: Iterable[str]) -> dict[str, list[int]]:
    """Partitions whose last stable offset is below the high watermark, per topic."""
    stuck: dict[str, list[int]] = {}
    for topic in topics:
        bad = _stable_offsets(bootstrap, topic)[1]
        if bad:
            stuck[topic] = bad
    return stuck


def wait_no_open_transactions(
    bootstrap: str, topics: Iterable[str], timeout: float = 30.0
) -> dict[str, list[int]]:
    """Wait until LSO == HWM on every partition (commit/abort markers are written late)."""
    topics = list(topics)
    deadline = time.monotonic() + timeout
    while True:
        stuck = open_transactions(bootstrap, topics)
        if not stuck or time.monotonic() > deadline:
            return stuck
        time.sleep(0.25)


def _bytes(value: str | bytes | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def read_all(bootstrap: str, topic: str, timeout: float = 60.0,
             settle: float = 10.0) -> list[Message]:
    """Every record a ``read_committed`` consumer sees in ``topic``, up to the end.

    ``commit_transaction`` returns once the coordinator has logged the decision; it writes
    the commit markers into the partitions after that, and until then a ``read_committed``
    end (the last stable offset) stops before the transaction's records: read at once, a
    batch committed a moment ago looked empty (seen in CI). So the read first waits up to
    ``settle`` seconds for every partition's last stable offset to reach its high
    watermark (at once in the usual case; a transaction left open on purpose reads as
    before, after the wait)."""
    deadline = time.monotonic() + settle
    ends, open_ = _stable_offsets(bootstrap, topic)
    while open_ and time.monotonic() < deadline:
        time.sleep(0.1)
        ends, open_ = _stable_offsets(bootstrap, topic)
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"eos-read-{uuid.uuid4().hex[:8]}",
        "isolation.level": "read_committed", "enable.auto.commit": False,
        "enable.partition.eof": True, "auto.offset.reset": "earliest",
    })
    try:
        todo = {p for p, (lo, hi) in ends.items() if hi > lo}
        consumer.assign([TopicPartition(topic, p, ends[p][0]) for p in todo])
        out: list[Message] = []
        deadline = time.monotonic() + timeout
        while todo:
            if time.monotonic() > deadline:
                raise AssertionError(f"reading {topic}: partitions {todo} did not reach their end")
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    todo.discard(msg.partition())
                    continue
                raise KafkaException(err)
            headers = tuple((str(h[0]), _bytes(h[1])) for h in (msg.headers() or []))
            partition, offset = int(msg.partition() or 0), int(msg.offset() or 0)
            out.append(Message(msg.topic() or topic, partition, offset, _bytes(msg.key()),
                               _bytes(msg.value()), headers, int(msg.timestamp()[1])))
            if offset >= ends[partition][1] - 1:
                todo.discard(partition)
        return out
    finally:
        consumer.close()


class KafkaTarget:
    """One test's output topic and sink id, and checks on what consumers see."""

    def __init__(self, bootstrap: str, prefix: str, partitions: int = 3) -> None:
        tag = uuid.uuid4().hex[:8]
        self.bootstrap = bootstrap
        self.topic = f"eos-{prefix}-{tag}"
        self.sink_id = f"{prefix}-{tag}"
        self.partitions = partitions
        self.created: list[str] = []

    @property
    def marker_topic(self) -> str:
        return f"_connectors.{self.sink_id}.markers"

    @property
    def ledger_topic(self) -> str:
        return f"_connectors.{self.sink_id}.ledger"

    def create(self, topic: str | None = None, partitions: int | None = None,
               config: dict[str, str] | None = None) -> str:
        name = topic or self.topic
        new = NewTopic(name, num_partitions=partitions or self.partitions, replication_factor=1,
                       config=config or {})
        admin = _admin(self.bootstrap)  # keep a reference: the future needs its client
        admin.create_topics([new])[name].result(30)
        self.created.append(name)
        return name

    def produce_input(self, topic: str, count: int, *, start: int = 0) -> None:
        """``count`` records with ids ``start..`` into ``topic`` (plain, non-transactional)."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        for i in range(start, start + count):
            producer.produce(topic, key=str(i).encode(),
                             value=json.dumps({"id": i}).encode(),
                             headers=[("n", str(i).encode())])
        assert producer.flush(30) == 0

    def messages(self, topic: str | None = None) -> list[Message]:
        return read_all(self.bootstrap, topic or self.topic)

    def ids(self, topic: str | None = None) -> list[int]:
        return [int(m.json()["id"]) for m in self.messages(topic)]

    def assert_exact(self, total: int, topic: str | None = None) -> None:
        """Each id 0..total-1 exactly once for a read_committed consumer; no open txn."""
        ids = self.ids(topic)
        counts = collections.Counter(ids)
        missing = [i for i in range(total) if counts[i] == 0]
        dup = sorted(i for i, c in counts.items() if c > 1)
        extra = sorted(i for i in counts if not 0 <= i < total)
        assert not missing and not dup and not extra, (
            f"missing {missing[:20]} ({len(missing)}), duplicated {dup[:20]} ({len(dup)}), "
            f"unexpected {extra[:20]}")
        self.assert_no_open_transactions()

    def assert_no_open_transactions(self) -> None:
        topics = [self.topic, self.marker_topic]
        stuck = wait_no_open_transactions(self.bootstrap, topics)
        assert not stuck, f"open transactions (LSO < HWM): {stuck}"

    def cleanup(self) -> None:
        names = [*self.created, self.marker_topic, self.ledger_topic]
        try:
            admin = _admin(self.bootstrap)
            existing = set(admin.list_topics(timeout=30).topics)
            names = [n for n in names if n in existing]
            if names:
                for future in admin.delete_topics(names, operation_timeout=30).values():
                    future.result(30)
        except Exception as exc:  # cleanup must not hide the test's result
            print(f"warning: could not delete topics {names}: {exc}")


def markers(bootstrap: str, marker_topic: str) -> dict[int, list[dict[str, Any]]]:
    """Committed slot markers, per slot (partition), oldest first."""
    found: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for m in read_all(bootstrap, marker_topic):
        if (m.key or b"").endswith(b"/probe"):  # a kept producer's proof of ownership
            continue
        found[m.partition].append(m.json())
    return dict(found)


def ledger(bootstrap: str, ledger_topic: str) -> dict[str, Any]:
    """The ledger topic as a compacted map: key -> value (tombstones remove keys)."""
    state: dict[str, Any] = {}
    for m in read_all(bootstrap, ledger_topic):
        key = (m.key or b"").decode()
        if m.value is None:
            state.pop(key, None)
        else:
            state[key] = m.json()
    return state


def ledger_batches(bootstrap: str, ledger_topic: str) -> dict[int, str]:
    """Batch id -> state recorded in the ledger."""
    return {int(k.split("/")[1]): v["state"]
            for k, v in ledger(bootstrap, ledger_topic).items() if k.startswith("batch/")}


def target_fixture(prefix: str, partitions: int = 3, *, create: bool = True) -> Any:
    """A test module's ``kafka`` fixture: a fresh :class:`KafkaTarget` per test (its output
    topic created unless ``create=False``), every topic it made deleted afterwards.

    Use as ``kafka = target_fixture("kill")`` at module level."""

    @pytest.fixture(name="kafka")
    def kafka(kafka_bootstrap: str) -> Iterator[KafkaTarget]:
        target = KafkaTarget(kafka_bootstrap, prefix=prefix, partitions=partitions)
        if create:
            target.create()
        yield target
        target.cleanup()

    return kafka
