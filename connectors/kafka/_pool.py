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

import json
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer

from connectors.core.pool import IdlePool
from connectors.kafka._native import NativeProducer

__all__ = ["IDLE_SECONDS", "MarkerReaders", "PooledProducer", "SlotProducers", "config_key"]

#: A client idle longer than this is dropped rather than reused (brokers close idle
#: connections after ``connections.max.idle.ms``, 10 min by default).
IDLE_SECONDS = 300.0


def config_key(conf: dict[str, Any], *parts: str) -> str:
    """A digest of a client config (secrets included, never kept in clear) and ``parts``."""
    items = sorted((str(k), str(v)) for k, v in conf.items() if not callable(v))
    return IdlePool.key(json.dumps(items), *parts)


@dataclass
class PooledProducer:
    """A slot's transactional producer with the lists its callbacks fill."""

    producer: Producer
    errors: list[KafkaError] = field(default_factory=list)  # failed deliveries
    reported: list[KafkaError] = field(default_factory=list)  # error_cb (auth, fatal)
    #: Batch produce on this producer's librdkafka handle (None: record by record).
    native: NativeProducer | None = None

    def reset(self) -> None:
        self.errors.clear()
        self.reported.clear()


#: Idle slot producers of this process: at most one per (config, transactional id), the
#: newest (a newer producer of an id fenced the older); a dropped producer closes when
#: collected.
SlotProducers: IdlePool[PooledProducer] = IdlePool(
    "slot producer", idle_seconds=IDLE_SECONDS, max_idle=1)

#: Idle ``read_committed`` consumers of this process, by config digest. A reader has no
#: group membership (partitions are assigned), so one can read any partition next; it is
#: only kept after a read that ended without an error.
MarkerReaders: IdlePool[Consumer] = IdlePool(
    "marker reader", idle_seconds=IDLE_SECONDS, max_idle=2,
    close=lambda consumer: consumer.close())
