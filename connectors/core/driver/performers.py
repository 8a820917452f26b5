"""The performers: each protocol command's I/O, one method per command, by concern.

The executor (:mod:`connectors.core.driver.executor`) looks a command's type up in the table
these build (:meth:`LedgerPerformer.table` and the others) and calls the method; the
performers and the executor are the only places that do a protocol step's I/O.

- :class:`LedgerPerformer`: the run and the ledger (open, bind, read, decide, adopt,
  forbid, mark committed, prune); the one rule for an ambiguous decision write;
- :class:`HookPerformer`: the sink's driver-side hooks (plan, fingerprints, a
  driver commit, commit and roll back a transaction, list prepared ones, slots) and crash
  points;
- :class:`TaskPerformer`: the engine's tasks (run them, whether they ended) and a
  fan-out target's checks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from connectors.core.batch import TaskOutcome
from connectors.core.driver.execution import Execution
from connectors.core.errors import ConnectorError, DecisionUnknown, TransientError
from connectors.core.ledgers.ledger import LedgerEntry
from connectors.core.naming import TransactionId
from connectors.core.policies.binding import resume_rebinds
from connectors.core.protocol.commands import (
    Abort,
    AdoptDecision,
    AwaitChecks,
    BindQuery,
    CheckInput,
    Command,
    Commit,
    CommitBatch,
    CommittedFingerprint,
    Crash,
    Decide,
    FenceAll,
    ForbidDecision,
    InputFingerprint,
    LastBatchId,
    ListPrepared,
    MarkCommitted,
    NewRun,
    NoteSwept,
    OpenRun,
    PlanInput,
    PlanSlots,
    Prune,
    ReadDecision,
    ReadUnfinished,
    RecordIntent,
    RecordSlots,
    ResumeRun,
    RunTasks,
    RunToken,
    TargetHasBatch,
    TasksEnded,
)
from connectors.core.protocol.crash import crash_point
from connectors.core.states import Family
from connectors.core.templates.tasks import prepare_task, slot_task

if TYPE_CHECKING:  # the hooks' one declaration (on the family templates)
    from connectors.core.templates.families import (
        DriverCommitSink,
        PreparedTransactionSink,
        TaskCommitSink,
    )

__all__ = ["HookPerformer", "LedgerPerformer", "Performers", "TaskPerformer"]

logger = logging.getLogger(__name__)

#: A command type -> the method that performs it (and returns its result).
Performers = dict[type[Command], Callable[[Any], Any]]


class LedgerPerformer:
    """The run and the ledger's commands."""

    def __init__(self, run: Execution) -> None:
        self.run = run

    def table(self) -> Performers:
        return {OpenRun: self.open_run, RunToken: self.run_token, ResumeRun: self.resume_run,
                ReadDecision: self.read_decision,
                ReadUnfinished: self.read_unfinished, LastBatchId: self.last_batch_id,
                BindQuery: self.bind_query, NewRun: self.new_run, NoteSwept: self.note_swept,
                Decide: self.decide, AdoptDecision: self.adopt, ForbidDecision: self.forbid,
                MarkCommitted: self.mark_committed, Prune: self.prune}

    def open_run(self, command: OpenRun) -> None:
        # The sink first: it may hold what the ledger needs (a session, a catalog).
        self.run.sink.begin_run(self.run.context(command.batch_id))
        self.run.state.ledger.open_run(command.run_id)

    def run_token(self, _command: RunToken) -> str | None:
        return self.run.state.ledger.run_token()

    def resume_run(self, command: ResumeRun) -> None:
        self.run.state.ledger.resume_run(command.run_id, command.token)

    def read_decision(self, command: ReadDecision) -> LedgerEntry | None:
        return self.run.state.ledger.get(command.batch_id)

    def read_unfinished(self, _command: ReadUnfinished) -> list[LedgerEntry]:
        return self.run.state.ledger.unfinished()

    def last_batch_id(self, _command: LastBatchId) -> int | None:
        return self.run.state.ledger.last_batch_id()

    def bind_query(self, command: BindQuery) -> int:
        state = self.run.state
        reset, resume = command.binding.reset, command.binding.resume
        if resume is not None:
            reset = resume_rebinds(state.ledger, command.query_id, resume)
        generation = state.ledger.bind_query(command.query_id, reset=reset)
        state.generation, state.query_id = generation, command.query_id
        state.started = True
        return generation

    def new_run(self, _command: NewRun) -> None:
        self.run.state.new_run()

    def note_swept(self, command: NoteSwept) -> None:
        self.run.state.swept = command.swept

    def decide(self, command: Decide) -> LedgerEntry:
        return cast("LedgerEntry", self.run.timed("decide_ms",
                                                  partial(self._record, command.entry)))

    def adopt(self, command: AdoptDecision) -> LedgerEntry:
        return self._record(command.entry)

    def _record(self, entry: LedgerEntry) -> LedgerEntry:
        """Record the decision, the one rule for every program: after an ambiguous
        failure re-read (retried), never guess. Found: that is the decision; not found: not
        decided (the write's error is raised); the ledger still unreachable:
        :class:`~connectors.core.errors.DecisionUnknown`, and nothing may be rolled back."""
        ledger = self.run.state.ledger
        try:
            return ledger.decide(entry)
        except TransientError as written:
            # The write may or may not have happened: the ledger is the only truth.
            try:
                found = self.run.retried(partial(ledger.get, entry.batch_id),
                                         f"re-reading the decision of batch {entry.batch_id}",
                                         batch_id=entry.batch_id)
            except TransientError as unread:
                raise DecisionUnknown(
                    f"the decision of batch {entry.batch_id} may or may not be recorded "
                    f"(writing it failed: {type(written).__name__}; re-reading it failed: "
                    f"{type(unread).__name__}); nothing is rolled back: the next run's "
                    "start reads the ledger and finishes or rolls back the batch",
                    sink_id=self.run.sink_id, batch_id=entry.batch_id) from unread
            if found is None:
                raise
            return cast("LedgerEntry", found)

    def forbid(self, command: ForbidDecision) -> LedgerEntry | None:
        return self.run.state.ledger.forbid_decision(command.batch_id, command.run_id)

    def mark_committed(self, command: MarkCommitted) -> None:
        ledger, batch_id = self.run.state.ledger, command.batch_id
        self.run.timed("commit_ms", partial(
            self.run.retried, partial(ledger.mark_committed, batch_id),
            f"recording batch {batch_id} as committed", batch_id=batch_id))

    def prune(self, command: Prune) -> None:
        self.run.state.ledger.prune(command.keep)


