"""KafkaSink's kept slot producers on a real broker, fenced by other real processes.

A Python worker keeps a slot's producer between batches (``reuse_producers=True``). These
tests drive slot 0 in this process as a worker would, and let another process take the
slot's transactional id in the middle of a batch: once only fencing it (as the driver's
``fence_all`` does), once as a whole other attempt of the same slot that commits first. The
kept producer's commit then fails as fenced and the slot starts over; a ``read_committed``
consumer must see every record exactly once, with one marker per batch.
"""

from __future__ import annotations

import collections
import json
import multiprocessing

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from connectors.core.fingerprint import fingerprint_batch
from connectors.core.templates.tasks import SlotMarker, SlotTransaction
from connectors.kafka import KafkaSink
from connectors.kafka._pool import SlotProducers
from integration.support._kafka import KafkaTarget, markers, target_fixture

pytestmark = [pytest.mark.integration]

RUN = "keptrun1"


kafka = target_fixture("kept", partitions=2)


def _records(ids: range) -> pa.RecordBatch:
    values = [json.dumps({"id": i}).encode() for i in ids]
    return pa.record_batch({"value": pa.array(values, pa.binary())})


def _ctx(sink: KafkaSink, batch_id: int) -> SlotTransaction:
    return SlotTransaction(sink.sink_id, 0, batch_id, RUN, 0, batch_id,
                           pa.schema([("value", pa.binary())]))


def _marker(sink: KafkaSink, batch_id: int, records: pa.RecordBatch) -> SlotMarker:
    return SlotMarker(sink.sink_id, 0, batch_id, 0, RUN, fingerprint_batch(records))


def _whole_slot(sink: KafkaSink, batch_id: int, ids: range) -> dict[str, float]:
    """Slot 0 of ``batch_id``, start to commit, as one task; returns its figures."""
    records = _records(ids)
    handle = sink.open_slot(_ctx(sink, batch_id))
    assert sink.read_marker(handle) is None
    sink.write(handle, records)
    return dict(sink.commit_slot(handle, _marker(sink, batch_id, records)))


def _fence_only(bootstrap: str, transactional_id: str) -> None:
    from confluent_kafka import Producer

    Producer({"bootstrap.servers": bootstrap,
              "transactional.id": transactional_id}).init_transactions(30)


def _other_attempt(sink: KafkaSink, batch_id: int, first: int, last: int) -> None:
    figures = _whole_slot(sink, batch_id, range(first, last))
    assert figures["reused"] == 0  # a new process has nothing kept


def _in_another_process(target: object, *args: object) -> None:
    proc = multiprocessing.get_context("spawn").Process(target=target, args=args)
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0, f"the other process failed (exit code {proc.exitcode})"


def test_a_kept_producer_fenced_by_other_processes_starts_over_exactly_once(
    spark: SparkSession, kafka: KafkaTarget
) -> None:
    SlotProducers.clear()
    sink = KafkaSink(kafka.topic, {"bootstrap.servers": kafka.bootstrap},
                     sink_id=kafka.sink_id, slots=2)
    # Batch 0 through Spark: the marker topic, the ledger, the checked topic.
    sink(spark.createDataFrame([(json.dumps({"id": i}),) for i in range(10)], "value string"),
         0)
    slot_id = _ctx(sink, 1).name

    # Batch 1: a new producer, kept by this "worker" after its commit.
    assert _whole_slot(sink, 1, range(10, 20))["reused"] == 0

    # Batch 2: the kept producer passes its probe and writes; then another process fences
    # the slot id (as fence_all after a restart does). The commit fails as fenced, the slot
    # starts over with a new producer, finds no marker and writes the batch again.
    records = _records(range(20, 30))
    handle = sink.open_slot(_ctx(sink, 2))
    assert handle.reused
    assert sink.read_marker(handle) is None
    sink.write(handle, records)
    _in_another_process(_fence_only, kafka.bootstrap, slot_id)
    figures = sink.commit_slot(handle, _marker(sink, 2, records))
    assert figures == {**figures, "reused": 0, "by_other": 0, "rows": 10}

    # Batch 3: the producer kept after batch 2 begins; another attempt of the same slot, in
    # another process, writes and commits the batch first (fencing this one). The commit
    # fails, the slot starts over, finds that attempt's marker (same content) and writes
    # nothing.
    records = _records(range(30, 40))
    handle = sink.open_slot(_ctx(sink, 3))
    assert handle.reused
    assert sink.read_marker(handle) is None
    sink.write(handle, records)
    _in_another_process(_other_attempt, sink, 3, 30, 40)
    figures = sink.commit_slot(handle, _marker(sink, 3, records))
    assert figures["by_other"] == 1

    kafka.assert_exact(40)
    slot_batches = collections.Counter(m["batch_id"] for m in markers(
        kafka.bootstrap, kafka.marker_topic)[0])
    assert all(slot_batches[b] == 1 for b in (1, 2, 3)), slot_batches
    sink.close()
    SlotProducers.clear()
