"""Executor side: the slot's transactional producer on a handle this library owns
(:class:`~connectors.kafka._rdkafka.ArrowProducer`, librdkafka's public C API), behind the
calls and errors of confluent-kafka's ``Producer`` that the slot uses
(:class:`~connectors.kafka._slot_producer.SlotProducer`).

So the slot's transaction code (:mod:`._writer`, :mod:`._committer`) runs unchanged on
either producer: every librdkafka error is raised as ``KafkaException(KafkaError(code,
reason, fatal=, retriable=, txn_requires_abort=))``, the flags librdkafka itself set, and
:func:`connectors.kafka._errors.translate` maps it as it maps confluent-kafka's.
Failed deliveries land in ``errors`` and error events (``error_cb``'s) in ``reported``,
the lists :class:`~connectors.kafka._pool.PooledProducer` holds.

:class:`OwnedBatch` is the slot's batch path on it (``produce_owned_rows``): the Arrow
buffers straight into ``rd_kafka_produce_batch``. Records with headers go one by one
through :meth:`OwnedProducer.produce` (``rd_kafka_produceva`` with
``RD_KAFKA_VTYPE_HEADER`` entries), on the same handle and in the same transaction: a
slot has one producer per transactional id, so no batch can go to another client.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException

from connectors.kafka._placement import METADATA_REFRESH_MS, Placer, layout
from connectors.kafka._rdkafka import ArrowProducer
from connectors.kafka._rdkafka_lib import (
    ERR_QUEUE_FULL,
    ERR_TIMED_OUT,
    MSG_F_COPY,
    VT_HEADER,
    VT_KEY,
    VT_MSGFLAGS,
    VT_PARTITION,
    VT_RKT,
    VT_VALUE,
    VU,
    Library,
    RdKafkaError,
)

__all__ = ["ClusterMetadata", "OwnedBatch", "OwnedProducer", "kafka_exception"]

#: A value of a config key that cannot be set with ``rd_kafka_conf_set``.
INVALID_ARG = -186


def kafka_exception(exc: RdKafkaError) -> KafkaException:
    """``exc`` as confluent-kafka raises it, librdkafka's flags kept."""
    return KafkaException(KafkaError(exc.code, exc.reason, fatal=exc.fatal,
                                     retriable=exc.retriable, txn_requires_abort=exc.abortable))


@dataclass
class TopicMetadata:
    """What the slot reads of ``list_topics``' topic entries."""

    error: KafkaError | None
    partitions: dict[int, None] = field(default_factory=dict)


@dataclass
class ClusterMetadata:
    """What the slot reads of ``Producer.list_topics``: ``topics[name]``."""

    topics: dict[str, TopicMetadata]


class _VU(ctypes.Structure):
    """``rd_kafka_vu_t`` for one record's ``rd_kafka_produceva`` (the layout of
    :data:`~connectors.kafka._rdkafka_lib.VU`: the vtype, then a 64-byte union whose
    ``mem.ptr``/``header.name`` is ``a``, ``mem.size``/``header.val`` ``b``,
    ``header.size`` ``c``)."""

    _fields_ = [("vtype", ctypes.c_int), ("a", ctypes.c_uint64), ("b", ctypes.c_uint64),
                ("c", ctypes.c_int64), ("_pad", ctypes.c_char * 40)]


assert ctypes.sizeof(_VU) == VU.itemsize


def _address(data: str | bytes | None, keep: list[bytes]) -> tuple[int, int]:
    """The address and length of ``data``'s bytes (NUL-terminated, as every ``bytes``
    object is; kept alive in ``keep``); None: NULL. An empty value gets a non-NULL
    address."""
    if data is None:
        return 0, 0
    raw = data.encode() if isinstance(data, str) else bytes(data)
    keep.append(raw)
    return ctypes.cast(ctypes.c_char_p(raw), ctypes.c_void_p).value or 0, len(raw)


