"""The data of one slot's transaction inside a task (:class:`Slot`), the barrier-mode
exchange of every slot's status (:class:`Alignment`), and what both task-side roles of
:class:`~connectors.kafka.KafkaSink` share: marker keys, statuses, small client helpers."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException

from connectors.core.batch import TaskBarrier
from connectors.core.errors import ConnectorError
from connectors.core.templates.tasks import SlotTransaction
from connectors.kafka._errors import kafka_error
from connectors.kafka._pool import PooledProducer
from connectors.kafka._slot_producer import SlotProducer

logger = logging.getLogger(__name__)

#: Offsets read back from the end of a marker partition before reading all of it: each
#: batch adds one marker and one commit control record, each aborted attempt two more.
MARKER_TAIL = 64
#: Clusters of at most this many brokers: the sink's clients connect to every broker at
#: once (``enable.sparse.connections=false``). librdkafka's sparse connections drop the
#: bootstrap connection after the first metadata and space the next new connection by half
#: of ``reconnect.backoff.ms`` (11 ms at least): a new producer's ``init_transactions``
#: waits for it, ~17 ms instead of ~5 ms. A slot producer connects to every partition
#: leader of its topic anyway; on larger clusters, connecting to every broker (TLS and SASL
#: handshakes included) per new producer may cost more than it saves.
DENSE_MAX_BROKERS = 16
#: Attempts at a slot's transaction within one task (abort-and-redo, new producer).
TXN_ATTEMPTS = 3
#: A slot's status, exchanged in barrier mode (a failure as ``failed|<message>``).
OK, FAILED, REPLAYED = "ok", "failed", "replayed"


def marker_key(slot: int) -> bytes:
    """The key of a slot's markers: compaction keeps each slot's last marker forever."""
    return f"slot/{slot}".encode()

def probe_key(slot: int) -> bytes:
    """The key of the record that proves a kept producer still owns its slot (not a marker)."""
    return f"slot/{slot}/probe".encode()

@dataclass
class Slot:
    """One slot's open transaction inside a task."""

    ctx: SlotTransaction
    producer: SlotProducer
    started: float
    batches: list[pa.RecordBatch] = field(default_factory=list)
    rows: int = 0
    errors: list[KafkaError] = field(default_factory=list)
    topics: dict[str, int] = field(default_factory=dict)  # checked topic -> partitions
    gathered: bool = False
    wait_ms: float = 0.0
    failure: str = ""
    open: bool = True
    #: The producer this worker kept from an earlier task (not fenced by this task).
    reused: bool = False
    #: A kept producer failed while producing: the commit starts the slot over.
    stale: bool = False
    #: Another attempt had committed the slot (found when starting over): commit nothing.
    committed_by_other: bool = False
    pooled: PooledProducer | None = None
    #: Rows enqueued per produce path (``native``, ``batch``, ``record``).
    paths: dict[str, int] = field(default_factory=dict)

@contextlib.contextmanager
def client_errors() -> Iterator[None]:
    """confluent-kafka raises ``SystemError`` when a client call (``flush``, ``poll``) meets
    a fatal error (fenced) and then runs ``error_cb``; the ``KafkaException`` is its cause."""
    try:
        yield
    except SystemError as exc:
        if isinstance(exc.__cause__, KafkaException):
            raise exc.__cause__ from None
        raise

def retrying(call: Any, attempts: int = 5) -> Any:
    """Call a transactional API; retry it while librdkafka says the error is retriable."""
    delay = 0.1
    for attempt in range(attempts):
        try:
            return call()
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is None or not err.retriable() or attempt == attempts - 1:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
    return None


class Alignment:
    """Task, barrier mode: every slot's status exchanged once per task, so that no slot
    commits unless every slot wrote, flushed and validated its records."""

    def __init__(self, sink_id: str, barrier: bool) -> None:
        self.sink_id = sink_id
        self.barrier = barrier

    def gather(self, handle: Slot | None, status: str, slots: int,
               barrier: TaskBarrier | None = None) -> list[str]:
        """Every slot's status (exactly once per task; ``[status]`` outside barrier mode).
        ``slots``: the sink's slot count for this batch; ``barrier``: the task's, when there
        is no ``handle`` yet."""
        if handle is not None:
            if handle.gathered:
                return [status]
            handle.gathered = True
            barrier = handle.ctx.barrier
        if not self.barrier or barrier is None:
            return [status]
        running = barrier.tasks()
        if running < slots:
            # Spark resubmitted only some partitions of the barrier stage (a slot's success
            # from the failed attempt arrived after its failure was handled). The barrier
            # would wait for all partitions forever; the missing slots completed their
            # task, so they committed (or returned their error to the driver).
            logger.warning(
                "sink %s: this barrier stage attempt runs %d of %d slots (Spark resubmitted "
                "only the missing ones); the slot commits without aligning", self.sink_id,
                running, slots)
            return [status]
        started = time.monotonic()
        statuses = barrier.all_gather(status)
        if handle is not None:
            handle.wait_ms = (time.monotonic() - started) * 1000
        return statuses

    def fail(self, handle: Slot | None, exc: ConnectorError, slots: int,
             barrier: TaskBarrier | None = None) -> ConnectorError:
        """A deterministic failure of this slot: tell the other slots before raising."""
        if handle is not None:
            handle.failure = str(exc)
        self.gather(handle, f"{FAILED}|{exc}", slots, barrier)
        return exc
