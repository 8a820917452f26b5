"""What the protocol needs from a sink, by protocol family, as typing protocols.

The template classes (:mod:`connectors.core.template`, :mod:`connectors.core.families`)
implement these and document each hook (``tests/core/test_participants.py`` keeps the two
in step: same hooks, same parameters); the executor side
(:mod:`connectors.core.tasks`) and the driver side (:mod:`connectors.core.executor`) are
written against them, so neither imports the template (no import cycle).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar

import pyarrow as pa

from connectors.core.batch import BatchContext, BatchInput
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledger import TaskCommit
from connectors.core.protocol import Family
from connectors.core.retry import RetryPolicy
from connectors.core.transactions import SlotMarker, SlotPlan, SlotTransaction, TaskTransaction

__all__ = ["DriverParticipant", "Participant", "PreparedParticipant", "SlotParticipant"]

H = TypeVar("H")


class Participant(Protocol):
    """Every sink: its name, policies and input hooks."""

    @property
    def sink_id(self) -> str: ...

    @property
    def retry(self) -> RetryPolicy: ...

    @property
    def on_replay_mismatch(self) -> str: ...

    @property
    def family(self) -> Family: ...

    def plan_input(self, batch: BatchInput, ctx: BatchContext) -> BatchInput: ...

    def fingerprint_input(self, batch: BatchInput) -> Fingerprint | None: ...

    def begin_run(self) -> None: ...


class PreparedParticipant(Participant, Protocol[H]):
    """PREPARE_IN_TASK: tasks prepare, the driver commits what the ledger decided."""

    def begin_transaction(self, txn: TaskTransaction) -> H: ...

    def write(self, handle: H, batch: pa.RecordBatch) -> None: ...

    def pre_commit(self, handle: H, fingerprint: Fingerprint) -> bytes: ...

    def abort_transaction(self, handle: H) -> None: ...

    def commit(self, commit: TaskCommit) -> None: ...

    def abort(self, transaction_id: str) -> None: ...

    def list_prepared(self) -> Iterable[str]: ...


class SlotParticipant(Participant, Protocol[H]):
    """COMMIT_IN_TASK: each slot's task commits its rows with a marker."""

    @property
    def slots(self) -> int: ...

    @property
    def barrier(self) -> bool: ...

    def open_slot(self, slot: SlotTransaction) -> H: ...

    def read_marker(self, handle: H) -> SlotMarker | None: ...

    def write(self, handle: H, batch: pa.RecordBatch) -> None: ...

    def commit_slot(self, handle: H, marker: SlotMarker) -> bytes | None: ...

    def abort_slot(self, handle: H) -> None: ...

    def fence_all(self) -> int: ...

    def plan_slots(self, batch: BatchInput, ctx: BatchContext) -> SlotPlan: ...

    def record_slots(self, plan: SlotPlan) -> None: ...


class DriverParticipant(Participant, Protocol):
    """COMMIT_ON_DRIVER: the driver commits the whole batch once, idempotently."""

    def is_committed(self, ctx: BatchContext) -> bool: ...

    def commit_batch(self, batch: BatchInput, ctx: BatchContext) -> Fingerprint | None: ...

    def committed_fingerprint(self, ctx: BatchContext) -> Fingerprint | None: ...

    def record_intent(self, ctx: BatchContext) -> None: ...