class HookPerformer:
    """The sink's driver-side hooks, and crash points."""

    def __init__(self, run: Execution) -> None:
        self.run = run

    def table(self) -> Performers:
        return {ListPrepared: self.list_prepared, PlanSlots: self.plan_slots,
                RecordSlots: self.record_slots, RecordIntent: self.record_intent,
                FenceAll: self.fence_all, InputFingerprint: self.input_fingerprint,
                CommittedFingerprint: self.committed_fingerprint,
                TargetHasBatch: self.target_has_batch, PlanInput: self.plan_input,
                CommitBatch: self.commit_batch, Commit: self.commit, Abort: self.abort,
                Crash: self.crash}

    @property
    def _prepared(self) -> PreparedTransactionSink[Any]:
        return cast("PreparedTransactionSink[Any]", self.run.sink)

    @property
    def _slots(self) -> TaskCommitSink[Any]:
        return cast("TaskCommitSink[Any]", self.run.sink)

    @property
    def _driver_commit(self) -> DriverCommitSink:
        return cast("DriverCommitSink", self.run.sink)

    def list_prepared(self, _command: ListPrepared) -> list[str]:
        sink = self._prepared
        found: list[str] = self.run.retried(lambda: list(sink.list_prepared()),
                                            "listing prepared transactions")
        # The batch's figures: the most of this sink's prepared transactions one sweep
        # found (before settling them).
        mine = 0
        for raw in found:
            tid = TransactionId.parse(raw)
            mine += tid is not None and tid.belongs_to(sink.sink_id)
        self.run.metrics.lingering = max(self.run.metrics.lingering, mine)
        return found

    def plan_slots(self, command: PlanSlots) -> Any:
        return self._slots.plan_slots(self.run.input(), self.run.context(command.batch_id))

    def record_slots(self, command: RecordSlots) -> None:
        self._slots.record_slots(command.plan)

    def record_intent(self, command: RecordIntent) -> Any:
        ctx = self.run.context(command.batch_id)
        return self.run.retried(partial(self._driver_commit.record_intent, ctx),
                                f"recording the intent of batch {command.batch_id}",
                                batch_id=command.batch_id)

    def fence_all(self, _command: FenceAll) -> int:
        return self._slots.fence_all()

    def input_fingerprint(self, _command: InputFingerprint) -> Any:
        return self.run.sink.fingerprint_input(self.run.input())

    def committed_fingerprint(self, command: CommittedFingerprint) -> Any:
        return self._driver_commit.committed_fingerprint(self.run.context(command.batch_id))

    def target_has_batch(self, command: TargetHasBatch) -> bool:
        return self._driver_commit.is_committed(self.run.context(command.batch_id))

    def plan_input(self, command: PlanInput) -> int | None:
        run = self.run
        run.batch = run.sink.plan_input(run.input(), run.context(command.batch_id))
        return self._slots.slots if run.sink.family is Family.COMMIT_IN_TASK else None

    def commit_batch(self, command: CommitBatch) -> Any:
        run, batch_id = self.run, command.batch_id
        commit = partial(self._driver_commit.commit_batch, run.input(), run.context(batch_id))
        return run.timed("commit_ms", partial(run.retried, commit, f"commit of batch {batch_id}",
                                              batch_id=batch_id))

    def commit(self, command: Commit) -> None:
        tid = command.commit.transaction_id
        self.run.timed("commit_ms", partial(
            self.run.retried, partial(self._prepared.commit, command.commit),
            f"commit of {tid}", batch_id=command.batch_id, transaction_id=tid))

    def abort(self, command: Abort) -> None:
        sink, tid = self._prepared, command.transaction_id
        if command.quiet:
            try:
                sink.abort(tid)
            except Exception as exc:  # the sweep of the next run rolls it back
                logger.warning("sink %s: roll-back of %s failed (%s); the next sweep retries",
                               sink.sink_id, tid, type(exc).__name__)
            return
        self.run.retried(partial(sink.abort, tid), f"roll-back of {tid}",
                         batch_id=command.batch_id, transaction_id=tid)

    def crash(self, command: Crash) -> None:
        crash_point(command.point, sink_id=self.run.sink_id, batch_id=command.batch_id)


