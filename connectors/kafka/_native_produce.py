"""Executor side, private internals: :class:`NativeProducer`, a whole Arrow column
enqueued into librdkafka with ctypes, and :func:`attach`, which makes one only after the
gate of :mod:`connectors.kafka._native`
(:func:`~connectors.kafka._native.verify_accelerator`) allowed this process and the
producer's own handle checked out."""

from __future__ import annotations

import ctypes
import itertools
import logging
from typing import Any

import numpy as np
import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Producer

from connectors.kafka._native import (
    CHUNK,
    ERR_FATAL,
    ERR_QUEUE_FULL,
    MESSAGE,
    RD_KAFKA_MSG_F_COPY,
    RD_KAFKA_MSG_F_PARTITION,
    RD_KAFKA_PARTITION_UA,
    STATE,
    RdKafka,
    verify_accelerator,
)
from connectors.kafka._placement import (
    METADATA_REFRESH_MS,
    MURMUR2_PARTITIONERS,
    ArrayLayout,
    Placer,
    layout,
)

__all__ = ["NativeProducer", "attach"]

logger = logging.getLogger(__name__)


class NativeProducer(Placer):
    """Batch produce on one confluent-kafka ``Producer``'s librdkafka handle."""

    #: The produce path of records enqueued here (see ``_produce.PRODUCE_PATHS``).
    path = "native"

    def __init__(self, producer: Producer, rk: int, lib: RdKafka, timeout: float, *,
                 by_key: bool = False, refresh_ms: int = METADATA_REFRESH_MS) -> None:
        super().__init__(producer, timeout, by_key=by_key, refresh_ms=refresh_ms)
        self.producer = producer  # keeps rk alive as long as this object
        self._rk = rk
        self._lib = lib
        #: Topic handles (``rd_kafka_topic_t *``) of this producer, released in ``__del__``.
        self._topics: dict[str, int] = {}
        self._msgs: np.ndarray | None = None

    def __del__(self) -> None:
        for rkt in self._topics.values():
            self._lib.lib.rd_kafka_topic_destroy(rkt)
        self._topics.clear()

    def _topic(self, topic: str) -> int:
        """The producer's handle of ``topic``, its metadata known (see
        :mod:`connectors.kafka._placement`: one fetch per topic and producer)."""
        rkt = self._topics.get(topic)
        if rkt is not None:
            return rkt
        rkt = int(self._lib.lib.rd_kafka_topic_new(self._rk, topic.encode(), None) or 0)
        if not rkt:
            raise KafkaException(KafkaError(KafkaError._INVALID_ARG,
                                            f"cannot open topic {topic!r} for producing"))
        try:
            self.known(topic)
        except BaseException:
            self._lib.lib.rd_kafka_topic_destroy(rkt)
            raise
        self._topics[topic] = rkt
        return rkt

    def produce(self, topic: str, values: pa.Array, keys: pa.Array | None,
                partitions: pa.Array | None) -> int:
        """Enqueue every record (into the open transaction); returns the count.

        Waits (serving delivery reports) while the producer's queue is full; raises
        ``KafkaException`` for any other refusal, which leaves the transaction to abort.
        """
        n = len(values)
        if n == 0:
            return 0
        # The arrays the addresses point into stay referenced until the function returns.
        payload, length, _values = _pointers(values)
        key_layout = layout(keys) if keys is not None else None
        key, key_len, _keys = (_pointers(key_layout) if key_layout is not None
                               else (None, None, None))
        rkt = self._topic(topic)
        placed = self.place(topic, n, key_layout if self.by_key else None, partitions)
        place, order = placed.place, placed.order
        grouped = order is not None
        lib = self._lib.lib
        msgs = self._messages()
        for start in range(0, n, CHUNK):
            end = min(n, start + CHUNK)
            m = msgs[: end - start]
            rows = slice(start, end) if order is None else order[start:end]
            m["err"] = 0
            m["payload"] = payload[rows]
            m["len"] = length[rows]
            if key is not None and key_len is not None:
                m["key"] = key[rows]
                m["key_len"] = key_len[rows]
            else:
                m["key"] = 0
                m["key_len"] = 0
            if place is None:
                self._enqueue(lib, rkt, m, RD_KAFKA_PARTITION_UA, 0)
            elif not grouped:
                m["partition"] = place[rows]
                self._enqueue(lib, rkt, m, RD_KAFKA_PARTITION_UA, RD_KAFKA_MSG_F_PARTITION)
            else:
                # The chunk is sorted by partition: one call per partition.
                dest = place[rows]
                cuts = [0, *(np.flatnonzero(dest[1:] != dest[:-1]) + 1).tolist(), len(m)]
                for a, b in itertools.pairwise(cuts):
                    self._enqueue(lib, rkt, m[a:b], int(dest[a]), 0)
            self.producer.poll(0)
        return n

    def _messages(self) -> np.ndarray:
        """This producer's ``rd_kafka_message_t`` array (:data:`CHUNK` records), allocated
        once: a new one per call (1.2 MB, zeroed pages) cost page faults every time.
        librdkafka writes only ``err``; every other field the caller sets is set again for
        each chunk (``_private``, the per-record opaque, stays 0)."""
        if self._msgs is None:
            self._msgs = np.zeros(CHUNK, MESSAGE)
        return self._msgs

    def _enqueue(self, lib: Any, rkt: int, m: np.ndarray, partition: int, flags: int) -> None:
        """Enqueue ``m`` to ``partition`` (``RD_KAFKA_PARTITION_UA``: each record's own
        partition with ``RD_KAFKA_MSG_F_PARTITION``, else the partitioner's choice),
        copying each payload."""
        done = 0
        while done < len(m):
            rest = m[done:]
            good = lib.rd_kafka_produce_batch(rkt, partition, RD_KAFKA_MSG_F_COPY | flags,
                                              rest.ctypes.data, len(rest))
            if good == len(rest):
                return
            errors = rest["err"]
            first = int(np.flatnonzero(errors)[0])
            code = int(errors[first])
            if code != ERR_QUEUE_FULL or np.count_nonzero(errors[first:] != ERR_QUEUE_FULL):
                bad = code if code != ERR_QUEUE_FULL else int(
                    errors[first:][errors[first:] != ERR_QUEUE_FULL][0])
                raise KafkaException(self._error(bad))
            done += first  # records before the first QUEUE_FULL are enqueued, in order
            self.producer.poll(0.05)

    def _error(self, code: int) -> KafkaError:
        if code == ERR_FATAL:
            buf = ctypes.create_string_buffer(512)
            original = self._lib.lib.rd_kafka_fatal_error(self._rk, buf, len(buf))
            reason = buf.value.decode(errors="replace")
            return KafkaError(original or ERR_FATAL, reason, fatal=True)
        return KafkaError(code, f"librdkafka refused a record: {KafkaError(code).str()}")


