"""Executor side, prototype (issue 55; not wired into KafkaSink): a transactional producer
that this library creates and owns through librdkafka's public C API, fed from Arrow.

No object layout of another package is read: librdkafka is loaded by documented means
and version-checked in :mod:`connectors.kafka._rdkafka_lib`.

Records go in through ``rd_kafka_produce_batch``: numpy fills ``rd_kafka_message_t``
arrays (a public struct of rdkafka.h) from the Arrow offset and data buffers, no Python
object per record, with ``RD_KAFKA_MSG_F_COPY`` and ``RD_KAFKA_MSG_F_PARTITION``. That
struct has no timestamp: records with one go through ``rd_kafka_produceva`` (one call per
record on an ``rd_kafka_vu_t`` array numpy built). Delivery reports are events
(``RD_KAFKA_EVENT_DR``): an error and a count per event (one per produce response), never a
Python callback per record; the records are freed when this thread destroys the event,
as they were allocated by it (``F_COPY``). ``rd_kafka_flush`` in short slices sends at
once (``linger.ms`` aside). docs/design/kafka-columnar.md has the why.
"""

from __future__ import annotations

import ctypes
import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from connectors.kafka._placement import PARTITION_UA, layout
from connectors.kafka._rdkafka_lib import (
    CHUNK,
    CONF_OK,
    ERR_QUEUE_FULL,
    EVENT_DR,
    EVENT_ERROR,
    MESSAGE,
    MSG_F_COPY,
    MSG_F_PARTITION,
    PRODUCER,
    VT_END,
    VT_KEY,
    VT_MSGFLAGS,
    VT_PARTITION,
    VT_RKT,
    VT_TIMESTAMP,
    VT_VALUE,
    VU,
    Library,
    Metadata,
    RdKafkaError,
    load,
)

__all__ = ["ArrowProducer", "Delivery", "RdKafkaError", "load"]

#: ``rd_kafka_flush`` slices between servings of the report events (ms; unserved reports
#: count as in flight, so a call waits its whole slice): 1 ms for the first 32 ms of a flush,
#: then doubling up to 32 ms (1 ms slices all along cost CPU on a long flush: each call
#: wakes every broker thread). A slot's probe + 100 records + marker flushed in 4.3 ms with
#: 1 ms slices, 7.8 ms when doubling from the start (medians of 30, local broker).
FLUSH_SLICE_MS, FLUSH_FINE_MS = (1, 32), 32

@dataclass
class Delivery:
    """A transaction's records: enqueued, failed (by code, from the reports served so
    far), delivered (set by :meth:`ArrowProducer.flush`: every other one)."""

    enqueued: int = 0
    delivered: int = 0
    failed: dict[int, int] = field(default_factory=dict)


def _pointers(arr: pa.Array | pa.ChunkedArray | None,
              n: int) -> tuple[np.ndarray, np.ndarray, pa.Array | None]:
    """(address, length) of every value of a binary/string array (null: 0, 0), and the
    array they point into (keep it alive while the addresses are in use)."""
    if arr is None:
        return np.zeros(n, np.uint64), np.zeros(n, np.uint64), None
    values = layout(arr)  # an empty value points at a readable byte, a null at 0
    address = values.start.astype(np.uint64) + np.uint64(values.base)
    if values.nulls is not None:
        address[values.nulls] = 0
    return address, values.size.astype(np.uint64), values.arr


def _column(arr: pa.Array | pa.ChunkedArray) -> pa.ChunkedArray:
    return arr if isinstance(arr, pa.ChunkedArray) else pa.chunked_array([arr])


