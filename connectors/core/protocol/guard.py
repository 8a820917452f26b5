"""The rules every coordinator command obeys, checked before its side effect.

:class:`Guard` sees each command before the coordinator yields it and each result after
the executor performed it; from the results it knows which decisions are durable, which
transactions are committed or rolled back and which batches have all their tasks'
results. A command that would break exactly-once raises
:class:`~connectors.core.errors.ProtocolStateError` *before* it is yielded, so the
executor never performs it:

- ``Commit`` of a transaction no durable decision lists (commit before decide);
- ``Abort`` of a transaction a decision lists, or of one whose batch could still be
  decided with it (neither a decision without it, nor a forbidden run, nor this run's own
  batch before its decision);
- ``Decide`` with other committables than the accepted task results, than an earlier
  decision of the batch, or with a transaction already rolled back; of another run; of a
  COMMIT_ON_DRIVER batch the target does not hold;
- ``AdoptDecision`` (a fan-out's decision copied into a participant's ledger) of anything
  but this prepared-transaction sink's own transactions, decided;
- ``MarkCommitted`` before every transaction of the decision committed;
- ``RecordSlots`` (a task-commit sink's slot count in its ledger) without the batch's
  ``PlanSlots`` or once its tasks ran;
- ``CommitBatch`` of a batch not first found absent from the ledger and the target, or
  without the attempt's intent recorded (``RecordIntent``, itself only for such a batch).

The guard is also the one keeper of each batch's state (``OPEN -> PREPARED -> DECIDED ->
COMMITTED``, or ``ABORTED``): it advances a :class:`~connectors.core.states.BatchProtocol`
per batch from the results it sees (:meth:`Guard.state`), and adopts the ledger's state for
a batch another run decided.

Also here: the split of task outcomes. The replay rule is :mod:`connectors.core.protocol.replay`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from connectors.core.batch import TaskOutcome
from connectors.core.errors import ConnectorError, ProtocolStateError
from connectors.core.ledgers.ledger import LedgerEntry, TaskCommit
from connectors.core.naming import TransactionId
from connectors.core.protocol.commands import (
    Abort,
    AdoptDecision,
    Command,
    Commit,
    CommitBatch,
    Decide,
    ForbidDecision,
    MarkCommitted,
    PlanSlots,
    ReadDecision,
    ReadUnfinished,
    RecordIntent,
    RecordSlots,
    RunTasks,
    TargetHasBatch,
)
from connectors.core.states import BatchProtocol, BatchState, Family

__all__ = ["Guard", "split_outcomes"]

def split_outcomes(
    sink_id: str, outcomes: Sequence[TaskOutcome], batch_id: int
) -> tuple[list[TaskCommit], list[ConnectorError]]:
    """The commits (by partition) and the errors of a batch's task outcomes."""
    commits = [o.commit for o in outcomes if o.commit is not None]
    errors = [o.error for o in outcomes if o.error is not None]
    partitions = [c.partition for c in commits]
    if len(set(partitions)) != len(partitions):
        raise ProtocolStateError(
            f"two task results for one partition ({sorted(partitions)}): the engine must "
            "return exactly one accepted attempt per partition",
            sink_id=sink_id,
            batch_id=batch_id,
        )
    return sorted(commits, key=lambda c: c.partition), errors


def _belongs(transaction_id: str, sink_id: str) -> bool:
    parsed = TransactionId.parse(transaction_id)
    return parsed is not None and parsed.belongs_to(sink_id)


def _ids(entry: LedgerEntry) -> frozenset[str]:
    return frozenset(c.transaction_id for c in entry.commits)


