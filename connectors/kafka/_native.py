"""Executor side: enqueue a whole Arrow column into librdkafka in one C call per chunk.

``Producer.produce()`` costs, per record, argument parsing, a ``bytes`` object per value
and key (``to_pylist``), a ``calloc``'d delivery state and, for every delivered record, a
trip through the GIL in the delivery callback. For 100-byte records that was most of a
slot task's Python time (py-spy: ``produce`` 40 %, ``poll`` 17 %, ``to_pylist`` 15 %);
measured in a Spark loop, the Python workers used 0.57-0.64 CPU-seconds per 500k records,
0.35-0.42 with this module (docs/kafka.md, section 6). librdkafka's own
``rd_kafka_produce_batch()`` takes an array of ``rd_kafka_message_t`` instead: here that
array is built with numpy straight from the Arrow buffers (pointer = data buffer +
offset, length = offset difference), no Python object per record, and
``RD_KAFKA_MSG_F_COPY`` lets librdkafka copy each payload (it always copies keys) before the
call returns, so the Arrow buffers need not outlive it.

It runs on the ``rd_kafka_t`` of the slot's own confluent-kafka ``Producer``, so the
records join the producer's open transaction exactly as ``produce()`` records do (the
same C function adds each partition to the transaction; docs/kafka.md, "Batch produce").
What it relies on, checked before first use and otherwise :func:`attach` returns ``None``
and the slot produces record by record:

- librdkafka's public, ABI-stable C API (``rd_kafka_produce_batch``,
  ``rd_kafka_topic_new``/``destroy``, ``rd_kafka_opaque``, ``rd_kafka_fatal_error``),
  resolved through confluent-kafka's own extension module, which links the librdkafka
  that the ``Producer`` uses;
- confluent-kafka's handle layout (``rd_kafka_t *rk`` right after ``PyObject_HEAD``, as
  in 2.16's ``confluent_kafka.h``): used only with confluent-kafka 2.x (a major release
  falls back until verified), and verified per producer by ``rd_kafka_opaque(rk)``, which
  confluent-kafka sets to the handle itself.

Placement: ``rd_kafka_produce_batch`` called with one fixed partition enqueues its records
with one partition lookup and one transaction registration, where a call with
``RD_KAFKA_PARTITION_UA`` (or per-record partitions) runs the partitioner, looks the
partition up, takes its lock and registers it with the transaction for every record. So a
chunk whose records' partitions are all known is grouped by partition (a stable sort: each
partition keeps the records' order) and enqueued one partition at a time. A record's
partition is known from the ``partition`` column where it is set, else,
for a keyed record under a murmur2 partitioner (the sink's default ``murmur2_random``, and
``murmur2``), Kafka's murmur2 of the key (:func:`murmur2`, vectorised; the same partition
librdkafka's and Kafka's Java producer's partitioners choose) modulo the partition count the
producer fetched (refreshed as often as librdkafka refreshes its own,
``topic.metadata.refresh.interval.ms``). Records without a key (and every record under
another partitioner) still go through librdkafka's partitioner, one record at a time and in
their order. Measured on 250k records of
100 B per transaction: 0.23 -> 0.16 CPU-seconds for the slot's process (docs/kafka.md).

Delivery reports: records enqueued here carry no per-record state, so confluent-kafka's
delivery callback skips them and ``on_delivery`` never sees them. A failed delivery still
fails the transaction: librdkafka counts it and ``commit_transaction`` then raises an
abortable error, and the slot redoes the transaction record by record (whose delivery
reports name the failure).
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import logging
import math
import platform
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, KafkaException, Producer

__all__ = ["MURMUR2_PARTITIONERS", "NativeProducer", "attach", "murmur2"]

logger = logging.getLogger(__name__)

RD_KAFKA_PARTITION_UA = -1
RD_KAFKA_MSG_F_COPY = 0x2
RD_KAFKA_MSG_F_PARTITION = 0x8
ERR_QUEUE_FULL = KafkaError._QUEUE_FULL
ERR_FATAL = KafkaError._FATAL

#: ``rd_kafka_message_t`` (rdkafka.h), field for field, C alignment.
MESSAGE = np.dtype([
    ("err", "<i4"), ("rkt", "<u8"), ("partition", "<i4"), ("payload", "<u8"), ("len", "<u8"),
    ("key", "<u8"), ("key_len", "<u8"), ("offset", "<i8"), ("_private", "<u8"),
], align=True)

#: The confluent-kafka major version whose handle layout this module reads.
SUPPORTED_MAJOR = "2"

#: Records per ``rd_kafka_produce_batch`` call: bounds the array (72 B a record) and lets
#: delivery reports be served between calls.
CHUNK = 16_384

#: librdkafka partitioners that place a keyed record at Kafka's murmur2 of its key (as Kafka's
#: Java producer does); with these the slot computes keyed records' partitions itself.
MURMUR2_PARTITIONERS = frozenset({"murmur2", "murmur2_random"})
#: librdkafka's default ``topic.metadata.refresh.interval.ms``.
METADATA_REFRESH_MS = 300_000

_M = np.uint32(0x5BD1E995)
_SEED = np.uint32(0x9747B28C)

#: Where empty (not null) values and keys point: librdkafka reads no byte of them.
_EMPTY = ctypes.create_string_buffer(1)


class _Lib:
    """The librdkafka functions used here, typed once per process."""

    def __init__(self) -> None:
        from confluent_kafka import cimpl

        lib = ctypes.CDLL(cimpl.__file__)
        vp, c_int, i32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int32
        lib.rd_kafka_opaque.restype = vp
        lib.rd_kafka_opaque.argtypes = [vp]
        lib.rd_kafka_topic_new.restype = vp
        lib.rd_kafka_topic_new.argtypes = [vp, ctypes.c_char_p, vp]
        lib.rd_kafka_topic_destroy.restype = None
        lib.rd_kafka_topic_destroy.argtypes = [vp]
        lib.rd_kafka_produce_batch.restype = c_int
        lib.rd_kafka_produce_batch.argtypes = [vp, i32, c_int, vp, c_int]
        lib.rd_kafka_fatal_error.restype = c_int
        lib.rd_kafka_fatal_error.argtypes = [vp, ctypes.c_char_p, ctypes.c_size_t]
        if MESSAGE.itemsize != 8 * 9:
            raise OSError(f"rd_kafka_message_t would be {MESSAGE.itemsize} bytes, not 72")
        self.lib = lib


@functools.cache
def _library() -> _Lib | None:
    """The typed librdkafka functions, or ``None`` where they cannot be used (logged once)."""
    import confluent_kafka

    impl, bits = platform.python_implementation(), ctypes.sizeof(ctypes.c_void_p) * 8
    version = confluent_kafka.version()[0]
    why = f"{impl}, {bits}-bit" if impl != "CPython" or bits != 64 else None
    if why is None and version.split(".")[0] != SUPPORTED_MAJOR:
        why = f"confluent-kafka {version}: handle layout verified for {SUPPORTED_MAJOR}.x only"
    if why is None:
        try:
            return _Lib()
        except (OSError, AttributeError) as exc:
            why = f"librdkafka not loadable ({exc})"
    logger.info("batch produce unavailable (%s): records are produced one by one", why)
    return None


class NativeProducer:
    """Batch produce on one confluent-kafka ``Producer``'s librdkafka handle."""

    def __init__(self, producer: Producer, rk: int, lib: _Lib, timeout: float, *,
                 by_key: bool = False, refresh_ms: int = METADATA_REFRESH_MS) -> None:
        self.producer = producer  # keeps rk alive as long as this object
        self._rk = rk
        self._lib = lib
        self._timeout = timeout
        #: Keyed records are placed by :func:`murmur2` here (the producer's partitioner
        #: is one of :data:`MURMUR2_PARTITIONERS`).
        self.by_key = by_key
        # -1 turns librdkafka's periodic refresh off; at most one metadata request a second.
        self._refresh_s = math.inf if refresh_ms < 0 else max(refresh_ms, 1000) / 1000
        #: Topic handles (``rd_kafka_topic_t *``) of this producer, released in ``__del__``.
        self._topics: dict[str, int] = {}
        #: Partition counts of those topics, from the metadata fetched by ``_topic``, and
        #: when they were fetched (``time.monotonic()``).
        self._partitions: dict[str, int] = {}
        self._fetched: dict[str, float] = {}
        self._msgs: np.ndarray | None = None

    def __del__(self) -> None:
        for rkt in self._topics.values():
            self._lib.lib.rd_kafka_topic_destroy(rkt)
        self._topics.clear()

    def _topic(self, topic: str, refresh: bool = False) -> int:
        """The producer's handle of ``topic``, its metadata known.

        ``rd_kafka_produce_batch`` queues a record for an explicit partition of a topic
        whose metadata the producer has not received yet on the topic's unassigned queue,
        and adds that queue (not the partition) to the transaction: observed, the records
        then never leave and the commit times out. So the first use of a topic fetches its
        metadata (one round trip per topic and producer) before any record is queued.
        """
        rkt = self._topics.get(topic)
        if rkt is not None and not refresh:
            return rkt
        lib = self._lib.lib
        if rkt is not None:
            self._partitions[topic] = self._metadata(topic)
            self._fetched[topic] = time.monotonic()
            return rkt
        rkt = int(lib.rd_kafka_topic_new(self._rk, topic.encode(), None) or 0)
        if not rkt:
            raise KafkaException(KafkaError(KafkaError._INVALID_ARG,
                                            f"cannot open topic {topic!r} for producing"))
        try:
            self._partitions[topic] = self._metadata(topic)
            self._fetched[topic] = time.monotonic()
        except BaseException:
            lib.rd_kafka_topic_destroy(rkt)
            raise
        self._topics[topic] = rkt
        return rkt

    def _metadata(self, topic: str) -> int:
        meta = self.producer.list_topics(topic, timeout=self._timeout)
        found = meta.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            raise KafkaException(found.error if found is not None and found.error else
                                 KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART,
                                            f"topic {topic!r} does not exist"))
        return len(found.partitions)

    def _check_partitions(self, topic: str, part: np.ndarray) -> None:
        """Refuse a partition the topic does not have before anything is queued:
        ``rd_kafka_produce_batch`` would count such a record as queued forever (it never
        frees it), and every later flush, commit or abort would time out."""
        low, top = int(part.min()), int(part.max())
        if low < RD_KAFKA_PARTITION_UA:
            raise KafkaException(KafkaError(
                KafkaError._UNKNOWN_PARTITION, f"a record asks for partition {low} of {topic!r}"))
        if top >= self._partitions[topic]:
            self._topic(topic, refresh=True)  # partitions may have been added since
            if top >= self._partitions[topic]:
                raise KafkaException(KafkaError(
                    KafkaError._UNKNOWN_PARTITION,
                    f"topic {topic!r} has {self._partitions[topic]} partitions, a record "
                    f"asks for partition {top}"))

    def _key_partitions(self, topic: str, keys: _Layout) -> np.ndarray:
        """The partition of every keyed record (-1 for a null key: librdkafka's
        partitioner places it), as librdkafka's murmur2 partitioners would."""
        if time.monotonic() - self._fetched.get(topic, 0.0) > self._refresh_s:
            self._topic(topic, refresh=True)  # partitions may have been added since
        count = np.uint32(self._partitions[topic])
        place = ((_murmur2(keys) & np.uint32(0x7FFFFFFF)) % count).astype(np.int32)
        if keys.nulls is not None:
            place[keys.nulls] = RD_KAFKA_PARTITION_UA
        return place

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
        key_layout = _layout(keys) if keys is not None else None
        key, key_len, _keys = (_pointers(key_layout) if key_layout is not None
                               else (None, None, None))
        rkt = self._topic(topic)
        place = None  # destination partition per record, -1: librdkafka's partitioner
        if partitions is not None:
            place = pc.fill_null(pc.cast(partitions, pa.int32()), RD_KAFKA_PARTITION_UA)
            place = place.to_numpy(zero_copy_only=False)
            self._check_partitions(topic, place)
        unknown = place is None or bool((place < 0).any())
        if self.by_key and key_layout is not None and unknown:
            by_key = self._key_partitions(topic, key_layout)
            place = by_key if place is None else np.where(place < 0, by_key, place)
            unknown = bool((place < 0).any())
        lib = self._lib.lib
        msgs = self._messages()
        # Grouped by partition only when every record's partition is known: a record left
        # to librdkafka's partitioner could land in a partition between others, and each
        # partition keeps the records' order.
        grouped = place is not None and not unknown
        order = np.argsort(place, kind="stable") if grouped and place is not None else None
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


