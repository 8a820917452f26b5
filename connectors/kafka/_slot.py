"""The data of one slot's transaction inside a task, and what every side of
:class:`~connectors.kafka.KafkaSink` shares: marker keys, limits, small client helpers."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, KafkaException, Producer

from connectors.core.tasks import SlotTransaction
from connectors.kafka._errors import kafka_error
from connectors.kafka._pool import PooledProducer
from connectors.kafka._records import describe_record

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
#: librdkafka defaults (used when the config does not set them).
_CLIENT_MAX_MESSAGE_BYTES = 1_000_000
_TOPIC_MAX_MESSAGE_BYTES = 1_048_588
#: Attempts at a slot's transaction within one task (abort-and-redo, new producer).
_TXN_ATTEMPTS = 3
_OK, _FAILED, _REPLAYED = "ok", "failed", "replayed"



def marker_key(slot: int) -> bytes:
    """The key of a slot's markers: compaction keeps each slot's last marker forever."""
    return f"slot/{slot}".encode()

def probe_key(slot: int) -> bytes:
    """The key of the record that proves a kept producer still owns its slot (not a marker)."""
    return f"slot/{slot}/probe".encode()

@dataclass
class _Slot:
    """One slot's open transaction inside a task."""

    ctx: SlotTransaction
    producer: Producer
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
def _client_errors() -> Iterator[None]:
    """confluent-kafka raises ``SystemError`` when a client call (``flush``, ``poll``) meets
    a fatal error (fenced) and then runs ``error_cb``; the ``KafkaException`` is its cause."""
    try:
        yield
    except SystemError as exc:
        if isinstance(exc.__cause__, KafkaException):
            raise exc.__cause__ from None
        raise

def _partition_record(batch: pa.RecordBatch, partitions: int) -> str:
    """`` (record i (key ..., value ...))`` of the first record of ``batch`` whose
    partition is ``>= partitions`` (``values_in_errors=True`` only)."""
    column = batch.column(batch.schema.names.index("partition"))
    found = pc.index(pc.greater_equal(pc.fill_null(column, -1), partitions), True).as_py()
    if found is None or found < 0:
        return ""
    return f" (record {found}{describe_record(batch, int(found))})"

def _path_name(paths: dict[str, int]) -> str:
    """The ``produce_path`` metric: the path that enqueued rows (several joined by ``+``;
    ``""`` when no row was produced)."""
    return "+".join(sorted(p for p, rows in paths.items() if rows))

def _retrying(call: Any, attempts: int = 5) -> Any:
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