class Guard:
    """What one coordinator knows, and the rules its commands must obey (module doc)."""

    def __init__(self, family: Family, sink_id: str, run_id: str) -> None:
        self.family = family
        self.sink_id = sink_id
        self.run_id = run_id
        self.decisions: dict[int, LedgerEntry] = {}
        self.committed: set[str] = set()
        self.aborted: set[str] = set()
        self.forbidden: set[tuple[int, str]] = set()
        self.accepted: dict[int, frozenset[str]] = {}  # batch -> accepted task results
        self.deciding: set[int] = set()  # batches this run sent a decision for
        self.absent: set[int] = set()  # COMMIT_ON_DRIVER: neither ledger nor target has it
        self.held: set[int] = set()  # COMMIT_ON_DRIVER: the target holds the batch
        self.intended: set[int] = set()  # COMMIT_ON_DRIVER: the attempt's intent is recorded
        self.planned: set[int] = set()  # COMMIT_IN_TASK: the batch's slots are planned
        self.batches: dict[int, BatchProtocol] = {}  # the state of each batch seen

    def state(self, batch_id: int) -> BatchState | None:
        """The state of ``batch_id`` as this coordinator knows it (``None``: not seen)."""
        protocol = self.batches.get(batch_id)
        return protocol.state if protocol is not None else None

    def _advance(self, batch_id: int, to: BatchState) -> None:
        protocol = self.batches.setdefault(
            batch_id, BatchProtocol(self.family, self.sink_id, batch_id))
        if protocol.state is not to:
            protocol.advance(to)

    def _learn(self, entry: LedgerEntry) -> None:
        """A durable entry read from the ledger (or another run's decision): its state is
        the batch's, unless this run already took the batch further itself."""
        self.decisions[entry.batch_id] = entry
        protocol = self.batches.get(entry.batch_id)
        if protocol is None or entry.run_id != self.run_id:
            self.batches[entry.batch_id] = BatchProtocol(
                self.family, self.sink_id, entry.batch_id, state=entry.state)

    def _refuse(self, why: str, batch_id: int, transaction_id: str | None = None) -> None:
        raise ProtocolStateError(f"refused before its side effect: {why}",
                                 sink_id=self.sink_id, batch_id=batch_id,
                                 transaction_id=transaction_id)

    def accept(self, batch_id: int, transaction_ids: frozenset[str]) -> None:
        """A fan-out's parts of ``batch_id``, prepared or checked by its targets (each
        under its own guard): what the fan-out's decision must list."""
        self.accepted[batch_id] = transaction_ids
        self._advance(batch_id, BatchState.PREPARED)

    def completed(self, transaction_ids: set[str]) -> None:
        """A fan-out's target has its part of a decided batch: the decision's entries for
        that target are done (the target's own guard saw its commits)."""
        self.committed.update(transaction_ids)

    def before(self, command: Command) -> None:
        """Raise :class:`ProtocolStateError` if ``command`` breaks a rule."""
        if isinstance(command, Commit):
            self._check_commit(command)
        elif isinstance(command, Abort):
            self._check_abort(command)
        elif isinstance(command, Decide):
            self._check_decide(command.entry)
        elif isinstance(command, AdoptDecision):
            adopted = command.entry
            if (self.family is not Family.PREPARE_IN_TASK or adopted.sink_id != self.sink_id
                    or adopted.state is not BatchState.DECIDED
                    or any(not _belongs(t, self.sink_id) for t in _ids(adopted))):
                self._refuse(f"adopting a decision of batch {adopted.batch_id} that is not "
                             "this prepared-transaction sink's own part", adopted.batch_id)
        elif isinstance(command, MarkCommitted):
            entry = self.decisions.get(command.batch_id)
            if entry is None:
                self._refuse(f"batch {command.batch_id} recorded committed without a durable "
                             "decision", command.batch_id)
            else:
                missing = sorted(_ids(entry) - self.committed)
                if missing:
                    self._refuse(f"batch {command.batch_id} recorded committed while "
                                 f"{missing} are not committed", command.batch_id)
        elif isinstance(command, RecordSlots) and (
                command.batch_id not in self.planned or command.batch_id in self.batches):
            self._refuse(f"the slots of batch {command.batch_id} recorded without a plan or "
                         "after its tasks ran", command.batch_id)
        elif isinstance(command, CommitBatch | RecordIntent) and (
                command.batch_id not in self.absent):
            self._refuse(f"batch {command.batch_id} attempted on the target before the "
                         "ledger and the target were both found without it", command.batch_id)
        elif isinstance(command, CommitBatch) and command.batch_id not in self.intended:
            self._refuse(f"batch {command.batch_id} committed to the target before its "
                         "intent was recorded", command.batch_id)

    def _check_commit(self, command: Commit) -> None:
        tid = command.commit.transaction_id
        entry = self.decisions.get(command.batch_id)
        if entry is None or tid not in _ids(entry):
            self._refuse(f"commit of {tid} before a durable decision lists it",
                         command.batch_id, tid)

    def _check_abort(self, command: Abort) -> None:
        tid, batch_id = command.transaction_id, command.batch_id
        entry = self.decisions.get(batch_id)
        if entry is not None:
            if tid in _ids(entry):
                self._refuse(f"roll-back of {tid}, which the decision of batch {batch_id} "
                             "lists (a decided transaction is always committed)", batch_id, tid)
            return  # the decision is final and does not list it
        parsed = TransactionId.parse(tid)
        run = parsed.run_id if parsed is not None else None
        if (batch_id, run) in self.forbidden:
            return
        if run == self.run_id and batch_id not in self.deciding:
            return  # this run's own batch, before its decision: it will never list it
        self._refuse(f"roll-back of {tid} while batch {batch_id} could still be decided with "
                     "it (forbid its run's decision first)", batch_id, tid)

    def _check_decide(self, entry: LedgerEntry) -> None:
        batch_id = entry.batch_id
        if entry.run_id != self.run_id:
            self._refuse(f"a decision of run {entry.run_id} by run {self.run_id}", batch_id)
        earlier = self.decisions.get(batch_id)
        if earlier is not None and _ids(earlier) != _ids(entry):
            self._refuse(f"re-deciding batch {batch_id} with other committables "
                         f"({sorted(_ids(entry))}, decided: {sorted(_ids(earlier))})", batch_id)
        if self.family is Family.COMMIT_ON_DRIVER:
            if batch_id not in self.held:
                self._refuse(f"batch {batch_id} recorded committed before the target holds it",
                             batch_id)
            return
        accepted = self.accepted.get(batch_id)
        if accepted is None:
            self._refuse(f"a decision of batch {batch_id} before its tasks' results", batch_id)
        elif _ids(entry) != accepted:
            self._refuse(f"a decision of batch {batch_id} with other committables than its "
                         f"accepted task results ({sorted(_ids(entry))} vs {sorted(accepted)})",
                         batch_id)
        rolled_back = sorted(_ids(entry) & self.aborted)
        if rolled_back:
            self._refuse(f"a decision of batch {batch_id} listing rolled-back {rolled_back}",
                         batch_id)
        self.deciding.add(batch_id)

    def after(self, command: Command, result: Any) -> None:
        """Learn from a performed command's result."""
        if isinstance(command, ReadDecision | ForbidDecision | AdoptDecision) and (
                result is not None):
            self._learn(result)
        elif isinstance(command, Decide):
            entry: LedgerEntry = result
            if entry.run_id != self.run_id:
                self._learn(entry)
            else:
                self.decisions[entry.batch_id] = entry
                self._advance(entry.batch_id, entry.state)
        elif isinstance(command, ForbidDecision):
            self.forbidden.add((command.batch_id, command.run_id))
        elif isinstance(command, ReadUnfinished):
            for found in result:
                self._learn(found)
        elif isinstance(command, Commit):
            self.committed.add(command.commit.transaction_id)
        elif isinstance(command, Abort):
            self.aborted.add(command.transaction_id)
        elif isinstance(command, MarkCommitted):
            decided = self.decisions[command.batch_id]
            self.decisions[command.batch_id] = dataclasses.replace(
                decided, state=BatchState.COMMITTED)
            self._advance(command.batch_id, BatchState.COMMITTED)
        elif isinstance(command, RunTasks):
            outcomes: Sequence[TaskOutcome] = result
            if all(o.error is None for o in outcomes):
                self.accepted[command.batch_id] = frozenset(
                    o.commit.transaction_id for o in outcomes if o.commit is not None)
                self._advance(command.batch_id, BatchState.PREPARED)
            else:
                self._advance(command.batch_id, BatchState.ABORTED)
        elif isinstance(command, TargetHasBatch):
            (self.held if result else self.absent).add(command.batch_id)
            if result:  # COMMIT_ON_DRIVER: the target's commit is the decision
                self._advance(command.batch_id, BatchState.DECIDED)
        elif isinstance(command, RecordIntent):
            self.intended.add(command.batch_id)
        elif isinstance(command, PlanSlots):
            self.planned.add(command.batch_id)
        elif isinstance(command, CommitBatch):
            self.held.add(command.batch_id)
            self._advance(command.batch_id, BatchState.DECIDED)