def _partition(outcome: TaskOutcome) -> int:
    return outcome.commit.partition if outcome.commit is not None else -1


class TaskPerformer:
    """The engine's tasks, and a fan-out target's checks."""

    def __init__(self, run: Execution) -> None:
        self.run = run

    def table(self) -> Performers:
        return {RunTasks: self.run_tasks, TasksEnded: self.tasks_ended,
                CheckInput: self.check_input, AwaitChecks: self.await_checks}

    def run_tasks(self, command: RunTasks) -> list[TaskOutcome]:
        """The batch's tasks (a split batch's: the outcomes its tasks sent); what each task
        measured, beside its commit and never stored, goes into the batch's figures
        (``BatchMetrics.task_figures``, in partition order) for the sink's
        ``report_metrics``."""
        outcomes: list[TaskOutcome] = self.run.timed(
            "prepare_ms", partial(self._run_tasks, command.batch_id))
        self.run.metrics.task_figures = [
            dict(o.figures) for o in sorted(outcomes, key=_partition) if o.figures]
        return outcomes

    def _run_tasks(self, batch_id: int) -> Any:
        try:
            return self._start_tasks(batch_id)
        except Exception:
            # Interrupted (a stopped query, a cancelled job) or failed: tasks of the batch
            # may still run and prepare; the roll-back that follows must see them.
            try:
                self.run.input().await_tasks_ended()
            except Exception as exc:  # never hide the tasks' own error
                logger.warning("sink %s batch %d: waiting for the batch's tasks to end failed "
                               "(%s)", self.run.sink.sink_id, batch_id, type(exc).__name__)
            raise

    def _start_tasks(self, batch_id: int) -> Any:
        run = self.run
        batch = run.input()
        if run.sink.family is Family.PREPARE_IN_TASK:
            sink_p = cast("PreparedTransactionSink[Any]", run.sink)
            return batch.run_tasks(
                partial(prepare_task, sink_p, run.state.run_id, batch_id, batch.schema))
        sink_s = cast("TaskCommitSink[Any]", run.sink)
        ctx = run.state.context(sink_s.sink_id, batch_id)  # shipped: no batch input
        task = partial(slot_task, sink_s, ctx, batch.schema)
        try:
            return batch.run_tasks(task, barrier=sink_s.barrier)
        finally:  # where the slots ran, for the batch's metrics (a failed one's too)
            run.metrics.extra.update(batch.run_figures())

    def tasks_ended(self, _command: TasksEnded) -> bool:
        return self.run.input().tasks_ended()

    def check_input(self, command: CheckInput) -> Future[None]:
        """Start the sink's ``check_input`` of its planned batch in the pool (at once
        without one); its time goes in the figures as ``check_ms``."""
        run = self.run
        batch, ctx = run.input(), run.context(command.batch_id)

        def check() -> None:
            started = time.monotonic()
            try:
                run.sink.check_input(batch, ctx)
            except ConnectorError as exc:
                if exc.sink_id is None:
                    exc.sink_id = run.sink_id
                raise
            finally:
                run.metrics.extra["check_ms"] = round((time.monotonic() - started) * 1000, 1)

        if run.pool is not None:
            return run.pool.submit(check)
        done: Future[None] = Future()
        try:
            check()
            done.set_result(None)
        except Exception as exc:
            done.set_exception(exc)
        return done

    def await_checks(self, command: AwaitChecks) -> None:
        for check in command.checks:
            check.result()