@dataclass(frozen=True)
class _Layout:
    """Where the values of a string/binary array are, read once from its Arrow buffers."""

    #: The (combined) array: keep it alive while its data is in use.
    arr: pa.Array
    #: Offset of every value in ``data``.
    start: np.ndarray
    #: Bytes of every value (0 for a null).
    size: np.ndarray
    #: Which values are null (``None``: none is).
    nulls: np.ndarray | None
    #: The data buffer as bytes (empty when there is none).
    data: np.ndarray
    #: Its address, or that of :data:`_EMPTY` when there is none.
    base: int


def _layout(arr: pa.Array | pa.ChunkedArray) -> _Layout:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    large = pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type)
    _, offsets_buf, data_buf = arr.buffers()
    assert offsets_buf is not None
    offsets = np.frombuffer(offsets_buf, dtype=np.int64 if large else np.int32,
                            count=len(arr) + 1, offset=arr.offset * (8 if large else 4))
    start = offsets[:-1].astype(np.int64)
    size = np.diff(offsets).astype(np.int64)
    nulls = arr.is_null().to_numpy(zero_copy_only=False) if arr.null_count else None
    if nulls is not None:
        size[nulls] = 0
    if data_buf is not None and data_buf.size > 0:
        return _Layout(arr, start, size, nulls, np.frombuffer(data_buf, dtype=np.uint8),
                       data_buf.address)
    return _Layout(arr, start, size, nulls, np.zeros(0, np.uint8), ctypes.addressof(_EMPTY))


