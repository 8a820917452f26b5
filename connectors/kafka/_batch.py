"""Executor side: batch produce on confluent-kafka's public ``Producer.produce_batch``.

The sink's default fast path wherever the ctypes accelerator (:mod:`connectors.kafka._native`)
is not verified. ``produce_batch(topic, messages, partition=p)`` (confluent-kafka >= 2.16)
hands a list of message dicts to librdkafka's ``rd_kafka_produce_batch`` in one call. What
the installed 2.16.1 does, checked here and in tests/kafka/test_kafka_batch.py:

- it enqueues every message to the call's ``partition`` (``RD_KAFKA_PARTITION_UA``: the
  partitioner of each record's key); a message dict's own ``partition`` is ignored (the
  call passes no ``RD_KAFKA_MSG_F_PARTITION``): so records go out one partition per call,
  placed by :class:`~connectors.kafka._placement.Placer`, or in runs of input order;
- ``headers`` are dropped silently: a batch with headers is produced record by record;
- a refused message does not raise: the count of queued messages is returned and the
  refused message's dict gets ``"_error"`` (a ``KafkaError``; ``_QUEUE_FULL`` when the
  queue is full, and librdkafka goes on with the next message);
- each message carries the producer's ``on_delivery`` callback: failed deliveries are
  reported as for ``produce()``.

Order: librdkafka tries every message of a call, so when the queue fills up in the middle
of one, a later message may be queued after an earlier one was refused. The refused tail is
only retried (after serving delivery reports) when every message after the first refusal
was refused too; otherwise the partition's order is lost and the call raises, and the
transaction is aborted. To keep that from happening, a call waits until the queue has room
for all its messages (``len(producer)``, which counts at least the queued messages).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException

from connectors.kafka._placement import METADATA_REFRESH_MS, PARTITION_UA, Placer, layout

__all__ = ["CHUNK", "BatchProducer", "has_public_batch"]

#: Records per ``produce_batch`` call: bounds the list of dicts built at once and lets
#: delivery reports be served between calls.
CHUNK = 16_384
#: How long a call waits for room in the producer's queue before it tries anyway (s).
ROOM_WAIT_S = 30.0


def has_public_batch(producer: Any) -> bool:
    """The installed confluent-kafka has ``Producer.produce_batch`` (>= 2.16)."""
    return callable(getattr(producer, "produce_batch", None))


class BatchProducer(Placer):
    """Batch produce through ``producer.produce_batch``: one call per partition run.

    ``queue_limit``: the producer's ``queue.buffering.max.messages``.
    """

    #: The ``produce_path`` metric of records enqueued here.
    path = "batch"

    def __init__(self, producer: Any, timeout: float, *, by_key: bool = False,
                 refresh_ms: int = METADATA_REFRESH_MS, queue_limit: int = 100_000) -> None:
        super().__init__(producer, timeout, by_key=by_key, refresh_ms=refresh_ms)
        self._chunk = max(1, min(CHUNK, queue_limit))
        self._queue_limit = queue_limit

    def produce(self, topic: str, values: pa.Array, keys: pa.Array | None,
                partitions: pa.Array | None) -> int:
        """Enqueue every record (into the open transaction); returns the count.

        Waits (serving delivery reports) while the producer's queue is full; raises
        ``KafkaException`` for any other refusal, which leaves the transaction to abort.
        """
        n = len(values)
        if n == 0:
            return 0
        key_layout = layout(keys) if keys is not None and self.by_key else None
        placed = self.place(topic, n, key_layout, partitions)
        if placed.order is not None:
            take = pa.array(placed.order.astype(np.int64))
            values = values.take(take)
            keys = keys.take(take) if keys is not None else None
        vals = values.to_pylist()
        keyed = keys.to_pylist() if keys is not None else None
        for start, end, partition in placed.runs:
            for a in range(start, end, self._chunk):
                b = min(end, a + self._chunk)
                if keyed is None:
                    msgs = [{"value": v} for v in vals[a:b]]
                else:
                    msgs = [{"value": v, "key": k} for v, k in zip(vals[a:b], keyed[a:b],
                                                                    strict=True)]
                self._enqueue(topic, msgs, partition)
                self.producer.poll(0)
        return n

    def _room(self, wanted: int) -> None:
        """Serve delivery reports until the queue has room for ``wanted`` more messages
        (at most :data:`ROOM_WAIT_S`; then the call tries anyway)."""
        deadline = time.monotonic() + ROOM_WAIT_S
        while (len(self.producer) + wanted > self._queue_limit and len(self.producer)
               and time.monotonic() < deadline):
            self.producer.poll(0.05)

    def _enqueue(self, topic: str, msgs: list[dict[str, Any]], partition: int) -> None:
        while msgs:
            self._room(len(msgs))
            if partition == PARTITION_UA:
                good = self.producer.produce_batch(topic, msgs)
            else:
                good = self.producer.produce_batch(topic, msgs, partition=partition)
            if good == len(msgs):
                return
            errors = [m.get("_error") for m in msgs]
            first = next(i for i, e in enumerate(errors) if e is not None)
            err = errors[first]
            code = err.code() if isinstance(err, KafkaError) else KafkaError._FAIL
            if code != KafkaError._QUEUE_FULL:
                raise KafkaException(err if isinstance(err, KafkaError)
                                     else KafkaError(code, "produce_batch refused a record"))
            if any(e is None for e in errors[first:]):
                # A later record was queued after a refused one: its partition's order is
                # lost, only an abort undoes that.
                raise KafkaException(KafkaError(
                    KafkaError._QUEUE_FULL,
                    f"the producer queue filled up in the middle of a batch for {topic!r}: "
                    "records after a refused one were queued. Raise "
                    "queue.buffering.max.kbytes or queue.buffering.max.messages"))
            msgs = msgs[first:]
            for m in msgs:
                m.pop("_error", None)
            self.producer.poll(0.05)