def _pointers(arr: pa.Array | pa.ChunkedArray | ArrayLayout,
              ) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """(address, length) of every value of a string/binary array (null: (0, 0)), and the
    array they point into: keep it alive while the addresses are in use."""
    values = arr if isinstance(arr, ArrayLayout) else layout(arr)
    # An empty value is a non-NULL pointer with length 0 (NULL is a null value).
    address = values.start.astype(np.uint64) + np.uint64(values.base)
    if values.nulls is not None:
        address[values.nulls] = 0
    return address, values.size.astype(np.uint64), values.arr


def attach(producer: Producer, timeout: float = 30.0, *,
           partitioner: str | None = None,
           refresh_ms: int = METADATA_REFRESH_MS) -> NativeProducer | None:
    """The accelerator for ``producer``, or ``None`` (then the public path).

    Reads ``producer``'s ``rd_kafka_t *`` only after :func:`verify_accelerator` allowed this
    process (allow-listed layout, verified in a throwaway child), and checks it with
    ``rd_kafka_opaque`` before use. ``partitioner``: the producer's ``partitioner``
    setting (with one of :data:`MURMUR2_PARTITIONERS` keyed records are placed here).
    ``refresh_ms``: its ``topic.metadata.refresh.interval.ms``.
    """
    if not isinstance(producer, Producer):
        return None
    decision = verify_accelerator()
    lib = STATE.lib
    if decision.offset is None or lib is None:
        return None
    rk = ctypes.c_void_p.from_address(id(producer) + decision.offset).value
    if not rk or lib.lib.rd_kafka_opaque(rk) != id(producer):
        if not STATE.warned_handle:
            STATE.warned_handle = True
            logger.warning("batch produce accelerator: a producer's handle did not verify "
                           "(rd_kafka_opaque); such slots produce through "
                           "Producer.produce_batch")
        return None
    return NativeProducer(producer, rk, lib, timeout,
                          by_key=partitioner in MURMUR2_PARTITIONERS, refresh_ms=refresh_ms)