def _pointers(arr: pa.Array | pa.ChunkedArray | _Layout,
              ) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """(address, length) of every value of a string/binary array (null: (0, 0)), and the
    array they point into: keep it alive while the addresses are in use."""
    values = arr if isinstance(arr, _Layout) else _layout(arr)
    # An empty value is a non-NULL pointer with length 0 (NULL is a null value).
    address = values.start.astype(np.uint64) + np.uint64(values.base)
    if values.nulls is not None:
        address[values.nulls] = 0
    return address, values.size.astype(np.uint64), values.arr


def murmur2(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Kafka's murmur2 hash (``org.apache.kafka.common.utils.Utils.murmur2``, librdkafka's
    ``rd_murmur2``) of every value of a string/binary array, as ``uint32``; a null value
    hashes as the empty one. Vectorised: one pass per 4-byte block of the longest value.

    Example::

        >>> int(murmur2(pa.array([b"21"]))[0]) - 2**32  # Kafka's UtilsTest: -973932308
        -973932308
    """
    return _murmur2(_layout(keys))


def _murmur2(keys: _Layout) -> np.ndarray:
    start, size, data = keys.start, keys.size, keys.data
    n = len(size)
    h = _SEED ^ size.astype(np.uint32)
    blocks = size >> 2
    with np.errstate(over="ignore"):
        if n and int(size.min()) == int(size.max()):
            _mix_blocks_one_length(h, data, int(start[0]), n, int(size[0]))
        else:
            _mix_blocks(h, data, start, blocks)
        tail = size & 3
        at = start + (blocks << 2)
        rows = _where(tail == 3)
        h[rows] ^= data[at[rows] + 2].astype(np.uint32) << 16
        rows = _where(tail >= 2)
        h[rows] ^= data[at[rows] + 1].astype(np.uint32) << 8
        rows = _where(tail >= 1)
        h[rows] = (h[rows] ^ data[at[rows]].astype(np.uint32)) * _M
        h ^= h >> np.uint32(13)
        h *= _M
        h ^= h >> np.uint32(15)
    return h


def _where(mask: np.ndarray) -> slice | np.ndarray:
    """The rows where ``mask`` holds: every row as a slice (a view, no gather) when all do."""
    return slice(None) if mask.all() else np.flatnonzero(mask)


def _mix_block(h: np.ndarray, k: np.ndarray) -> np.ndarray:
    """murmur2's step for one 4-byte block ``k`` of every value: the new ``h`` (``k`` is
    overwritten: pass a fresh array)."""
    k *= _M
    k ^= k >> np.uint32(24)
    k *= _M
    mixed: np.ndarray = (h * _M) ^ k
    return mixed


def _mix_blocks(h: np.ndarray, data: np.ndarray, start: np.ndarray,
                blocks: np.ndarray) -> None:
    """Mix every value's whole 4-byte blocks into ``h`` (values of any lengths)."""
    whole = int(blocks.min()) if len(blocks) else 0  # blocks that every value has
    for i in range(int(blocks.max()) if len(blocks) else 0):
        rows = None if i < whole else np.flatnonzero(blocks > i)
        at = (start if rows is None else start[rows]) + 4 * i
        k = (data[at].astype(np.uint32) | (data[at + 1].astype(np.uint32) << 8)
             | (data[at + 2].astype(np.uint32) << 16) | (data[at + 3].astype(np.uint32) << 24))
        if rows is None:
            h[:] = _mix_block(h, k)
        else:
            h[rows] = _mix_block(h[rows], k)


