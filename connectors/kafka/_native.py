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

Delivery reports: records enqueued here carry no per-record state, so confluent-kafka's
delivery callback skips them and ``on_delivery`` never sees them. A failed delivery still
fails the transaction: librdkafka counts it and ``commit_transaction`` then raises an
abortable error, and the slot redoes the transaction record by record (whose delivery
reports name the failure).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import platform
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, KafkaException, Producer

__all__ = ["NativeProducer", "attach"]

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

    def __init__(self, producer: Producer, rk: int, lib: _Lib, timeout: float) -> None:
        self.producer = producer  # keeps rk alive as long as this object
        self._rk = rk
        self._lib = lib
        self._timeout = timeout
        #: Topic handles (``rd_kafka_topic_t *``) of this producer, released in ``__del__``.
        self._topics: dict[str, int] = {}
        #: Partition counts of those topics, from the metadata fetched by ``_topic``.
        self._partitions: dict[str, int] = {}

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
            return rkt
        rkt = int(lib.rd_kafka_topic_new(self._rk, topic.encode(), None) or 0)
        if not rkt:
            raise KafkaException(KafkaError(KafkaError._INVALID_ARG,
                                            f"cannot open topic {topic!r} for producing"))
        try:
            self._partitions[topic] = self._metadata(topic)
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
        key, key_len, _keys = _pointers(keys) if keys is not None else (None, None, None)
        part = None
        if partitions is not None:
            part = pc.fill_null(pc.cast(partitions, pa.int32()), RD_KAFKA_PARTITION_UA)
            part = part.to_numpy(zero_copy_only=False)
        flags = RD_KAFKA_MSG_F_COPY | (RD_KAFKA_MSG_F_PARTITION if part is not None else 0)
        lib = self._lib.lib
        rkt = self._topic(topic)
        if part is not None:
            self._check_partitions(topic, part)
        msgs = np.zeros(min(n, CHUNK), MESSAGE)
        for start in range(0, n, CHUNK):
            end = min(n, start + CHUNK)
            m = msgs[: end - start]
            m["err"] = 0
            m["payload"] = payload[start:end]
            m["len"] = length[start:end]
            if key is not None and key_len is not None:
                m["key"] = key[start:end]
                m["key_len"] = key_len[start:end]
            if part is not None:
                m["partition"] = part[start:end]
            self._enqueue(lib, rkt, m, flags)
            self.producer.poll(0)
        return n

    def _enqueue(self, lib: Any, rkt: int, m: np.ndarray, flags: int) -> None:
        done = 0
        while done < len(m):
            rest = m[done:]
            good = lib.rd_kafka_produce_batch(rkt, RD_KAFKA_PARTITION_UA, flags,
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


def _pointers(arr: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """(address, length) of every value of a string/binary array (null: (0, 0)), and the
    array they point into: keep it alive while the addresses are in use."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    large = pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type)
    width = 8 if large else 4
    _, offsets_buf, data_buf = arr.buffers()
    assert offsets_buf is not None
    offsets = np.frombuffer(offsets_buf, dtype=np.int64 if large else np.int32,
                            count=len(arr) + 1, offset=arr.offset * width)
    start = offsets[:-1].astype(np.uint64)
    length = np.diff(offsets).astype(np.uint64)
    # An empty value is a non-NULL pointer with length 0 (NULL is a null value).
    has_data = data_buf is not None and data_buf.size > 0
    base = np.uint64(data_buf.address if has_data else ctypes.addressof(_EMPTY))
    address = start + base
    if arr.null_count:
        nulls = arr.is_null().to_numpy(zero_copy_only=False)
        address[nulls] = 0
        length[nulls] = 0
    return address, length, arr


def attach(producer: Producer, timeout: float = 30.0) -> NativeProducer | None:
    """Batch produce for ``producer``, or ``None`` (then produce record by record)."""
    lib = _library()
    if lib is None or not isinstance(producer, Producer):
        return None
    rk = ctypes.c_void_p.from_address(id(producer) + object.__basicsize__).value
    if not rk or lib.lib.rd_kafka_opaque(rk) != id(producer):
        logger.info("batch produce unavailable (unexpected confluent-kafka handle layout): "
                    "records are produced one by one")
        return None
    return NativeProducer(producer, rk, lib, timeout)

