"""The three protocol families (:class:`~connectors.core.states.Family`) authors subclass.

Each is :class:`~connectors.core.templates.template.TwoPhaseCommitSink` plus its family's hooks:
:class:`PreparedTransactionSink` (tasks prepare, the driver decides and commits),
:class:`TaskCommitSink` (each slot commits in its task, made idempotent by a marker),
:class:`DriverCommitSink` (the driver commits the whole batch once, idempotently). Each
hook's docstring says who calls it, when, and which idempotency it must guarantee.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Generic, TypeVar

import pyarrow as pa

from connectors.core.batch import BatchContext, BatchInput
from connectors.core.errors import ConfigurationError
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers.ledger import TaskCommit
from connectors.core.protocol.transactions import (
    SlotMarker,
    SlotPlan,
    SlotTransaction,
    TaskTransaction,
)
from connectors.core.states import Family
from connectors.core.templates.template import TwoPhaseCommitSink

__all__ = ["DriverCommitSink", "PreparedTransactionSink", "TaskCommitSink"]

H = TypeVar("H")


class PreparedTransactionSink(TwoPhaseCommitSink, Generic[H]):
    """Family PREPARE_IN_TASK: tasks prepare, the driver decides and commits (XA style).

    ``H`` is the sink's handle for one open transaction in a task (e.g. a connection).
    The commit point is the decision in the ledger: prepared transactions with no decision
    are rolled back (presumed abort), decided ones are always committed.
    """

    family: ClassVar[Family] = Family.PREPARE_IN_TASK

    # ---- executor side ----
    @abstractmethod
    def begin_transaction(self, txn: TaskTransaction) -> H:
        """Task: open a transaction named ``str(txn.transaction_id)``; return its handle."""

    @abstractmethod
    def write(self, handle: H, batch: pa.RecordBatch) -> None:
        """Task: write one Arrow record batch into the transaction."""

    @abstractmethod
    def pre_commit(self, handle: H, fingerprint: Fingerprint) -> None:
        """Task: flush and prepare; the transaction must then survive this process.

        Release the handle's resources (a prepared transaction outlives its connection).
        The driver commits by the transaction's id alone (:meth:`commit` gets the task's
        :class:`~connectors.core.ledgers.ledger.TaskCommit`): nothing is returned.
        """

    @abstractmethod
    def abort_transaction(self, handle: H) -> None:
        """Task: roll back and release an unprepared transaction after a failure."""

    # ---- driver side ----
    @abstractmethod
    def commit(self, commit: TaskCommit) -> None:
        """Driver: commit a prepared transaction that the ledger decided.

        Idempotent: committing one that is already committed does nothing. If it is
        neither prepared nor provably committed, raise
        :class:`~connectors.core.errors.DataLossError` (never presume a commit). Raise
        :class:`~connectors.core.errors.TransientError` for failures worth retrying.
        """

    @abstractmethod
    def abort(self, transaction_id: str) -> None:
        """Driver: roll back a prepared transaction; nothing to do if it does not exist."""

    @abstractmethod
    def list_prepared(self) -> Iterable[str]:
        """Driver: ids of this sink's transactions that are prepared right now.

        The template keeps only ids whose sink id is exactly this sink's, so a loose
        filter here (e.g. by prefix) cannot touch another sink. It only lists: the
        template decides what to commit or roll back.
        """


class TaskCommitSink(TwoPhaseCommitSink, Generic[H]):
    """Family COMMIT_IN_TASK: each slot's task commits its own transaction with a marker.

    For targets whose transactions cannot outlive the process that opened them (Kafka).
    Rows are placed into ``slots`` partitions by a hash of their content, so a replay puts
    every row in the same slot; each slot's transaction carries a marker (sink, batch,
    slot, fingerprint), and a replayed slot that finds its marker writes nothing.

    Args:
        slots: number of slots (and transactional ids): bounded, and fixed for the sink.
        slot_columns: columns hashed to place rows (default: every column).
        barrier: run the slots in Spark's barrier mode (all start together).
        small_batch_rows: a batch of at most this many rows may run its slots in the
            driver, in a thread per slot, without the slotting shuffle (where the engine
            offers it: :meth:`BatchInput.slotted`'s ``local_rows``); every row still lands
            in the same slot. Default 0 (never): only for slot functions that are
            thread-safe and act the same in the driver as in a task.
    """

    family: ClassVar[Family] = Family.COMMIT_IN_TASK

    def __init__(
        self,
        *,
        sink_id: str,
        slots: int,
        slot_columns: list[str] | None = None,
        barrier: bool = False,
        small_batch_rows: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(sink_id=sink_id, **kwargs)
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ConfigurationError("slots must be an int >= 1", sink_id=sink_id)
        if (isinstance(small_batch_rows, bool) or not isinstance(small_batch_rows, int)
                or small_batch_rows < 0):
            raise ConfigurationError("small_batch_rows must be an int >= 0 (0: off)",
                                     sink_id=sink_id)
        #: A batch of at most this many rows may run its slots in the driver, without the
        #: slotting shuffle, where the engine offers it (0: never). Only for a sink whose
        #: slot functions are thread-safe and act the same in the driver as in a task.
        self.small_batch_rows = small_batch_rows
        self.slots = slots
        self.slot_columns = list(slot_columns) if slot_columns is not None else None
        self.barrier = bool(barrier)
        #: A column whose non-null values alone place a row (every row of a key in one slot,
        #: in its input partition's order); ``None``: by content. A sink sets it per batch,
        #: and must replay a batch with the placement it was started with.
        self.slot_key: str | None = None

    # ---- executor side ----
    @abstractmethod
    def open_slot(self, slot: SlotTransaction) -> H:
        """Task: fence the slot's previous owner and begin its transaction."""

    @abstractmethod
    def read_marker(self, handle: H) -> SlotMarker | None:
        """Task, after fencing: the slot's committed marker for this batch, if any.

        A read that fails must raise: it never counts as "no marker".
        """

    @abstractmethod
    def write(self, handle: H, batch: pa.RecordBatch) -> None:
        """Task: write one Arrow record batch into the slot's transaction."""

    @abstractmethod
    def commit_slot(self, handle: H, marker: SlotMarker) -> Mapping[str, float] | None:
        """Task: write ``marker`` in the same transaction as the rows, then commit.

        Return the slot's figures (numbers by name: its transaction's duration, say) or
        ``None``. They reach the driver beside the slot's commit, never in the ledger, as
        one of :attr:`BatchMetrics.task_figures
        <connectors.core.metrics.BatchMetrics.task_figures>`, which :meth:`report_metrics`
        summarises into ``metrics.extra``.
        """

    @abstractmethod
    def abort_slot(self, handle: H) -> None:
        """Task: abort the slot's transaction (if open) and release it."""

    # ---- driver side ----
    @abstractmethod
    def fence_all(self) -> int:
        """Driver, at (re)start and after a failed batch: fence every slot this sink ever
        used, so no transaction of a dead run stays open. Returns how many were fenced."""

    def plan_slots(self, batch: BatchInput, ctx: BatchContext) -> SlotPlan:
        """Driver, every new batch, before :meth:`plan_input`: the batch's slots. A
        sink whose slot count or placement is recorded (and may change between runs)
        decides them here from its ledger, refusing a change while a batch some slots
        committed is unfinished; ``record=True`` asks for :meth:`record_slots` first.
        Default: :attr:`slots`, nothing to record."""
        return SlotPlan(self.slots)

    def record_slots(self, plan: SlotPlan) -> None:
        """Driver, when :meth:`plan_slots` asked for it, before any task of the batch:
        record ``plan`` (idempotently). Default: nothing."""

    def partition_input(self, batch: BatchInput) -> BatchInput:
        """Driver: the rows placed into :attr:`slots` partitions by a hash of their content
        (of :attr:`slot_key` where it is set and not null), deterministically.

        The engine is offered to run a small batch's slots in the driver
        (:attr:`small_batch_rows`) only when this driver's previous batch was that small
        and succeeded: a batch larger than expected may cost the engine a collect before it
        shuffles (Spark: the whole batch), so neither the first batch of a run (a restart's
        backlog) nor a stream of large batches pays it."""
        last = self.last_metrics
        small = self.small_batch_rows if (
            not self.barrier and last is not None and last.outcome != "failed"
            and last.rows <= self.small_batch_rows) else 0
        if not small:  # an input written before ``local_rows`` existed still works
            return batch.slotted(self.slots, self.slot_columns, key=self.slot_key)
        return batch.slotted(self.slots, self.slot_columns, key=self.slot_key,
                             local_rows=small)


class DriverCommitSink(TwoPhaseCommitSink):
    """Family COMMIT_ON_DRIVER: the driver commits the whole batch once, idempotently.

    For targets with an idempotent batch commit keyed by (sink, batch id), such as Delta
    Lake's ``txnAppId``/``txnVersion``.
    """

    family: ClassVar[Family] = Family.COMMIT_ON_DRIVER
    #: ``True`` when :meth:`commit_batch` observes the batch's fingerprint inside its own
    #: write and returns it: then no separate fingerprint job runs before a fresh write
    #: (:meth:`fingerprint_input` is still used to check replays).
    fingerprint_in_commit: ClassVar[bool] = False

    @abstractmethod
    def is_committed(self, ctx: BatchContext) -> bool:
        """Driver: does the target itself record ``(ctx.app_id, ctx.batch_id)`` committed?"""

    @abstractmethod
    def commit_batch(self, batch: BatchInput, ctx: BatchContext) -> Fingerprint | None:
        """Driver: write and commit the whole batch atomically, idempotently keyed by
        ``(ctx.app_id, ctx.batch_id)``.

        Called again after a crash; if the target already has the key it must do
        nothing. Raise :class:`~connectors.core.errors.TransientError` to be retried.
        Returns the batch's fingerprint if the write observed it
        (:attr:`fingerprint_in_commit`), else ``None``.
        """

    def record_intent(self, ctx: BatchContext) -> None:
        """Driver, before :meth:`commit_batch` of a batch neither the ledger nor the target
        holds (once per batch, retried on a transient error): record in the sink's ledger
        that run ``ctx.run_id`` is about to commit it, where :meth:`is_committed` needs
        that to settle a crash after it (Delta's tag path). ``ctx.batch`` is the batch.
        Default: nothing."""

    def committed_fingerprint(self, ctx: BatchContext) -> Fingerprint | None:
        """Driver, on the replay of a batch the ledger recorded *without* a fingerprint
        (:meth:`commit_batch` returned ``None``): the fingerprint of what the target holds
        for ``(ctx.app_id, ctx.batch_id)``, recomputed from the target, or ``None`` to skip
        the check. A sink whose commit keeps the rows as written (Delta appends) can verify
        replays this way at no cost on the normal path. Default: ``None``.
        """
        return None