class ArrowProducer:
    """A transactional producer handle owned by this object (``rd_kafka_new``).

    ``config``: librdkafka properties (``transactional.id`` among them for transactions),
    values as strings, numbers or booleans. ``on_failed(code, count)``: a delivery report
    event with an error, as it is served; ``on_error(code, reason, fatal)``: an error event
    (what ``error_cb`` gets; without it librdkafka logs them).
    """

    def __init__(self, config: Mapping[str, Any], library: Library | None = None, *,
                 on_failed: Callable[[int, int], None] | None = None,
                 on_error: Callable[[int, str, bool], None] | None = None) -> None:
        self.library = library or load()
        lib = self.library.lib
        errstr = ctypes.create_string_buffer(512)
        conf = lib.rd_kafka_conf_new()
        for key, value in config.items():
            text = str(value).lower() if isinstance(value, bool) else str(value)
            if lib.rd_kafka_conf_set(conf, key.encode(), text.encode(), errstr,
                                     len(errstr)) != CONF_OK:
                lib.rd_kafka_conf_destroy(conf)
                raise RdKafkaError(-186, f"config {key}: {errstr.value.decode()}")
        lib.rd_kafka_conf_set_events(conf, EVENT_DR | (EVENT_ERROR if on_error else 0))
        self._on_failed, self._on_error = on_failed, on_error
        rk = lib.rd_kafka_new(PRODUCER, conf, errstr, len(errstr))
        if not rk:
            lib.rd_kafka_conf_destroy(conf)  # rd_kafka_new owns conf only on success
            raise RdKafkaError(-186, f"rd_kafka_new: {errstr.value.decode()}")
        self._rk: int | None = rk
        self._queue = lib.rd_kafka_queue_get_main(rk)
        self._topics: dict[str, tuple[int, int]] = {}  # name -> (rkt, partition count)
        self._handles: dict[str, int] = {}  # name -> rkt (destroyed with the producer)
        self._msgs = np.zeros(CHUNK, MESSAGE)
        self.delivery = Delivery()

    @property
    def rk(self) -> int:
        if self._rk is None:
            raise RdKafkaError(-172, "the producer is closed")
        return self._rk

    def close(self) -> None:
        """Destroy the handle (records still queued are dropped; call :meth:`flush` or
        commit first)."""
        if self._rk is None:
            return
        lib = self.library.lib
        for rkt in self._handles.values():
            lib.rd_kafka_topic_destroy(rkt)
        self._topics.clear()
        self._handles.clear()
        self.poll(0)
        lib.rd_kafka_queue_destroy(self._queue)
        lib.rd_kafka_destroy(self._rk)
        self._rk = None

    def __enter__(self) -> ArrowProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_rk", None) is not None:
            self.close()

    # -- transactions --------------------------------------------------------------
    def init_transactions(self, timeout_s: float = 30.0) -> None:
        """Fence earlier producers of the same ``transactional.id``, abort their open
        transaction, get this producer's epoch."""
        self.library.check(self.library.lib.rd_kafka_init_transactions(
            self.rk, int(timeout_s * 1000)))

    def begin_transaction(self) -> None:
        self.library.check(self.library.lib.rd_kafka_begin_transaction(self.rk))
        self.delivery = Delivery()

    def commit_transaction(self, timeout_s: float = 60.0) -> Delivery:
        """Flush (serving delivery reports), then commit; raises if any delivery failed
        (the transaction is then left to :meth:`abort_transaction`)."""
        done = self.flush(timeout_s)
        if done.failed:
            code = next(iter(done.failed))
            raise RdKafkaError(code, f"{sum(done.failed.values())} record(s) not delivered: "
                               f"{self.library.err2str(code)}", abortable=True)
        self.library.check(self.library.lib.rd_kafka_commit_transaction(
            self.rk, int(timeout_s * 1000)))
        return done

    def abort_transaction(self, timeout_s: float = 60.0) -> None:
        self.library.check(self.library.lib.rd_kafka_abort_transaction(
            self.rk, int(timeout_s * 1000)))
        self.poll(0)  # the purged records' reports

    # -- delivery reports -----------------------------------------------------------
    def poll(self, timeout_s: float) -> int:
        """Serve delivery report events (the first waits up to ``timeout_s``); returns the
        records they reported."""
        lib, seen, wait = self.library.lib, 0, int(timeout_s * 1000)
        while True:
            ev = lib.rd_kafka_queue_poll(self._queue, wait)
            if not ev:
                return seen
            wait = 0
            try:
                kind = lib.rd_kafka_event_type(ev)
                if kind == EVENT_DR:
                    count = int(lib.rd_kafka_event_message_count(ev))
                    err = int(lib.rd_kafka_event_error(ev))
                    seen += count
                    if err:
                        self.delivery.failed[err] = self.delivery.failed.get(err, 0) + count
                        if self._on_failed is not None:
                            self._on_failed(err, count)
                elif kind == EVENT_ERROR and self._on_error is not None:
                    self._error_event(ev)
            finally:
                lib.rd_kafka_event_destroy(ev)

    def _error_event(self, ev: int) -> None:
        lib = self.library.lib
        code = int(lib.rd_kafka_event_error(ev))
        fatal = bool(lib.rd_kafka_event_error_is_fatal(ev))
        reason = (lib.rd_kafka_event_error_string(ev) or b"").decode(errors="replace")
        if fatal:  # the event says _FATAL; the underlying error is kept by the handle
            text = ctypes.create_string_buffer(512)
            code = int(lib.rd_kafka_fatal_error(self.rk, text, len(text))) or code
            reason = text.value.decode(errors="replace") or reason
        assert self._on_error is not None
        self._on_error(code, reason, fatal)

    def flush(self, timeout_s: float = 60.0) -> Delivery:
        """Send every enqueued record now (``rd_kafka_flush``) and serve the reports until
        none is left in flight; raises at the timeout."""
        lib, deadline = self.library.lib, time.monotonic() + timeout_s
        (piece, top), fine = FLUSH_SLICE_MS, time.monotonic() + FLUSH_FINE_MS / 1000
        while True:
            left = deadline - time.monotonic()
            lib.rd_kafka_flush(self.rk, max(0, min(piece, int(left * 1000))))
            piece = piece if time.monotonic() < fine else min(piece * 2, top)
            self.poll(0)
            if lib.rd_kafka_outq_len(self.rk) == 0:
                break
            if left <= 0:
                raise RdKafkaError(-185, f"{lib.rd_kafka_outq_len(self.rk)} record(s) not "
                                   f"delivered within {timeout_s} s")
        done = self.delivery
        done.delivered = done.enqueued - sum(done.failed.values())
        return done

    # -- producing ------------------------------------------------------------------
    def topic(self, name: str, timeout_s: float = 30.0) -> tuple[int, int]:
        """The handle of topic ``name`` and its partition count, its metadata fetched
        (records for an explicit partition of a topic without metadata would wait on the
        unassigned queue forever)."""
        known = self._topics.get(name)
        if known is not None:
            return known
        err, count = self.describe(name, timeout_s)
        if err or count <= 0:
            raise RdKafkaError(err or 3, f"topic {name!r}: {self.library.err2str(err or 3)}")
        self._topics[name] = (self._handles[name], count)
        return self._topics[name]

    def describe(self, name: str, timeout_s: float = 30.0) -> tuple[int, int]:
        """A metadata request for topic ``name`` (every call asks the broker): the topic's
        error code (0: none) and partition count. Raises when the request fails."""
        lib = self.library.lib
        rkt = self._handles.get(name)
        if rkt is None:
            rkt = lib.rd_kafka_topic_new(self.rk, name.encode(), None)
            if not rkt:
                raise RdKafkaError(-186, f"cannot open topic {name!r}")
            self._handles[name] = rkt
        meta = ctypes.POINTER(Metadata)()
        code = lib.rd_kafka_metadata(self.rk, 0, rkt, ctypes.byref(meta), int(timeout_s * 1000))
        if code:
            raise RdKafkaError(code, f"metadata of {name!r}: {self.library.err2str(code)}")
        count, err = 0, 3  # UNKNOWN_TOPIC_OR_PART unless the answer names the topic
        try:
            md = meta.contents
            for i in range(md.topic_cnt):
                t = md.topics[i]
                if t.topic.decode() == name:
                    count, err = t.partition_cnt, t.err
        finally:
            lib.rd_kafka_metadata_destroy(meta)
        if not err and count > 0:  # produce() needs no request of its own after this one
            self._topics[name] = (rkt, count)
        return err, count

    def produce(self, topic: str, values: pa.Array | pa.ChunkedArray,
                keys: pa.Array | pa.ChunkedArray | None = None,
                partitions: pa.Array | pa.ChunkedArray | None = None,
                timestamps: pa.Array | pa.ChunkedArray | None = None) -> int:
        """Enqueue every record into the open transaction; returns the count.

        ``values``/``keys``: binary or string; ``partitions``: integers (null: the
        partitioner's choice); ``timestamps``: ms since the epoch (int64 or timestamp; null:
        now). With every partition given, records are grouped by partition (each keeps its
        order). Waits while the queue is full; raises :class:`RdKafkaError` otherwise.
        """
        n = len(values)
        if n == 0:
            return 0
        rkt, count = self.topic(topic)
        value_at, value_len, _v = _pointers(values, n)
        key_at, key_len, _k = _pointers(keys, n)
        place = np.full(n, PARTITION_UA, np.int32)
        if partitions is not None:
            given = _column(partitions).cast(pa.int32()).fill_null(PARTITION_UA)
            place = np.asarray(given.to_numpy(), dtype=np.int32)
            if int(place.max()) >= count or int(place.min()) < PARTITION_UA:
                raise RdKafkaError(-190, f"a record asks for a partition {topic!r} (with "
                                   f"{count}) lacks")
        order = (np.argsort(place, kind="stable")
                 if partitions is not None and not (place < 0).any() else None)
        if order is not None:
            value_at, value_len, key_at, key_len, place = (
                value_at[order], value_len[order], key_at[order], key_len[order], place[order])
        if timestamps is not None:
            col = _column(timestamps)
            if pa.types.is_timestamp(col.type):
                col = col.cast(pa.timestamp("ms", col.type.tz))
            ts = col.cast(pa.int64()).fill_null(0).to_numpy()
            self._produce_each(rkt, value_at, value_len, key_at, key_len, place,
                               np.asarray(ts if order is None else ts[order], np.int64))
        else:
            self._produce_batch(rkt, value_at, value_len, key_at, key_len, place,
                                grouped=order is not None)
        return n

    def _produce_batch(self, rkt: int, value_at: np.ndarray, value_len: np.ndarray,
                       key_at: np.ndarray, key_len: np.ndarray, place: np.ndarray, *,
                       grouped: bool) -> None:
        """``grouped`` (sorted by partition): one call per partition run, which librdkafka
        enqueues under one lock (measured: less CPU at 1 KB); else each record's own
        partition (``RD_KAFKA_MSG_F_PARTITION``), -1 going to the partitioner."""
        for start in range(0, len(place), CHUNK):
            end = min(len(place), start + CHUNK)
            m = self._msgs[: end - start]
            m["err"] = 0
            m["payload"], m["len"] = value_at[start:end], value_len[start:end]
            m["key"], m["key_len"] = key_at[start:end], key_len[start:end]
            dest = place[start:end]
            m["partition"] = dest
            if not grouped:
                self._enqueue(rkt, m, PARTITION_UA, MSG_F_COPY | MSG_F_PARTITION)
            else:
                cuts = [0, *(np.flatnonzero(dest[1:] != dest[:-1]) + 1).tolist(), len(m)]
                for a, b in itertools.pairwise(cuts):
                    self._enqueue(rkt, m[a:b], int(dest[a]), MSG_F_COPY)
            self.poll(0)

    def _enqueue(self, rkt: int, m: np.ndarray, partition: int, flags: int) -> None:
        """``rd_kafka_produce_batch`` of ``m``, waiting (serving reports) while the queue
        is full; any other refusal raises (the transaction must abort)."""
        done = 0
        while done < len(m):
            rest = m[done:]
            good = self.library.lib.rd_kafka_produce_batch(rkt, partition, flags,
                                                           rest.ctypes.data, len(rest))
            self.delivery.enqueued += good
            if good == len(rest):
                return
            errors = rest["err"]
            first = int(np.flatnonzero(errors)[0])
            if good != first or (errors[first:] != ERR_QUEUE_FULL).any():
                # Another refusal, or a record enqueued after a refused one (its
                # partition's order is lost): only an abort undoes the call.
                tail = errors[first:]
                real = tail[(tail != ERR_QUEUE_FULL) & (tail != 0)]
                code = int(real[0]) if len(real) else ERR_QUEUE_FULL
                raise RdKafkaError(code, self.library.err2str(code), abortable=True)
            done += first  # the records before the first refusal are enqueued
            self.poll(0.05)

    def _produce_each(self, rkt: int, value_at: np.ndarray, value_len: np.ndarray,
                      key_at: np.ndarray, key_len: np.ndarray, place: np.ndarray,
                      ts: np.ndarray) -> None:
        """One ``rd_kafka_produceva`` per record (a timestamp each), on an
        ``rd_kafka_vu_t`` array built by numpy: no Python object per record but the call."""
        n, fields = len(place), 7
        vus = np.zeros((n, fields), VU)
        vus["vtype"] = [VT_RKT, VT_PARTITION, VT_VALUE, VT_KEY, VT_MSGFLAGS, VT_TIMESTAMP,
                        VT_END]
        vus["a"][:, 0] = rkt
        vus["a"][:, 1] = place.astype(np.int64).view(np.uint64) & np.uint64(0xFFFFFFFF)
        vus["a"][:, 2], vus["b"][:, 2] = value_at, value_len
        vus["a"][:, 3], vus["b"][:, 3] = key_at, key_len
        vus["a"][:, 4] = MSG_F_COPY
        vus["a"][:, 5] = ts.view(np.uint64)
        lib, base, stride = self.library.lib, vus.ctypes.data, fields * VU.itemsize
        produceva, rk = lib.rd_kafka_produceva, self.rk
        for i in range(n):
            while True:
                error = produceva(rk, base + i * stride, fields - 1)
                if not error:
                    break
                code = lib.rd_kafka_error_code(error)
                if code != ERR_QUEUE_FULL:
                    self.library.check(error)
                lib.rd_kafka_error_destroy(error)
                self.poll(0.05)
            self.delivery.enqueued += 1
            if i % CHUNK == CHUNK - 1:
                self.poll(0)