def _mix_blocks_one_length(h: np.ndarray, data: np.ndarray, first: int, n: int,
                           length: int) -> None:
    """:func:`_mix_blocks` for ``n`` values of ``length`` bytes each, back to back from
    ``data[first]`` (equal lengths leave no gap between them): their blocks read as one
    ``uint32`` matrix instead of four byte gathers per block (10k keys of 36 bytes: 0.64
    instead of 1.5 ms)."""
    blocks = length >> 2
    if not blocks:
        return
    rows = data[first:first + n * length].reshape(n, length)
    # One row per block (contiguous), from the (value, block) matrix.
    k = np.ascontiguousarray(rows[:, :blocks * 4]).view("<u4").T.astype(np.uint32)
    for i in range(blocks):
        h[:] = _mix_block(h, k[i])


def attach(producer: Producer, timeout: float = 30.0, *,
           partitioner: str | None = None,
           refresh_ms: int = METADATA_REFRESH_MS) -> NativeProducer | None:
    """Batch produce for ``producer``, or ``None`` (then produce record by record).

    ``partitioner``: the producer's ``partitioner`` setting; with one of
    :data:`MURMUR2_PARTITIONERS`, keyed records are placed here (see the module docstring).
    ``refresh_ms``: its ``topic.metadata.refresh.interval.ms``.
    """
    lib = _library()
    if lib is None or not isinstance(producer, Producer):
        return None
    rk = ctypes.c_void_p.from_address(id(producer) + object.__basicsize__).value
    if not rk or lib.lib.rd_kafka_opaque(rk) != id(producer):
        logger.info("batch produce unavailable (unexpected confluent-kafka handle layout): "
                    "records are produced one by one")
        return None
    return NativeProducer(producer, rk, lib, timeout,
                          by_key=partitioner in MURMUR2_PARTITIONERS, refresh_ms=refresh_ms)

