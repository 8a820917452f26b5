"""In-memory participants for each protocol family, and an in-memory ledger.

An :class:`InMemoryTarget` plays the durable target: it outlives sink instances, so a test
"restarts the driver" by dropping a sink and building a new one on the same target. Tasks
must run in the same process (:class:`~connectors.testing.LocalBatch`).

Also here: one deliberately broken sink per family, each a mistake an author could make,
that the conformance suite must reject: :class:`CommitBeforeDecisionSink` (commits in its
pre-commit), :class:`IgnoresMarkerSink` (takes an earlier run's slot marker for stale) and
:class:`ForgetsCommitSink` (remembers its commits in driver memory, not in the target).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from connectors.core.batch import BatchContext, BatchInput
from connectors.core.errors import DataLossError, FencedError
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers.ledger import (
    Ledger,
    LedgerEntry,
    Lineage,
    TaskCommit,
    check_binding,
)
from connectors.core.states import BatchState
from connectors.core.templates.families import (
    DriverCommitSink,
    PreparedTransactionSink,
    TaskCommitSink,
)
from connectors.core.templates.tasks import SlotMarker, SlotTransaction, TaskTransaction

__all__ = [
    "CommitBeforeDecisionSink",
    "ForgetsCommitSink",
    "IgnoresMarkerSink",
    "InMemoryDriverCommitSink",
    "InMemoryLedger",
    "InMemoryPreparedSink",
    "InMemoryTarget",
    "InMemoryTaskCommitSink",
]

Row = tuple[Any, ...]


def _rows(batch: pa.RecordBatch | pa.Table) -> list[Row]:
    return [tuple(r.values()) for r in batch.to_pylist()]


@dataclass
class _LedgerStore:
    binding: str | None = None
    generation: int = 0
    decisions: dict[int, LedgerEntry] = field(default_factory=dict)
    aborts: set[tuple[int, str]] = field(default_factory=set)
    lineage: dict[str, Lineage] = field(default_factory=dict)


class InMemoryTarget:
    """A durable target in memory: committed rows, prepared transactions, markers, ledgers."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.rows: list[Row] = []
        self.prepared: dict[str, list[Row]] = {}
        self.receipts: set[str] = set()  # ids of committed transactions (provable commits)
        self.markers: dict[tuple[str, int, int, int], SlotMarker] = {}
        self.epochs: dict[str, int] = {}  # slot name -> producer epoch (fencing)
        self.open_slots: dict[str, int] = {}  # slot name -> epoch of its open transaction
        self.driver_batches: dict[str, set[int]] = {}  # app id -> batch ids
        self.ledgers: dict[str, _LedgerStore] = {}

    def committed_rows(self) -> list[Row]:
        with self.lock:
            return sorted(self.rows, key=repr)

    def lingering(self) -> int:
        """Prepared or open transactions left behind."""
        with self.lock:
            return len(self.prepared) + len(self.open_slots)

    def ledger(self, sink_id: str) -> InMemoryLedger:
        with self.lock:
            store = self.ledgers.setdefault(sink_id, _LedgerStore())
        return InMemoryLedger(sink_id, store, self.lock)


class InMemoryLedger(Ledger):
    """A :class:`~connectors.core.ledgers.ledger.Ledger` kept in an :class:`InMemoryTarget`."""

    def __init__(self, sink_id: str, store: _LedgerStore, lock: threading.RLock) -> None:
        self.sink_id = sink_id
        self._store = store
        self._lock = lock

    def bound_query(self) -> str | None:
        return self._store.binding

    def record_lineage(self, link: Lineage) -> None:
        with self._lock:
            self._store.lineage[link.query_id] = link

    def lineage(self) -> list[Lineage]:
        with self._lock:
            return list(self._store.lineage.values())

    def bind_query(self, query_id: str, *, reset: bool = False) -> int:
        with self._lock:
            store = self._store
            if check_binding(self.sink_id, store.binding, query_id, reset=reset):
                if store.binding is not None:
                    store.generation += 1
                    store.decisions.clear()
                    store.aborts.clear()
                store.binding = query_id
            return store.generation

    def get(self, batch_id: int) -> LedgerEntry | None:
        with self._lock:
            return self._store.decisions.get(batch_id)

    def decide(self, entry: LedgerEntry) -> LedgerEntry:
        with self._lock:
            existing = self._store.decisions.get(entry.batch_id)
            if existing is not None:
                return existing
            if (entry.batch_id, entry.run_id) in self._store.aborts:
                raise FencedError(
                    f"run {entry.run_id} was aborted for this batch",
                    sink_id=self.sink_id, batch_id=entry.batch_id,
                )
            self._store.decisions[entry.batch_id] = entry
            return entry

    def forbid_decision(self, batch_id: int, run_id: str) -> LedgerEntry | None:
        with self._lock:
            existing = self._store.decisions.get(batch_id)
            if existing is not None and existing.run_id == run_id:
                return existing
            self._store.aborts.add((batch_id, run_id))
            return None

    def mark_committed(self, batch_id: int) -> None:
        with self._lock:
            entry = self._store.decisions[batch_id]
            self._store.decisions[batch_id] = entry.committed()

    def entries(self) -> Sequence[LedgerEntry]:
        with self._lock:
            return [self._store.decisions[b] for b in sorted(self._store.decisions)]

    def prune(self, keep: int) -> None:
        with self._lock:
            batches = sorted(self._store.decisions)
            for b in batches[: max(0, len(batches) - keep)]:
                if self._store.decisions[b].state is BatchState.COMMITTED:
                    del self._store.decisions[b]


