"""Who a transaction is: what a task's transaction hooks get, and a slot's marker."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from connectors.core.fingerprint import Fingerprint
from connectors.core.naming import TransactionId, slot_name

if TYPE_CHECKING:
    from connectors.core.batch import TaskBarrier

__all__ = ["SlotMarker", "SlotPlan", "SlotTransaction", "TaskTransaction"]


@dataclass(frozen=True)
class TaskTransaction:
    """What ``PreparedTransactionSink.begin_transaction`` gets: who this transaction is."""

    transaction_id: TransactionId
    partition: int
    schema: pa.Schema

    @property
    def sink_id(self) -> str:
        return self.transaction_id.sink_id

    @property
    def batch_id(self) -> int:
        return self.transaction_id.batch_id


@dataclass(frozen=True)
class SlotPlan:
    """A task-commit sink's slots for one batch (``TaskCommitSink.plan_slots``): how many,
    the rule that places rows into them, and whether they must be recorded first
    (``record``: the sink's ``record_slots``, e.g. a changed count in the ledger, or the
    slots' marker partitions not yet checked in this driver run)."""

    slots: int
    placement: str = ""
    record: bool = False


@dataclass(frozen=True)
class SlotMarker:
    """Written in the same transaction as a slot's rows: "(sink, batch, slot) is done"."""

    sink_id: str
    generation: int
    batch_id: int
    slot: int
    run_id: str
    fingerprint: Fingerprint

    def to_json(self) -> dict[str, Any]:
        return {
            "v": 1,
            "sink_id": self.sink_id,
            "generation": self.generation,
            "batch_id": self.batch_id,
            "slot": self.slot,
            "run_id": self.run_id,
            "fp": self.fingerprint.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SlotMarker:
        return cls(
            str(data["sink_id"]),
            int(data.get("generation", 0)),
            int(data["batch_id"]),
            int(data["slot"]),
            str(data["run_id"]),
            Fingerprint.from_json(data["fp"]),
        )


@dataclass(frozen=True)
class SlotTransaction:
    """What ``TaskCommitSink.open_slot`` gets: the slot, its stable name and the batch.

    A slot's marker for this batch is keyed by ``(sink_id, generation, batch_id, slot)``.
    """

    sink_id: str
    generation: int
    batch_id: int
    run_id: str
    slot: int
    task_attempt_id: int
    schema: pa.Schema
    #: The barrier of the task's stage, when it runs in one (:class:`TaskInfo`).
    barrier: TaskBarrier | None = field(default=None, compare=False, repr=False)

    @property
    def name(self) -> str:
        """The slot's stable name (e.g. its Kafka ``transactional.id``)."""
        return slot_name(self.sink_id, self.slot)
