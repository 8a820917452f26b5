"""The Kafka ledger: the sink's decisions, query binding and slot count in a compacted topic.

One partition, ``cleanup.policy=compact``, default name ``_connectors.<sink_id>.ledger``.
Records (key -> JSON value)::

    binding                 {"query_id", "generation", "slots", "placement"}
    batch/<batch_id:020d>   a LedgerEntry (COMMITTED, with every slot's fingerprint)
    abort/<batch>/<run>     "run may never decide batch" (operator tools)
    lineage/<query_id>      query took the sink over from a savepoint (resume_from)
    <any key> -> null       a tombstone: pruned, or forgotten by a reset of the binding

Only the driver writes it, through its own transactional producer (``transactional.id``
``eos1|<sink_id>|ledger``). That producer is the driver's *lease*: ``init_transactions`` of a
newer driver fences the older one (its next write fails with a fenced error, surfaced as
:class:`~connectors.core.errors.FencedError`) and aborts whatever it left open. After
``init_transactions`` the ledger is read with ``read_committed`` up to its last stable
offset, so the new driver sees every decision the old one committed, and nothing else.
Every write is one Kafka transaction: decisions, bindings and tombstones are atomic.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from connectors.core.errors import (
    ConnectorError,
    FencedError,
    ProtocolStateError,
    TransientError,
)
from connectors.core.ledgers.ledger import Ledger, LedgerEntry, Lineage, check_binding
from connectors.core.states import BatchState
from connectors.kafka._config import KafkaConfig
from connectors.kafka._errors import FENCED_CODES, kafka_error, translate
from connectors.kafka._io import Admin, init_transactions, read_committed

__all__ = ["PLACEMENT_KEY", "PLACEMENT_ROW", "KafkaLedger", "ledger_transactional_id"]

logger = logging.getLogger(__name__)

#: The ledger is pruned on every PRUNE_EVERY-th batch (it keeps ``keep_batches`` + this).
PRUNE_EVERY = 10
#: Attempts at one ledger transaction (retriable errors, or abort-and-redo).
_WRITE_ATTEMPTS = 5
_TOPIC_CONFIG = {"cleanup.policy": "compact", "min.insync.replicas": "1"}
#: Placement rules (the binding's ``placement``): rows with a non-null ``key`` by the key's
#: hash, the rest by content; or every row by content (``slot_columns``, and the rule of
#: every batch written before the ledger recorded one).
PLACEMENT_KEY = "key"
PLACEMENT_ROW = "row"


def ledger_transactional_id(sink_id: str) -> str:
    """The driver's transactional id: one per sink, whatever the number of runs."""
    return f"eos1|{sink_id}|ledger"


def _batch_key(batch_id: int) -> str:
    return f"batch/{batch_id:020d}"