@dataclass
class _MemTxn:
    transaction_id: str
    rows: list[Row] = field(default_factory=list)


class InMemoryPreparedSink(PreparedTransactionSink[_MemTxn]):
    """PREPARE_IN_TASK participant: prepared transactions held by the target.

    Example::

        from connectors.testing import LocalBatch

        target = InMemoryTarget()
        sink = InMemoryPreparedSink(target, sink_id="mem")
        sink.write_batch(LocalBatch(pa.table({"x": [1, 2]})), 0)
        assert target.committed_rows() == [(1,), (2,)]
    """

    def __init__(self, target: InMemoryTarget, *, sink_id: str, **kwargs: Any) -> None:
        super().__init__(sink_id=sink_id, **kwargs)
        self.target = target

    def create_ledger(self) -> Ledger:
        return self.target.ledger(self.sink_id)

    def create_ledger_for(self, sink_id: str) -> Ledger:
        return self.target.ledger(sink_id)

    def begin_transaction(self, txn: TaskTransaction) -> _MemTxn:
        return _MemTxn(str(txn.transaction_id))

    def write(self, handle: _MemTxn, batch: pa.RecordBatch) -> None:
        handle.rows.extend(_rows(batch))

    def pre_commit(self, handle: _MemTxn, fingerprint: Fingerprint) -> None:
        with self.target.lock:
            self.target.prepared[handle.transaction_id] = handle.rows

    def abort_transaction(self, handle: _MemTxn) -> None:
        handle.rows = []

    def commit(self, commit: TaskCommit) -> None:
        with self.target.lock:
            rows = self.target.prepared.pop(commit.transaction_id, None)
            if rows is None:
                if commit.transaction_id in self.target.receipts:
                    return  # already committed: provably, by its receipt
                raise DataLossError(
                    "decided transaction is neither prepared nor committed",
                    sink_id=self.sink_id, transaction_id=commit.transaction_id,
                )
            self.target.rows.extend(rows)
            self.target.receipts.add(commit.transaction_id)

    def abort(self, transaction_id: str) -> None:
        with self.target.lock:
            self.target.prepared.pop(transaction_id, None)

    def list_prepared(self) -> Iterable[str]:
        with self.target.lock:
            return list(self.target.prepared)  # every sink's: the template filters


class CommitBeforeDecisionSink(InMemoryPreparedSink):
    """BROKEN on purpose: "pre-commit" commits at once, before any decision.

    A crash between its pre-commit and the decision, then a replay, writes rows twice.
    The conformance suite must fail it.
    """

    def pre_commit(self, handle: _MemTxn, fingerprint: Fingerprint) -> None:
        with self.target.lock:
            self.target.rows.extend(handle.rows)
            self.target.receipts.add(handle.transaction_id)


@dataclass
class _MemSlot:
    name: str
    generation: int
    batch_id: int
    slot: int
    sink_id: str
    epoch: int
    rows: list[Row] = field(default_factory=list)


