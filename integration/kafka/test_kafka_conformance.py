"""KafkaSink passes the same conformance suite as the in-memory sinks, on a real broker.

Run with ``barrier=False`` and ``barrier=True``. Tasks run in-process (``LocalBatch``:
simulated retries and speculative attempts, task-side crash points fire in-process; a
barrier stage runs its tasks at once, in threads, sharing a real barrier, so with
``barrier=True`` the slots align with ``allGather`` and a failed slot fails the stage),
the transactions, markers and ledger are real Kafka ones. The kit's rows
``(batch, seq, payload)`` become records: ``value`` the row as JSON, ``key``
``"<batch>-<seq>"``; a ``read_committed`` consumer decodes them back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from connectors.core.batch import BatchInput
from connectors.kafka import KafkaSink
from connectors.testing import LocalBatch, SinkConformanceTests, SinkHarness, batch_rows
from integration.support._kafka import KafkaTarget, read_all, wait_no_open_transactions

pytestmark = pytest.mark.integration
#: Both modes: LocalBatch runs a barrier stage's tasks at once with a real barrier.
BARRIERS = [False, True]

#: How long ``lingering_transactions`` waits for late commit/abort markers (seconds).
LINGER_BOUND_S = 5.0


def to_records(table: pa.Table) -> pa.Table:
    """The kit's ``(batch, seq, payload)`` rows as Kafka records (``key``, ``value``)."""
    rows = table.to_pylist()
    return pa.table({
        "key": pa.array([f"{r['batch']}-{r['seq']}" for r in rows], pa.string()),
        "value": pa.array([json.dumps(r, sort_keys=True) for r in rows], pa.string()),
    })


class KafkaHarness(SinkHarness):
    """One fresh output topic (created by the sink) and one sink id per harness."""

    def __init__(self, bootstrap: str, *, barrier: bool, slots: int = 2) -> None:
        self.target = KafkaTarget(bootstrap, prefix="conf", partitions=2)
        self.bootstrap = bootstrap
        self.barrier = barrier
        self.slots = slots

    @property
    def sink_ids(self) -> list[str]:
        base = self.target.sink_id
        return [base, f"{base}-2"[:40]]

    def new_sink(self, **overrides: Any) -> KafkaSink:
        options: dict[str, Any] = {
            "sink_id": self.target.sink_id, "slots": self.slots, "barrier": self.barrier,
            "create_topic": True, "topic_partitions": self.target.partitions,
            "operation_timeout": 15.0,
        }
        options.update(overrides)
        return KafkaSink(self.target.topic, {"bootstrap.servers": self.bootstrap}, **options)

    def make_batch(self, table: pa.Table, *, partitions: int, **options: Any) -> BatchInput:
        return LocalBatch(to_records(table), partitions=partitions, **options)

    def _existing(self, names: list[str]) -> list[str]:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        topics = set(admin.list_topics(timeout=30).topics)
        return [n for n in names if n in topics]

    def _topics(self) -> list[str]:
        """The output topic, and the marker and ledger topics of both sink ids."""
        names = [self.target.topic]
        for sid in self.sink_ids:
            names += [f"_connectors.{sid}.markers", f"_connectors.{sid}.ledger"]
        return names

    def committed_rows(self) -> list[tuple[Any, ...]]:
        if not self._existing([self.target.topic]):
            return []
        rows: list[tuple[Any, ...]] = []
        for m in read_all(self.bootstrap, self.target.topic):
            row = m.json()
            if (m.key or b"").decode() != f"{row['batch']}-{row['seq']}":
                raise AssertionError(f"record key {m.key!r} does not match its value {row}")
            rows.append((row["batch"], row["seq"], row["payload"]))
        return rows

    def lingering_transactions(self) -> int:
        """Partitions whose last stable offset stays below the high watermark (an open
        transaction) on the output topic and the marker and ledger topics of both sink
        ids, after a short wait for late commit/abort markers."""
        topics = self._existing(self._topics())
        stuck = wait_no_open_transactions(self.bootstrap, topics, timeout=LINGER_BOUND_S)
        return sum(len(parts) for parts in stuck.values())

    def cleanup(self) -> None:
        names = self._existing(self._topics())
        if not names:
            return
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        try:
            for future in admin.delete_topics(names, operation_timeout=30).values():
                future.result(30)
        except Exception as exc:  # cleanup must not hide the test's result
            print(f"warning: could not delete topics {names}: {exc}")


class TestKafkaSinkConformance(SinkConformanceTests):
    @pytest.fixture(autouse=True, params=BARRIERS, ids=lambda b: "barrier" if b else "no-barrier")
    def _bootstrap(self, request: pytest.FixtureRequest, kafka_bootstrap: str) -> Iterator[None]:
        self.bootstrap = kafka_bootstrap
        self.barrier: bool = request.param
        self.harnesses: list[KafkaHarness] = []
        yield
        for h in self.harnesses:
            h.cleanup()

    def make_harness(self) -> SinkHarness:
        h = KafkaHarness(self.bootstrap, barrier=self.barrier)
        self.harnesses.append(h)
        return h


def test_the_harness_sees_duplicates_and_open_transactions(kafka_bootstrap: str) -> None:
    """The harness's reads can fail the suite: a batch written by two sink ids shows as
    duplicated rows, and a transaction left open on the output topic is counted."""
    h = KafkaHarness(kafka_bootstrap, barrier=False)
    try:
        h.new_sink().write_batch(h.make_batch(batch_rows(0), partitions=2), 0, query_id="q")
        h.new_sink(sink_id=h.sink_ids[1]).write_batch(
            h.make_batch(batch_rows(0), partitions=1), 0, query_id="q")
        rows = h.committed_rows()
        assert len(rows) == 2 * batch_rows(0).num_rows
        assert set(rows) == {(0, i, f"row-0-{i}") for i in range(batch_rows(0).num_rows)}
        assert h.lingering_transactions() == 0
        producer = Producer({"bootstrap.servers": kafka_bootstrap,
                             "transactional.id": f"conf-open-{h.target.sink_id}"})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(h.target.topic, key=b"9-0", value=b'{"batch": 9}', partition=0)
        assert producer.flush(30) == 0
        assert h.lingering_transactions() == 1
        producer.abort_transaction(30)
        assert h.lingering_transactions() == 0
    finally:
        h.cleanup()
