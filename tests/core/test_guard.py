"""The coordinator's guard: each illegal command is refused before it is yielded."""

from __future__ import annotations

import pytest

from connectors.core.batch import TaskOutcome
from connectors.core.errors import ProtocolStateError
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers.ledger import LedgerEntry, TaskCommit
from connectors.core.naming import TransactionId
from connectors.core.protocol.commands import (
    Abort,
    Commit,
    CommitBatch,
    Decide,
    ForbidDecision,
    MarkCommitted,
    ReadDecision,
    RecordIntent,
    RunTasks,
    TargetHasBatch,
)
from connectors.core.protocol.guard import Guard
from connectors.core.states import BatchState, Family

RUN = "0000000a"
OLD, OTHER = "0000000b", "0000000c"


def commit(run: str, batch: int, attempt: int) -> TaskCommit:
    tid = str(TransactionId("s", run, batch, attempt))
    return TaskCommit(tid, attempt, attempt, Fingerprint())


def entry(batch: int, *commits: TaskCommit, run: str = RUN,
          state: BatchState = BatchState.DECIDED) -> LedgerEntry:
    return LedgerEntry("s", batch, run, state, tuple(commits), Fingerprint(), "q")


def ran(guard: Guard, batch: int, *commits: TaskCommit) -> None:
    command = RunTasks(batch)
    guard.before(command)
    guard.after(command, [TaskOutcome(commit=c) for c in commits])


def refused(guard: Guard, command: object, words: str) -> None:
    with pytest.raises(ProtocolStateError, match=words):
        guard.before(command)  # type: ignore[arg-type]


def test_the_legal_order_passes() -> None:
    g = Guard(Family.PREPARE_IN_TASK, "s", RUN)
    a, b = commit(RUN, 0, 1), commit(RUN, 0, 2)
    ran(g, 0, a, b)
    decided = entry(0, a, b)
    g.before(Decide(decided))
    g.after(Decide(decided), decided)
    for c in (a, b):
        g.before(Commit(0, c))
        g.after(Commit(0, c), None)
    g.before(MarkCommitted(0))


def test_commit_before_a_durable_decision_is_refused() -> None:
    g = Guard(Family.PREPARE_IN_TASK, "s", RUN)
    a = commit(RUN, 0, 1)
    ran(g, 0, a)
    refused(g, Commit(0, a), "before a durable decision")


def test_a_decision_with_other_committables_is_refused() -> None:
    g = Guard(Family.PREPARE_IN_TASK, "s", RUN)
    a, b = commit(RUN, 0, 1), commit(RUN, 0, 2)
    ran(g, 0, a)
    refused(g, Decide(entry(0, a, b)), "other committables than its accepted")
    refused(g, Decide(entry(1, a)), "before its tasks' results")
    # a batch the ledger already decided, with others
    g.after(ReadDecision(0), entry(0, commit(OLD, 0, 9), run=OLD))
    refused(g, Decide(entry(0, a)), "re-deciding batch 0")


def test_a_decided_transaction_is_never_rolled_back() -> None:
    g = Guard(Family.PREPARE_IN_TASK, "s", RUN)
    old = commit(OLD, 3, 1)
    g.after(ReadDecision(3), entry(3, old, run=OLD))
    refused(g, Abort(3, old.transaction_id), "which the decision of batch 3 lists")
    g.before(Abort(3, commit(OLD, 3, 2).transaction_id))  # not listed: a losing attempt


def test_another_runs_undecided_transaction_needs_its_decision_forbidden_first() -> None:
    g = Guard(Family.PREPARE_IN_TASK, "s", RUN)
    stray = commit(OTHER, 5, 1)
    refused(g, Abort(5, stray.transaction_id), "forbid its run's decision first")
    g.after(ForbidDecision(5, OTHER), None)
    g.before(Abort(5, stray.transaction_id))
    own = commit(RUN, 6, 1)
    g.before(Abort(6, own.transaction_id))  # this run's, before it decided batch 6


def test_mark_committed_waits_for_every_commit() -> None:
    g = Guard(Family.PREPARE_IN_TASK, "s", RUN)
    a, b = commit(RUN, 0, 1), commit(RUN, 0, 2)
    refused(g, MarkCommitted(0), "without a durable decision")
    g.after(ReadDecision(0), entry(0, a, b))
    g.after(Commit(0, a), None)
    refused(g, MarkCommitted(0), "are not committed")


def test_a_rolled_back_transaction_cannot_be_decided() -> None:
    g = Guard(Family.PREPARE_IN_TASK, "s", RUN)
    a = commit(RUN, 0, 1)
    ran(g, 0, a)
    g.after(Abort(0, a.transaction_id), None)
    refused(g, Decide(entry(0, a)), "listing rolled-back")


def test_driver_commit_needs_the_batch_absent_and_the_record_needs_it_held() -> None:
    g = Guard(Family.COMMIT_ON_DRIVER, "s", RUN)
    record = entry(0, state=BatchState.COMMITTED)
    refused(g, CommitBatch(0), "before the ledger and the target were both found without")
    refused(g, RecordIntent(0), "before the ledger and the target were both found without")
    refused(g, Decide(record), "before the target holds it")
    g.after(TargetHasBatch(0), False)
    refused(g, CommitBatch(0), "before its intent was recorded")
    g.before(RecordIntent(0))
    g.after(RecordIntent(0), None)
    g.before(CommitBatch(0))
    g.after(CommitBatch(0), None)
    g.before(Decide(record))
    refused(g, Decide(entry(0, state=BatchState.COMMITTED, run=OTHER)), "a decision of run")


def test_a_slot_record_needs_its_plan_and_comes_before_the_tasks() -> None:
    from connectors.core.protocol.commands import PlanSlots, RecordSlots
    from connectors.core.protocol.transactions import SlotPlan

    g = Guard(Family.COMMIT_IN_TASK, "s", RUN)
    plan = SlotPlan(4, "key", record=True)
    refused(g, RecordSlots(0, plan), "recorded without a plan or after its tasks ran")
    g.before(PlanSlots(0))
    g.after(PlanSlots(0), plan)
    g.before(RecordSlots(0, plan))
    ran(g, 0, commit(RUN, 0, 1))
    refused(g, RecordSlots(0, plan), "recorded without a plan or after its tasks ran")


def test_the_coordinator_plans_and_records_slots_before_a_slot_batch_runs() -> None:
    from connectors.core.protocol.commands import LastBatchId, PlanInput, PlanSlots, RecordSlots
    from connectors.core.protocol.coordinator import Coordinator, RunFacts
    from connectors.core.protocol.transactions import SlotPlan

    c = Coordinator(Family.COMMIT_IN_TASK, "s", run_id=RUN, query_id="q")
    steps = c.write(0, RunFacts(started=True, query_id="q"))
    assert next(steps) == LastBatchId()
    assert steps.send(None) == ReadDecision(0)
    assert steps.send(None) == PlanSlots(0)
    plan = SlotPlan(2, "row", record=True)
    assert steps.send(plan) == RecordSlots(0, plan)
    assert steps.send(None) == PlanInput(0)
    # a plan with nothing to record goes straight to the input
    c = Coordinator(Family.COMMIT_IN_TASK, "s", run_id=RUN, query_id="q")
    steps = c.write(0, RunFacts(started=True, query_id="q"))
    next(steps), steps.send(None), steps.send(None)
    assert steps.send(SlotPlan(2)) == PlanInput(0)