class OwnedProducer:
    """A slot's transactional producer owned through librdkafka's C API, with the calls of
    confluent-kafka's ``Producer`` the slot makes (see the module docstring).

    ``config``: the slot producer's librdkafka config (no Python callables); ``errors``:
    each failed delivery report's error is appended; ``reported``: each error event's.
    """

    def __init__(self, config: Mapping[str, Any], library: Library, *,
                 errors: list[KafkaError], reported: list[KafkaError]) -> None:
        self.errors, self.reported = errors, reported

        # Closures over the lists, not bound methods: no reference cycle, so a dropped
        # producer's handle (threads, connections) is destroyed at once, not by the GC.
        def failed(code: int, count: int) -> None:
            errors.append(KafkaError(code, f"{count} record(s) not delivered"))

        def error(code: int, reason: str, fatal: bool) -> None:
            reported.append(KafkaError(code, reason, fatal=fatal))

        try:
            self.handle = ArrowProducer(config, library, on_failed=failed, on_error=error)
        except RdKafkaError as exc:
            raise kafka_exception(exc) from None

    def __len__(self) -> int:
        return int(self.handle.library.lib.rd_kafka_outq_len(self.handle.rk))

    def close(self) -> None:
        self.handle.close()

    # -- transactions (confluent-kafka's signatures; timeouts in seconds) -------------
    def init_transactions(self, timeout: float = 30.0) -> None:
        try:
            self.handle.init_transactions(timeout)
        except RdKafkaError as exc:
            raise kafka_exception(exc) from None

    def begin_transaction(self) -> None:
        try:
            self.handle.begin_transaction()
        except RdKafkaError as exc:
            raise kafka_exception(exc) from None

    def commit_transaction(self, timeout: float = 60.0) -> None:
        try:
            self.handle.commit_transaction(timeout)
        except RdKafkaError as exc:
            raise kafka_exception(exc) from None

    def abort_transaction(self, timeout: float = 60.0) -> None:
        try:
            self.handle.abort_transaction(timeout)
        except RdKafkaError as exc:
            raise kafka_exception(exc) from None

    def poll(self, timeout: float = 0.0) -> int:
        return self.handle.poll(max(0.0, timeout))

    def flush(self, timeout: float = 60.0) -> int:
        """Send and serve every report; returns the records still in flight (0: all; an
        error event that arrives after the last report is not one)."""
        try:
            self.handle.flush(timeout)
        except RdKafkaError as exc:
            if exc.code != ERR_TIMED_OUT:
                raise kafka_exception(exc) from None
            return max(1, len(self))
        return 0

    def list_topics(self, topic: str | None = None, timeout: float = 30.0) -> ClusterMetadata:
        """A metadata request for ``topic`` (the slot always names one)."""
        if topic is None:
            raise KafkaException(KafkaError(INVALID_ARG, "name the topic"))
        try:
            err, count = self.handle.describe(topic, timeout)
        except RdKafkaError as exc:
            raise kafka_exception(exc) from None
        entry = TopicMetadata(KafkaError(err) if err else None, dict.fromkeys(range(count)))
        return ClusterMetadata({topic: entry})

    # -- one record -------------------------------------------------------------------
    def produce(self, topic: str, value: str | bytes | None = None,
                key: str | bytes | None = None, partition: int = -1, *,
                headers: Sequence[tuple[str, str | bytes | None]] | None = None) -> None:
        """One record (``rd_kafka_produceva``, payloads copied). Raises ``BufferError``
        when the queue is full, as confluent-kafka does, ``KafkaException`` otherwise."""
        try:
            rkt, _ = self.handle.topic(topic)
        except RdKafkaError as exc:
            raise kafka_exception(exc) from None
        heads = list(headers or ())
        vus = (_VU * (6 + len(heads)))()  # zeroed; the last one is VT_END
        keep: list[bytes] = []
        vus[0].vtype, vus[0].a = VT_RKT, rkt
        vus[1].vtype, vus[1].a = VT_PARTITION, partition & 0xFFFFFFFF
        vus[2].vtype, (vus[2].a, vus[2].b) = VT_VALUE, _address(value, keep)
        vus[3].vtype, (vus[3].a, vus[3].b) = VT_KEY, _address(key, keep)
        vus[4].vtype, vus[4].a = VT_MSGFLAGS, MSG_F_COPY
        for vu, (name, data) in zip(vus[5:], heads, strict=False):
            vu.vtype, vu.a = VT_HEADER, _address(name, keep)[0]
            vu.b, vu.c = _address(data, keep)
        lib = self.handle.library.lib
        error = lib.rd_kafka_produceva(self.handle.rk, ctypes.addressof(vus), len(vus) - 1)
        if error:
            if lib.rd_kafka_error_code(error) == ERR_QUEUE_FULL:
                lib.rd_kafka_error_destroy(error)
                raise BufferError("the producer queue is full")
            try:
                self.handle.library.check(error)
            except RdKafkaError as exc:
                raise kafka_exception(exc) from None
        self.handle.delivery.enqueued += 1


class OwnedBatch:
    """The slot's batch produce on an :class:`OwnedProducer` (no records with headers).

    Placement is :class:`~connectors.kafka._placement.Placer`'s, as on confluent-kafka's
    ``Producer`` (its metadata from the owned handle): the ``partition`` column, else under
    a murmur2 partitioner Kafka's murmur2 of the key. When that places every record, the
    handle enqueues one partition run per call (each partition in input order); a record
    left to librdkafka's partitioner (no key, no partition) makes it one call per chunk
    with each record's own partition.
    """

    #: The produce path of records enqueued here (see ``_produce.PRODUCE_PATHS``).
    path = "owned"

    def __init__(self, owned: OwnedProducer, timeout: float, *, by_key: bool = False,
                 refresh_ms: int = METADATA_REFRESH_MS) -> None:
        self.owned = owned
        self.placer = Placer(owned, timeout, by_key=by_key, refresh_ms=refresh_ms)

    def produce(self, topic: str, values: pa.Array, keys: pa.Array | None,
                partitions: pa.Array | None) -> int:
        n = len(values)
        if n == 0:
            return 0
        key_layout = layout(keys) if keys is not None and self.placer.by_key else None
        placed = self.placer.place(topic, n, key_layout, partitions)
        dest = None if placed.place is None else pa.array(placed.place, pa.int32())
        try:
            return self.owned.handle.produce(topic, values, keys, dest)
        except RdKafkaError as exc:
            raise kafka_exception(exc) from None