class InMemoryTaskCommitSink(TaskCommitSink[_MemSlot]):
    """COMMIT_IN_TASK participant: per-slot transactions with fencing and markers."""

    def __init__(self, target: InMemoryTarget, *, sink_id: str, slots: int = 3, **kwargs: Any):
        super().__init__(sink_id=sink_id, slots=slots, **kwargs)
        self.target = target

    def create_ledger(self) -> Ledger:
        return self.target.ledger(self.sink_id)

    def create_ledger_for(self, sink_id: str) -> Ledger:
        return self.target.ledger(sink_id)

    def open_slot(self, slot: SlotTransaction) -> _MemSlot:
        with self.target.lock:
            epoch = self.target.epochs.get(slot.name, 0) + 1  # fences the previous owner
            self.target.epochs[slot.name] = epoch
            self.target.open_slots[slot.name] = epoch
        return _MemSlot(slot.name, slot.generation, slot.batch_id, slot.slot, slot.sink_id, epoch)

    def read_marker(self, handle: _MemSlot) -> SlotMarker | None:
        with self.target.lock:
            key = (handle.sink_id, handle.generation, handle.batch_id, handle.slot)
            return self.target.markers.get(key)

    def write(self, handle: _MemSlot, batch: pa.RecordBatch) -> None:
        handle.rows.extend(_rows(batch))

    def commit_slot(self, handle: _MemSlot, marker: SlotMarker) -> Mapping[str, float] | None:
        with self.target.lock:
            if self.target.epochs.get(handle.name) != handle.epoch:
                raise FencedError(f"slot {handle.name} was fenced", sink_id=handle.sink_id)
            self.target.rows.extend(handle.rows)
            key = (handle.sink_id, handle.generation, handle.batch_id, handle.slot)
            self.target.markers[key] = marker
            self.target.open_slots.pop(handle.name, None)
        return {"rows": float(len(handle.rows))}  # the slot's figures (metrics.task_figures)

    def abort_slot(self, handle: _MemSlot) -> None:
        with self.target.lock:
            if self.target.open_slots.get(handle.name) == handle.epoch:
                del self.target.open_slots[handle.name]

    def fence_all(self) -> int:
        with self.target.lock:
            names = [n for n in self.target.epochs if n.split("|")[1] == self.sink_id]
            for name in names:
                self.target.epochs[name] += 1
                self.target.open_slots.pop(name, None)
            return len(names)


class InMemoryDriverCommitSink(DriverCommitSink):
    """COMMIT_ON_DRIVER participant: one atomic, batch-id-keyed commit per batch."""

    def __init__(self, target: InMemoryTarget, *, sink_id: str, **kwargs: Any) -> None:
        super().__init__(sink_id=sink_id, **kwargs)
        self.target = target

    def create_ledger(self) -> Ledger:
        return self.target.ledger(self.sink_id)

    def create_ledger_for(self, sink_id: str) -> Ledger:
        return self.target.ledger(sink_id)

    def is_committed(self, ctx: BatchContext) -> bool:
        with self.target.lock:
            return ctx.batch_id in self.target.driver_batches.get(ctx.app_id, set())

    def commit_batch(self, batch: BatchInput, ctx: BatchContext) -> None:
        rows = _rows(batch.to_arrow())
        with self.target.lock:
            done = self.target.driver_batches.setdefault(ctx.app_id, set())
            if ctx.batch_id in done:
                return
            self.target.rows.extend(rows)
            done.add(ctx.batch_id)


@dataclass
class _RunSlot(_MemSlot):
    run_id: str = ""


class IgnoresMarkerSink(InMemoryTaskCommitSink):
    """BROKEN on purpose (COMMIT_IN_TASK): takes a marker written by an earlier run for stale.

    Its :meth:`read_marker` returns the slot's marker only if this run wrote it, as if a
    dead run's marker were left over garbage. But a restarted driver replays the batch in a
    new run: every slot that committed before the crash misses its marker and writes its
    rows again. Task retries and speculative attempts (same run) still look fine; the
    ``crash_points`` scenario catches it (crash after a slot's commit or before the
    decision, restart, replay: rows twice).
    """

    def open_slot(self, slot: SlotTransaction) -> _MemSlot:
        handle = super().open_slot(slot)
        return _RunSlot(**vars(handle), run_id=slot.run_id)

    def read_marker(self, handle: _MemSlot) -> SlotMarker | None:
        marker = super().read_marker(handle)
        if marker is None or not isinstance(handle, _RunSlot):
            return None
        return marker if marker.run_id == handle.run_id else None  # the mistake


class ForgetsCommitSink(InMemoryDriverCommitSink):
    """BROKEN on purpose (COMMIT_ON_DRIVER): remembers its commits in driver memory.

    :meth:`is_committed` and :meth:`commit_batch` key the batch in a set held by the sink
    object, not in the target, so the commit is idempotent only until the driver restarts.
    A crash after :meth:`commit_batch` but before the ledger records the batch, then the
    restart's replay, commits the batch twice: the ``crash_points`` scenario catches it
    (crash after the decision, restart, replay: rows twice).
    """

    def __init__(self, target: InMemoryTarget, *, sink_id: str, **kwargs: Any) -> None:
        super().__init__(target, sink_id=sink_id, **kwargs)
        self._committed: set[tuple[str, int]] = set()  # the mistake: lost with the driver

    def is_committed(self, ctx: BatchContext) -> bool:
        return (ctx.app_id, ctx.batch_id) in self._committed

    def commit_batch(self, batch: BatchInput, ctx: BatchContext) -> None:
        if (ctx.app_id, ctx.batch_id) in self._committed:
            return
        rows = _rows(batch.to_arrow())
        with self.target.lock:
            self.target.rows.extend(rows)
        self._committed.add((ctx.app_id, ctx.batch_id))
