"""Executor side: slot producers and marker readers kept by a Python worker between batches.

Starting a slot's transactional producer costs a broker round trip per step
(``FindCoordinator``, ``InitProducerId``): ~31 ms per slot and batch
(:func:`connectors.kafka._io.init_transactions`), and the marker read's new consumer ~20 ms
more. Spark reuses its Python workers between tasks (``spark.python.worker.reuse``, on by
default), so a worker keeps the producer of the slot it ran, idle between two transactions,
and the next task of that slot on that worker begins a transaction on it directly. A kept
producer whose probe passes also knows the slot's newest marker without reading it
(``PooledProducer.newest_marker``): nobody else wrote the slot's marker partition since.

Why that keeps exactly-once (docs/kafka.md, "Reused slot producers"): a producer that some
other process fenced since it was kept (another attempt of the slot, the driver's
``fence_all`` after a restart or a failed batch) can no longer commit, so the task finds out
at the latest when it commits; then it starts the slot over with a new producer, whose
``init_transactions`` fences every other owner and completes their commits, reads the
marker again and writes only if the slot is still uncommitted. A kept producer that commits
was the slot's only live owner from its previous task (whose commit, or marker read, it
remembers as the newest marker) until this commit, so no other owner could have committed
the slot in between.

Only a producer whose transaction ended cleanly (committed, or aborted after a marker was
found) is kept; one in any doubt is dropped. Keys are SHA-256 digests of the client config
(which may hold secrets) and the transactional id.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError

from connectors.core.ledgers.file_ledger import write_atomic
from connectors.core.pool import IdlePool
from connectors.core.templates.tasks import SlotMarker
from connectors.kafka._produce import FastProducer
from connectors.kafka._slot_producer import SlotProducer

__all__ = ["IDLE_SECONDS", "MarkerReaders", "PooledProducer", "SlotOwners", "SlotProducers",
           "config_key"]

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

    producer: SlotProducer
    errors: list[KafkaError] = field(default_factory=list)  # failed deliveries
    reported: list[KafkaError] = field(default_factory=list)  # error_cb (auth, fatal)
    #: Batch produce for this producer: the ctypes accelerator or the public
    #: ``produce_batch`` (None: record by record).
    fast: FastProducer | None = None
    #: The slot's newest committed marker as this producer last committed or read it
    #: (``knows_newest``); a kept producer whose probe passes needs no marker read.
    newest_marker: SlotMarker | None = None
    knows_newest: bool = False

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


class SlotOwners:
    """Which process on this host started a slot's newest producer (best effort).

    Spark hands its idle Python workers to the next tasks in the order they finished, so
    with two slots a worker often gets the other slot than last time: the slot's new
    producer (in the other worker) fenced the one this worker kept. Probing that kept
    producer would cost a round trip and make librdkafka print a FATAL "fenced" line to
    the executor's stderr. So every process that starts a slot producer records its pid in
    a file named by the pool key (a digest: no secret), and a worker whose kept producer is
    no longer the host's newest drops it without a probe. Only an optimization: a producer
    still passes the probe before it is used (another host may have started one), and any
    error reading or writing a file counts as "not known".
    """

    #: Records older than this are removed (once per process, at its first claim): a slot
    #: id's record is rewritten whenever a producer of it starts, and a missing one only
    #: means "not known".
    MAX_AGE_S = 7 * 24 * 3600

    def __init__(self, directory: str | None = None) -> None:
        user = f"connectors-{os.getuid()}" if hasattr(os, "getuid") else "connectors"
        self.directory = directory or os.path.join(tempfile.gettempdir(), user, "slot-owners")
        self._swept = False

    def claim(self, key: str) -> None:
        """This process started the newest producer of ``key``'s slot id."""
        with contextlib.suppress(OSError):
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            write_atomic(Path(self.directory, key), str(os.getpid()).encode(), durable=False)
        if not self._swept:
            self._swept = True
            self.sweep()

    def sweep(self, now: float | None = None) -> int:
        """Remove the records not rewritten for :attr:`MAX_AGE_S`; returns how many."""
        cutoff = (time.time() if now is None else now) - self.MAX_AGE_S
        removed = 0
        try:
            entries = list(os.scandir(self.directory))
        except OSError:
            return 0
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.is_file() and entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)
                    removed += 1
        return removed

    def taken_over(self, key: str) -> bool:
        """Another process on this host started a producer of ``key``'s slot id since this
        one's (``False`` when unknown)."""
        try:
            with open(os.path.join(self.directory, key)) as f:
                owner = f.read().strip()
        except OSError:
            return False
        return owner.isdigit() and int(owner) != os.getpid()


#: This host's record of slot producer owners (see :class:`SlotOwners`).
SLOT_OWNERS = SlotOwners()
