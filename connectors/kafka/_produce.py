"""Executor side: every way a slot enqueues its records into librdkafka.

:func:`produce_batch` picks the path of one Arrow record batch: a batch producer
(:func:`fast_producer`: the ctypes accelerator of :mod:`connectors.kafka._native_produce`,
behind its gate :mod:`connectors.kafka._native`, or :class:`BatchProducer` below, on the
public ``Producer.produce_batch``), or one ``produce()`` per record (:func:`produce_records`;
always for records with headers). The rows per path are the ``produce_<path>_rows`` metrics.

The public batch path (:class:`BatchProducer`) is the sink's default fast path wherever
the ctypes accelerator is not verified. ``produce_batch(topic, messages, partition=p)``
(confluent-kafka >= 2.16) hands a list of message dicts to librdkafka's
``rd_kafka_produce_batch`` in one call. What the installed 2.16.1 does, checked here and
in tests/kafka/test_kafka_batch.py:

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
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, KafkaException

from connectors.kafka._native_produce import NativeProducer, attach
from connectors.kafka._owned import OwnedBatch
from connectors.kafka._placement import (
    METADATA_REFRESH_MS,
    MURMUR2_PARTITIONERS,
    PARTITION_UA,
    Placer,
    layout,
)

__all__ = ["CHUNK", "PRODUCE_PATHS", "BatchProducer", "FastProducer", "fast_producer",
           "has_public_batch", "produce_batch", "produce_records"]

#: The paths a record can take into librdkafka (rows per path are a slot's and a batch's
#: ``produce_<path>_rows`` figures; the batch's ``path`` is the one with the most rows).
PRODUCE_PATHS = ("owned", "native", "batch", "record")

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

    #: The produce path of records enqueued here (see :data:`PRODUCE_PATHS`).
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


#: A slot's batch producer: the accelerator or the public ``produce_batch`` on
#: confluent-kafka's ``Producer``, or the owned handle's Arrow batches.
FastProducer = NativeProducer | BatchProducer | OwnedBatch


def fast_producer(producer: Any, mode: str, timeout: float, *, partitioner: str | None,
                  refresh_ms: int, queue_limit: int) -> FastProducer | None:
    """The batch producer a slot uses for ``producer`` under ``mode``
    (:attr:`~connectors.kafka._config.KafkaOptions.produce_mode`: ``"auto"`` the ctypes
    accelerator where verified, else the public ``produce_batch``; ``"public"`` never the
    accelerator; ``"record"``), or ``None`` (one ``produce()`` per record)."""
    if mode == "record":
        return None
    if mode == "auto":
        native = attach(producer, timeout, partitioner=partitioner, refresh_ms=refresh_ms)
        if native is not None:
            return native
    if not has_public_batch(producer):
        return None
    return BatchProducer(producer, timeout, by_key=partitioner in MURMUR2_PARTITIONERS,
                         refresh_ms=refresh_ms, queue_limit=queue_limit)


def _has_headers(batch: pa.RecordBatch) -> bool:
    """Some record of ``batch`` has at least one header."""
    names = batch.schema.names
    if "headers" not in names:
        return False
    lengths = pc.list_value_length(batch.column(names.index("headers")))
    top = pc.max(lengths).as_py()
    return top is not None and top > 0


def _produce_fast(fast: FastProducer, batch: pa.RecordBatch, fixed_topic: str | None) -> int:
    names = batch.schema.names
    values = batch.column(names.index("value"))
    keys = batch.column(names.index("key")) if "key" in names else None
    parts = batch.column(names.index("partition")) if "partition" in names else None
    if fixed_topic is not None:
        return fast.produce(fixed_topic, values, keys, parts)
    topics = batch.column(names.index("topic"))
    n = 0
    # Per topic, in the order of first appearance; a filter keeps each topic's order.
    for topic in pc.unique(topics).to_pylist():
        mask = pc.equal(topics, topic)
        n += fast.produce(
            str(topic), values.filter(mask), keys.filter(mask) if keys is not None else None,
            parts.filter(mask) if parts is not None else None)
    return n


def produce_batch(produce: Callable[..., Any], poll: Callable[[float], Any],
                  batch: pa.RecordBatch, fixed_topic: str | None,
                  fast: FastProducer | None = None) -> tuple[int, str]:
    """Produce every record of ``batch``; returns the count and the path that ran
    (``"native"``, ``"batch"`` or ``"record"``). Waits when the queue is full.

    With ``fast`` (and no record with headers, which ``produce_batch`` would drop), the
    records are enqueued in batches by ``fast`` (:mod:`connectors.kafka._native_produce` or
    :class:`BatchProducer`); otherwise one ``produce`` call per record.
    """
    if fast is not None and not _has_headers(batch):
        return _produce_fast(fast, batch, fixed_topic), fast.path
    return produce_records(produce, poll, batch, fixed_topic), "record"


def produce_records(produce: Callable[..., Any], poll: Callable[[float], Any],
                     batch: pa.RecordBatch, fixed_topic: str | None) -> int:
    names = batch.schema.names
    values = batch.column(names.index("value")).to_pylist()
    keys = batch.column(names.index("key")).to_pylist() if "key" in names else None
    n = len(values)
    simple = fixed_topic is not None and not ({"headers", "partition"} & set(names))
    if simple:
        topic = fixed_topic
        for i in range(n):
            value, key = values[i], (keys[i] if keys is not None else None)
            while True:
                try:
                    produce(topic, value, key)
                    break
                except BufferError:
                    poll(0.05)
        return n
    headers = batch.column(names.index("headers")).to_pylist() if "headers" in names else None
    parts = batch.column(names.index("partition")).to_pylist() if "partition" in names else None
    topics = batch.column(names.index("topic")).to_pylist() if fixed_topic is None else None
    for i in range(n):
        kwargs: dict[str, Any] = {"value": values[i]}
        if keys is not None:
            kwargs["key"] = keys[i]
        if headers is not None and headers[i]:
            kwargs["headers"] = [(h["key"], h["value"]) for h in headers[i]]
        if parts is not None and parts[i] is not None:
            kwargs["partition"] = int(parts[i])
        topic = fixed_topic if topics is None else topics[i]
        while True:
            try:
                produce(topic, **kwargs)
                break
            except BufferError:
                poll(0.05)
    return n