class KafkaLedger(Ledger):
    """The sink's ledger in a compacted Kafka topic (see the module docstring)."""

    def __init__(
        self, config: KafkaConfig, topic: str, *, sink_id: str, admin: Admin,
        replication_factor: int = -1, transaction_timeout_ms: int = 60_000,
        timeout: float = 30.0, preflight: Callable[[], None] | None = None,
        read_only: bool = False,
    ) -> None:
        self.sink_id = sink_id
        #: Read without taking the lease (operator tools): never fences a live driver,
        #: sees what is committed, and refuses every write.
        self.read_only = read_only
        self._loaded = False
        self.config = config
        self.topic = topic
        self.admin = admin
        self.replication_factor = replication_factor
        self.transaction_timeout_ms = transaction_timeout_ms
        self.timeout = timeout
        self._preflight = preflight
        self._producer: Producer | None = None
        self._fenced = False
        self._binding: dict[str, Any] | None = None
        self._entries: dict[int, LedgerEntry] = {}
        self._aborts: set[tuple[int, str]] = set()
        self._lineage: dict[str, Lineage] = {}
        self._prunes = 0

    def __repr__(self) -> str:
        return f"KafkaLedger({self.topic!r}, sink_id={self.sink_id!r})"

    # ---- plumbing ----
    def _error(self, exc: BaseException, doing: str, **ids: Any) -> ConnectorError:
        return translate(exc, doing=doing, secrets=self.config.secrets,
                         bootstrap=self.config.bootstrap, sink_id=self.sink_id, **ids)

    def _ensure_topic(self) -> None:
        if self.admin.topic(self.topic) is None:
            self.admin.create_topic(self.topic, 1, self.replication_factor, _TOPIC_CONFIG)

    def _acquire(self) -> Producer:
        """Step 1 of every run: take the lease (fence older drivers), then load the topic."""
        if self._fenced:
            raise FencedError(
                f"another driver took over sink {self.sink_id!r} (its ledger producer fenced "
                "this one): this driver must stop; the newer one finishes the work",
                sink_id=self.sink_id)
        if self._producer is not None:
            return self._producer
        if self._preflight is not None:
            self._preflight()  # e.g. the sink's check of transaction.timeout.ms
        self._ensure_topic()
        tid = ledger_transactional_id(self.sink_id)
        try:
            producer = Producer(self.config.producer(tid, self.transaction_timeout_ms))
            init_transactions(producer, self.topic, self.timeout)
        except KafkaException as exc:
            raise self._error(exc, "taking the ledger lease (init_transactions)",
                              transaction_id=tid) from None
        self._load()
        self._producer = producer
        return producer

    def _load(self) -> None:
        records = read_committed(self.config, self.topic, 0, timeout=self.timeout,
                                 sink_id=self.sink_id)
        binding: dict[str, Any] | None = None
        entries: dict[int, LedgerEntry] = {}
        aborts: set[tuple[int, str]] = set()
        lineage: dict[str, Lineage] = {}
        for record in records:
            key = (record.key or b"").decode()
            value = json.loads(record.value) if record.value is not None else None
            if key == "binding":
                binding = value
            elif key.startswith("batch/"):
                batch_id = int(key.split("/", 1)[1])
                if value is None:
                    entries.pop(batch_id, None)
                else:
                    entries[batch_id] = LedgerEntry.from_json(value)
            elif key.startswith("abort/"):
                _, batch, run = key.split("/", 2)
                if value is None:
                    aborts.discard((int(batch), run))
                else:
                    aborts.add((int(batch), run))
            elif key.startswith("lineage/") and value is not None:
                lineage[key.split("/", 1)[1]] = Lineage.from_json(value)
        self._binding, self._entries, self._aborts = binding, entries, aborts
        self._lineage = lineage

    def _write(self, records: list[tuple[str, dict[str, Any] | None]], doing: str,
               **ids: Any) -> None:
        """One Kafka transaction holding ``records``: all of them, or none."""
        if self.read_only:
            raise ProtocolStateError(f"the ledger of sink {self.sink_id!r} was opened read-only",
                                     sink_id=self.sink_id)
        producer = self._acquire()
        last: ConnectorError | None = None
        for _attempt in range(_WRITE_ATTEMPTS):
            try:
                producer.begin_transaction()
                for key, value in records:
                    payload = None if value is None else json.dumps(value).encode()
                    producer.produce(self.topic, key=key.encode(), value=payload, partition=0)
                self._commit(producer)
                return
            except KafkaException as exc:
                err = kafka_error(exc)
                last = self._error(exc, doing, **ids)
                if err is not None and (err.code() in FENCED_CODES or (
                        err.code() == KafkaError._STATE and err.fatal())):
                    self._fenced, self._producer = True, None
                    raise FencedError(
                        f"another driver took over sink {self.sink_id!r} while this one was "
                        f"{doing}: this driver must stop", sink_id=self.sink_id, **ids,
                    ) from None
                if err is not None and err.txn_requires_abort():
                    try:
                        producer.abort_transaction(self.timeout)
                    except KafkaException:
                        break
                    continue
                break
        # Outcome unknown (or failed): a new producer settles the open transaction and the
        # ledger is read again before the next call.
        self._producer = None
        raise TransientError(f"{doing} failed: {last}", sink_id=self.sink_id, **ids)

    def _commit(self, producer: Producer) -> None:
        """``commit_transaction``, called again while librdkafka says it is retriable."""
        delay = 0.1
        for attempt in range(_WRITE_ATTEMPTS):
            try:
                producer.commit_transaction(self.timeout)
                return
            except KafkaException as exc:
                err = kafka_error(exc)
                if err is None or not err.retriable() or attempt == _WRITE_ATTEMPTS - 1:
                    raise
                time.sleep(delay)
                delay = min(2 * delay, 2.0)

    # ---- Ledger ----
    def open_run(self, run_id: str) -> None:
        if self.read_only:
            raise ProtocolStateError(f"the ledger of sink {self.sink_id!r} was opened read-only",
                                     sink_id=self.sink_id)
        self._fenced = False
        self._producer = None
        self._acquire()

    def _ready(self) -> None:
        if self.read_only:
            if not self._loaded:
                self._load()
                self._loaded = True
            return
        self._acquire()

    def bound_query(self) -> str | None:
        self._ready()
        return str(self._binding["query_id"]) if self._binding else None

    @property
    def slots(self) -> int | None:
        """The slot count recorded for the sink (``None`` before its first batch)."""
        self._ready()
        if self._binding and self._binding.get("slots") is not None:
            return int(self._binding["slots"])
        return None

    @property
    def placement(self) -> str | None:
        """The rule placing rows into slots (``None`` before the first batch): ``"key"``,
        or ``"row"`` (by content only: the rule of bindings recorded without one)."""
        self._ready()
        if not self._binding or self._binding.get("slots") is None:
            return None
        return str(self._binding.get("placement") or PLACEMENT_ROW)

    def record_slots(self, slots: int, placement: str = PLACEMENT_ROW) -> None:
        """Record the slot count and placement rule (the sink checked that no batch is
        unfinished: every batch is written under one rule, the recorded one)."""
        self._ready()
        binding = dict(self._binding or {"query_id": None, "generation": 0})
        binding["slots"] = slots
        binding["placement"] = placement
        self._write([("binding", binding)], "recording the slot count and placement")
        self._binding = binding

    def record_lineage(self, link: Lineage) -> None:
        self._ready()
        self._write([(f"lineage/{link.query_id}", link.to_json())],
                    "recording where the query took the sink over")
        self._lineage[link.query_id] = link

    def lineage(self) -> list[Lineage]:
        self._ready()
        return list(self._lineage.values())

    def bind_query(self, query_id: str, *, reset: bool = False) -> int:
        self._ready()
        bound = self._binding.get("query_id") if self._binding else None
        generation = int(self._binding.get("generation", 0)) if self._binding else 0
        if not check_binding(self.sink_id, bound, query_id, reset=reset):
            return generation
        records: list[tuple[str, dict[str, Any] | None]] = []
        if bound is not None:
            generation += 1
            records += [(_batch_key(b), None) for b in self._entries]
            records += [(f"abort/{b}/{r}", None) for b, r in self._aborts]
        binding = {**(self._binding or {}), "query_id": query_id, "generation": generation}
        records.append(("binding", binding))
        self._write(records, "binding the sink to its query")
        self._binding = binding
        if bound is not None:
            self._entries.clear()
            self._aborts.clear()
        return generation

    def get(self, batch_id: int) -> LedgerEntry | None:
        self._ready()
        return self._entries.get(batch_id)

    def decide(self, entry: LedgerEntry) -> LedgerEntry:
        if entry.state not in (BatchState.DECIDED, BatchState.COMMITTED):
            raise ProtocolStateError(f"cannot record a {entry.state.value} decision")
        self._ready()
        existing = self._entries.get(entry.batch_id)
        if existing is not None:
            return existing
        if (entry.batch_id, entry.run_id) in self._aborts:
            raise FencedError(
                f"run {entry.run_id} was aborted for this batch by another driver or an "
                "operator", sink_id=self.sink_id, batch_id=entry.batch_id)
        self._write([(_batch_key(entry.batch_id), entry.to_json())],
                    f"recording batch {entry.batch_id}", batch_id=entry.batch_id)
        self._entries[entry.batch_id] = entry
        return entry

    def forbid_decision(self, batch_id: int, run_id: str) -> LedgerEntry | None:
        self._ready()
        existing = self._entries.get(batch_id)
        if existing is not None and existing.run_id == run_id:
            return existing
        self._write([(f"abort/{batch_id}/{run_id}", {"batch_id": batch_id, "run_id": run_id})],
                    f"recording an abort of batch {batch_id}", batch_id=batch_id)
        self._aborts.add((batch_id, run_id))
        return None

    def mark_committed(self, batch_id: int) -> None:
        self._ready()
        entry = self._entries.get(batch_id)
        if entry is None or entry.state is BatchState.COMMITTED:
            return
        done = entry.committed()
        self._write([(_batch_key(batch_id), done.to_json())],
                    f"recording batch {batch_id} as committed", batch_id=batch_id)
        self._entries[batch_id] = done

    def entries(self) -> Sequence[LedgerEntry]:
        self._ready()
        return [self._entries[b] for b in sorted(self._entries)]

    def last_batch_id(self) -> int | None:
        self._ready()
        return max(self._entries) if self._entries else None

    def prune(self, keep: int) -> None:
        self._prunes += 1
        if (self._prunes - 1) % PRUNE_EVERY:
            return
        ids = sorted(self._entries)
        if len(ids) <= keep:
            return
        cutoff = ids[-keep]
        old = [b for b in ids if b < cutoff and self._entries[b].state is BatchState.COMMITTED]
        stale = [(b, r) for b, r in self._aborts if b < cutoff]
        if not old and not stale:
            return
        records: list[tuple[str, dict[str, Any] | None]] = [(_batch_key(b), None) for b in old]
        records += [(f"abort/{b}/{r}", None) for b, r in stale]
        self._write(records, "pruning the ledger")
        for b in old:
            del self._entries[b]
        self._aborts.difference_update(stale)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(5)
        self._producer = None
