"""Executor side: slot producers and marker readers kept by a Python worker between batches.

Starting a slot's transactional producer costs a broker round trip per step
(``FindCoordinator``, ``InitProducerId``) and, right after the slot's previous commit, often
a wait of several hundred milliseconds: the coordinator answers ``CONCURRENT_TRANSACTIONS``
until it has written that commit's markers. Measured: 60-70 ms per slot and batch, spikes of
~500 ms; the marker read's new consumer ~20 ms more. Spark reuses its Python workers between
tasks (``spark.python.worker.reuse``, on by default), so a worker keeps the producer of the
slot it ran, idle between two transactions, and the next task of that slot on that worker
begins a transaction on it directly.

Why that keeps exactly-once (docs/kafka.md, "Reused slot producers"): a producer that some
other process fenced since it was kept (another attempt of the slot, the driver's
``fence_all`` after a restart or a failed batch) can no longer commit, so the task finds out
at the latest when it commits; then it starts the slot over with a new producer, whose
``init_transactions`` fences every other owner and completes their commits, reads the
marker again and writes only if the slot is still uncommitted. A kept producer that commits
was the slot's only live owner from before its marker read until its commit, so no other
owner could have committed the slot in between.

Only a producer whose transaction ended cleanly (committed, or aborted after a marker was
found) is kept; one in any doubt is dropped. Keys are SHA-256 digests of the client config
(which may hold secrets) and the transactional id.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from confluent_kafka import Consumer, KafkaError, Producer

__all__ = ["IDLE_SECONDS", "MarkerReaders", "PooledProducer", "SlotProducers", "config_key"]

logger = logging.getLogger("connectors.kafka")

#: A client idle longer than this is dropped rather than reused (brokers close idle
#: connections after ``connections.max.idle.ms``, 10 min by default).
IDLE_SECONDS = 300.0


def config_key(conf: dict[str, Any], *parts: str) -> str:
    """A digest of a client config (secrets included, never kept in clear) and ``parts``."""
    items = sorted((str(k), str(v)) for k, v in conf.items() if not callable(v))
    return hashlib.sha256(json.dumps([items, parts]).encode()).hexdigest()


@dataclass
class PooledProducer:
    """A slot's transactional producer with the lists its callbacks fill."""

    producer: Producer
    errors: list[KafkaError] = field(default_factory=list)  # failed deliveries
    reported: list[KafkaError] = field(default_factory=list)  # error_cb (auth, fatal)

    def reset(self) -> None:
        self.errors.clear()
        self.reported.clear()


class SlotProducers:
    """Idle slot producers of this process: at most one per (config, transactional id)."""

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _idle: ClassVar[dict[str, tuple[PooledProducer, float]]] = {}

    @classmethod
    def take(cls, key: str) -> PooledProducer | None:
        with cls._lock:
            found = cls._idle.pop(key, None)
        if found is None:
            return None
        pooled, since = found
        if time.monotonic() - since > IDLE_SECONDS:
            return None  # dropped: its references go, librdkafka closes it
        pooled.reset()
        return pooled

    @classmethod
    def give_back(cls, key: str, pooled: PooledProducer) -> None:
        """Keep ``pooled`` (its transaction ended cleanly) for the next task of the slot."""
        with cls._lock:
            cls._idle[key] = (pooled, time.monotonic())

    @classmethod
    def clear(cls) -> int:
        """Drop every idle producer (tests)."""
        with cls._lock:
            n = len(cls._idle)
            cls._idle.clear()
        return n


class MarkerReaders:
    """Idle ``read_committed`` consumers of this process, by config digest.

    A reader has no group membership (partitions are assigned), so one can read any
    partition next; it is only kept after a read that ended without an error.
    """

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _idle: ClassVar[dict[str, list[tuple[Consumer, float]]]] = {}

    @classmethod
    def take(cls, key: str) -> Consumer | None:
        now = time.monotonic()
        while True:
            with cls._lock:
                idle = cls._idle.get(key)
                if not idle:
                    return None
                consumer, since = idle.pop()
            if now - since <= IDLE_SECONDS:
                return consumer
            cls.close(consumer)

    @classmethod
    def give_back(cls, key: str, consumer: Consumer) -> None:
        with cls._lock:
            idle = cls._idle.setdefault(key, [])
            if len(idle) < 2:
                idle.append((consumer, time.monotonic()))
                return
        cls.close(consumer)

    @classmethod
    def clear(cls) -> int:
        with cls._lock:
            consumers = [c for idle in cls._idle.values() for c, _ in idle]
            cls._idle.clear()
        for consumer in consumers:
            cls.close(consumer)
        return len(consumers)

    @staticmethod
    def close(consumer: Consumer) -> None:
        try:
            consumer.close()
        except Exception as exc:  # pragma: no cover - closing a broken client
            logger.debug("closing an idle marker reader failed: %s", type(exc).__name__)
