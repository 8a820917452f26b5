"""Executor side: where each record of an Arrow batch goes, on public APIs only.

Batch produce (``Producer.produce_batch``, and the ctypes accelerator of
:mod:`connectors.kafka._native`) is fastest when a call enqueues records of one partition:
librdkafka then looks the partition up and registers it with the transaction once, where a
call with ``RD_KAFKA_PARTITION_UA`` runs the partitioner, looks the partition up, takes its
lock and registers it with the transaction for every record. So a batch whose records'
partitions are all known is grouped by partition (a stable sort: each partition keeps the
records' order) and enqueued one partition at a time. A record's partition is known from
the ``partition`` column where it is set, else, for a keyed record under a murmur2
partitioner (the sink's default ``murmur2_random``, and ``murmur2``), Kafka's murmur2 of
the key (:func:`murmur2`, vectorised; the same partition librdkafka's and Kafka's Java
producer's partitioners choose) modulo the partition count the producer fetched
(``Producer.list_topics``, refreshed as often as librdkafka refreshes its own,
``topic.metadata.refresh.interval.ms``). Records without a key (and every record under
another partitioner) still go through librdkafka's partitioner, in their order.

Two librdkafka behaviours shape it (both proved in integration/kafka/test_kafka_native.py):
records for an explicit partition of a topic whose metadata the producer has not received
yet go to the topic's unassigned queue, which is what joins the transaction (the records
never leave, the commit times out): the first use of a topic fetches its metadata; a
record for a partition the topic lacks is counted as queued and never freed: partitions
are checked before anything is queued.

Every placement here is also what per-record ``produce()`` would do: exactness does not
depend on which path enqueues.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, KafkaException

__all__ = ["MURMUR2_PARTITIONERS", "PARTITION_UA", "Placed", "Placer", "murmur2"]

#: How long a topic unknown to the metadata is asked for again (a topic just created).
UNKNOWN_TOPIC_WAIT_S = 3.0

#: ``RD_KAFKA_PARTITION_UA``: librdkafka's partitioner chooses.
PARTITION_UA = -1
#: librdkafka partitioners that place a keyed record at Kafka's murmur2 of its key (as Kafka's
#: Java producer does); with these the slot computes keyed records' partitions itself.
MURMUR2_PARTITIONERS = frozenset({"murmur2", "murmur2_random"})
#: librdkafka's default ``topic.metadata.refresh.interval.ms``.
METADATA_REFRESH_MS = 300_000

_M = np.uint32(0x5BD1E995)
_SEED = np.uint32(0x9747B28C)

#: Where empty (not null) values and keys point: librdkafka reads no byte of them.
_EMPTY = ctypes.create_string_buffer(1)


@dataclass(frozen=True)
class Placed:
    """A batch's records in the order to enqueue them, cut into runs of one destination.

    ``order``: the records' indices in enqueue order (``None``: input order). ``runs``:
    ``(start, end, partition)`` over that order, ``partition`` -1 for "librdkafka's
    partitioner places each record". Each partition receives its records in input order.
    """

    order: np.ndarray | None
    runs: list[tuple[int, int, int]]
    #: The destination of every record in input order (``None``: all unknown).
    place: np.ndarray | None


class Placer:
    """A producer's view of its topics' partition counts, and the placement of records.

    ``producer``: the confluent-kafka ``Producer`` (its ``list_topics`` is the only call
    made here). ``by_key``: the producer's partitioner is one of
    :data:`MURMUR2_PARTITIONERS` (keyed records are placed here).
    """

    def __init__(self, producer: Any, timeout: float, *, by_key: bool = False,
                 refresh_ms: int = METADATA_REFRESH_MS) -> None:
        self.producer = producer
        self._timeout = timeout
        self.by_key = by_key
        # -1 turns librdkafka's periodic refresh off; at most one metadata request a second.
        self._refresh_s = math.inf if refresh_ms < 0 else max(refresh_ms, 1000) / 1000
        #: Partition counts of the topics used, and when they were fetched (monotonic).
        self._partitions: dict[str, int] = {}
        self._fetched: dict[str, float] = {}

    def known(self, topic: str, refresh: bool = False) -> int:
        """The partition count of ``topic``, its metadata fetched by this producer (once,
        or again with ``refresh``)."""
        if topic in self._partitions and not refresh:
            return self._partitions[topic]
        # A topic created a moment ago may be unknown to the broker this client asks (its
        # metadata propagates): asked again for up to UNKNOWN_TOPIC_WAIT_S.
        deadline = time.monotonic() + min(self._timeout, UNKNOWN_TOPIC_WAIT_S)
        while True:
            meta = self.producer.list_topics(topic, timeout=self._timeout)
            found = meta.topics.get(topic)
            if found is not None and found.error is None and found.partitions:
                break
            if time.monotonic() >= deadline:
                raise KafkaException(found.error if found is not None and found.error else
                                     KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART,
                                                f"topic {topic!r} does not exist"))
            time.sleep(0.1)
        self._partitions[topic] = len(found.partitions)
        self._fetched[topic] = time.monotonic()
        return self._partitions[topic]

    def check_partitions(self, topic: str, part: np.ndarray) -> None:
        """Refuse a partition the topic does not have before anything is queued
        (librdkafka would count such a record as queued forever). Names the partition,
        never a record's key or value."""
        low, top = int(part.min()), int(part.max())
        if low < PARTITION_UA:
            raise KafkaException(KafkaError(
                KafkaError._UNKNOWN_PARTITION, f"a record asks for partition {low} of {topic!r}"))
        if top >= self.known(topic):
            self.known(topic, refresh=True)  # partitions may have been added since
            if top >= self._partitions[topic]:
                raise KafkaException(KafkaError(
                    KafkaError._UNKNOWN_PARTITION,
                    f"topic {topic!r} has {self._partitions[topic]} partitions, a record "
                    f"asks for partition {top}"))

    def key_partitions(self, topic: str, keys: ArrayLayout) -> np.ndarray:
        """The partition of every keyed record (-1 for a null key: librdkafka's
        partitioner places it), as librdkafka's murmur2 partitioners would."""
        if time.monotonic() - self._fetched.get(topic, 0.0) > self._refresh_s:
            self.known(topic, refresh=True)  # partitions may have been added since
        count = np.uint32(self._partitions[topic])
        place: np.ndarray = ((_murmur2(keys) & np.uint32(0x7FFFFFFF)) % count).astype(np.int32)
        if keys.nulls is not None:
            place[keys.nulls] = PARTITION_UA
        return place

    def place(self, topic: str, n: int, keys: ArrayLayout | None,
              partitions: pa.Array | pa.ChunkedArray | None) -> Placed:
        """Where the ``n`` records go (``keys``: their keys' layout, ``partitions``: the
        ``partition`` column), metadata fetched and partitions checked first."""
        self.known(topic)
        place = None  # destination partition per record, -1: librdkafka's partitioner
        if partitions is not None:
            filled = pc.fill_null(pc.cast(partitions, pa.int32()), PARTITION_UA)
            place = np.asarray(filled.to_numpy(zero_copy_only=False), dtype=np.int32)
            self.check_partitions(topic, place)
        unknown = place is None or bool((place < 0).any())
        if self.by_key and keys is not None and unknown:
            by_key = self.key_partitions(topic, keys)
            place = by_key if place is None else np.where(place < 0, by_key, place)
            unknown = bool((place < 0).any())
        if place is None:
            return Placed(None, [(0, n, PARTITION_UA)], None)
        # Grouped by partition only when every record's partition is known: a record left
        # to librdkafka's partitioner could land in a partition between others.
        order = np.argsort(place, kind="stable") if not unknown else None
        dest = place if order is None else place[order]
        cuts = [0, *(np.flatnonzero(dest[1:] != dest[:-1]) + 1).tolist(), n]
        runs = [(a, b, int(dest[a])) for a, b in itertools.pairwise(cuts)]
        return Placed(order, runs, place)


@dataclass(frozen=True)
class ArrayLayout:
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


def layout(arr: pa.Array | pa.ChunkedArray) -> ArrayLayout:
    """The :class:`ArrayLayout` of a string/binary array (a chunked one is combined)."""
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
        return ArrayLayout(arr, start, size, nulls, np.frombuffer(data_buf, dtype=np.uint8),
                       data_buf.address)
    return ArrayLayout(arr, start, size, nulls, np.zeros(0, np.uint8), ctypes.addressof(_EMPTY))


def murmur2(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Kafka's murmur2 hash (``org.apache.kafka.common.utils.Utils.murmur2``, librdkafka's
    ``rd_murmur2``) of every value of a string/binary array, as ``uint32``; a null value
    hashes as the empty one. Vectorised: one pass per 4-byte block of the longest value.

    Example::

        >>> int(murmur2(pa.array([b"21"]))[0]) - 2**32  # Kafka's UtilsTest: -973932308
        -973932308
    """
    return _murmur2(layout(keys))


def _murmur2(keys: ArrayLayout) -> np.ndarray:
    start, size, data = keys.start, keys.size, keys.data
    n = len(size)
    h: np.ndarray = _SEED ^ size.astype(np.uint32)
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
