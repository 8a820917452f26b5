"""The executor: performs a coordinator's commands against the ledger, the engine and the
sink's hooks.

This is where every protocol step becomes I/O, and the only place that does: the order
of the steps is the coordinator's (:mod:`connectors.core.coordinator`). Here are the I/O
concerns: retries of transient failures (counted in the metrics), the re-read after an
ambiguous decision write, timings, the task functions the engine runs, and crash points
(a :class:`~connectors.core.commands.Crash` command calls
:func:`~connectors.core.crash.crash_point`).

An exception a command raises is thrown into the coordinator at the step that yielded
it, so the coordinator decides what follows (e.g. fence every slot when the tasks
failed), as psycopg's generators receive their I/O errors.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from connectors.core.batch import BatchContext, BatchInput
from connectors.core.commands import (
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
    ForTarget,
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
    RunTasks,
    TargetFinished,
    TargetHasBatch,
    TasksEnded,
)
from connectors.core.crash import crash_point
from connectors.core.driver_state import DriverState, run_steps
from connectors.core.errors import ConnectorError, DecisionUnknown, TransientError
from connectors.core.ledger import LedgerEntry
from connectors.core.metrics import BatchMetrics
from connectors.core.naming import TransactionId
from connectors.core.protocol import Family
from connectors.core.retry import RetryPolicy, call_with_retry
from connectors.core.tasks import prepare_task, slot_task

if TYPE_CHECKING:  # the hooks' one declaration; the template imports this module to run
    from connectors.core.families import (
        DriverCommitSink,
        PreparedTransactionSink,
        TaskCommitSink,
    )
    from connectors.core.template import TwoPhaseCommitSink

__all__ = ["Executor"]

logger = logging.getLogger(__name__)


class Executor:
    """Performs commands for one sink and one batch (see the module docstring).

    Built only by :class:`~connectors.core.sink_driver.SinkDriver`. A fan-out's executor
    performs the fan-out's own commands (``sink_id``, ``retry`` and ``state`` are the
    fan-out's; ``sink`` is its first target, whose ``begin_run`` opens a run, since the
    decisions' ledger may be of its kind) and routes
    :class:`~connectors.core.commands.ForTarget` to ``targets`` (by sink id); ``pool``
    runs a target's checks beside the other targets' work; ``finished(sink_id)`` closes a
    target's figures.
    """

    def __init__(
        self,
        sink: TwoPhaseCommitSink,
        state: DriverState,
        metrics: BatchMetrics,
        batch: BatchInput | None = None,
        *,
        sink_id: str | None = None,
        retry: RetryPolicy | None = None,
        targets: Mapping[str, Executor] | None = None,
        pool: ThreadPoolExecutor | None = None,
        finished: Callable[[str], None] | None = None,
    ) -> None:
        self.sink = sink
        self.state = state
        self.metrics = metrics
        self.batch = batch
        self.sink_id = sink_id or sink.sink_id
        self.retry = retry or sink.retry
        self.targets = dict(targets or {})
        self.pool = pool
        self.finished = finished

    def run(self, steps: Generator[Command, Any, Any]) -> Any:
        return run_steps(steps, self.perform)

    # ---- helpers ----
    def _context(self, batch_id: int) -> BatchContext:
        """The driver-side hooks' context: it carries the batch's input."""
        return self.state.context(self.sink_id, batch_id, self.batch)

    def _input(self) -> BatchInput:
        if self.batch is None:
            raise RuntimeError("a batch step without a batch input")  # a coordinator bug
        return self.batch

    def _retry(self, fn: Callable[[], Any], description: str, **ids: Any) -> Any:
        def count(_attempt: int, _error: BaseException, _delay: float) -> None:
            self.metrics.retries += 1

        return call_with_retry(fn, policy=self.retry, description=description,
                               on_retry=count, sink_id=self.sink_id, **ids)

    def _timed(self, name: str, fn: Callable[[], Any]) -> Any:
        start = time.monotonic()
        try:
            return fn()
        finally:
            ms = (time.monotonic() - start) * 1000
            setattr(self.metrics, name, getattr(self.metrics, name) + ms)

    # ---- the commands ----
    def perform(self, command: Command) -> Any:
        if isinstance(command, ForTarget):
            return self._for_target(command)
        if isinstance(command, CheckInput):
            return self._check_input(command.batch_id)
        if isinstance(command, AwaitChecks):
            for check in command.checks:
                check.result()
            return None
        if isinstance(command, TargetFinished):
            if self.finished is not None:
                self.finished(command.sink_id)
            return None
        if isinstance(command, OpenRun):  # the sink first: it may hold what the ledger needs
            self.sink.begin_run(self._context(command.batch_id))
            self.state.ledger.open_run(command.run_id)
            return None
        if isinstance(command, ReadDecision):
            return self.state.ledger.get(command.batch_id)
        if isinstance(command, ReadUnfinished):
            return self.state.ledger.unfinished()
        if isinstance(command, LastBatchId):
            return self.state.ledger.last_batch_id()
        if isinstance(command, ListPrepared):
            sink = cast("PreparedTransactionSink[Any]", self.sink)
            found = self._retry(lambda: list(sink.list_prepared()),
                                "listing prepared transactions")
            self._count_lingering(found)
            return found
        if isinstance(command, NewRun):
            self.state.new_run()
            return None
        if isinstance(command, NoteSwept):
            self.state.swept = command.swept
            return None
        if isinstance(command, TasksEnded):
            return self._input().tasks_ended()
        if isinstance(command, PlanSlots):
            sink_s = cast("TaskCommitSink[Any]", self.sink)
            return sink_s.plan_slots(self._input(), self._context(command.batch_id))
        if isinstance(command, RecordSlots):
            cast("TaskCommitSink[Any]", self.sink).record_slots(command.plan)
            return None
        if isinstance(command, RecordIntent):
            sink_i = cast("DriverCommitSink", self.sink)
            ctx = self._context(command.batch_id)
            return self._retry(partial(sink_i.record_intent, ctx),
                               f"recording the intent of batch {command.batch_id}",
                               batch_id=command.batch_id)
        if isinstance(command, BindQuery):
            generation = self.state.ledger.bind_query(command.query_id, reset=command.reset)
            self.state.generation, self.state.query_id = generation, command.query_id
            self.state.started = True
            return generation
        if isinstance(command, FenceAll):
            return cast("TaskCommitSink[Any]", self.sink).fence_all()
        if isinstance(command, InputFingerprint):
            return self.sink.fingerprint_input(self._input())
        if isinstance(command, CommittedFingerprint):
            return cast("DriverCommitSink", self.sink).committed_fingerprint(
                self._context(command.batch_id))
        if isinstance(command, TargetHasBatch):
            return cast("DriverCommitSink", self.sink).is_committed(
                self._context(command.batch_id))
        if isinstance(command, PlanInput):
            self.batch = self.sink.plan_input(self._input(), self._context(command.batch_id))
            if self.sink.family is Family.COMMIT_IN_TASK:
                return cast("TaskCommitSink[Any]", self.sink).slots
            return None
        if isinstance(command, RunTasks):
            return self._timed("prepare_ms", partial(self._run_tasks, command.batch_id))
        if isinstance(command, CommitBatch):
            sink_d = cast("DriverCommitSink", self.sink)
            batch, ctx = self._input(), self._context(command.batch_id)
            return self._timed("commit_ms", partial(
                self._retry, partial(sink_d.commit_batch, batch, ctx),
                f"commit of batch {command.batch_id}", batch_id=command.batch_id))
        if isinstance(command, Decide):
            return self._timed("decide_ms", partial(self._decide, command.entry))
        if isinstance(command, AdoptDecision):
            return self._decide(command.entry)
        if isinstance(command, ForbidDecision):
            return self.state.ledger.forbid_decision(command.batch_id, command.run_id)
        if isinstance(command, Commit):
            sink_p = cast("PreparedTransactionSink[Any]", self.sink)
            tid = command.commit.transaction_id
            return self._timed("commit_ms", partial(
                self._retry, partial(sink_p.commit, command.commit), f"commit of {tid}",
                batch_id=command.batch_id, transaction_id=tid))
        if isinstance(command, Abort):
            return self._abort(command)
        if isinstance(command, MarkCommitted):
            return self._timed("commit_ms", partial(
                self._retry, partial(self.state.ledger.mark_committed, command.batch_id),
                f"recording batch {command.batch_id} as committed", batch_id=command.batch_id))
        if isinstance(command, Prune):
            self.state.ledger.prune(command.keep)
            return None
        if isinstance(command, Crash):
            crash_point(command.point, sink_id=self.sink_id, batch_id=command.batch_id)
            return None
        raise TypeError(f"not a protocol command: {command!r}")

    def _run_tasks(self, batch_id: int) -> Any:
        try:
            return self._start_tasks(batch_id)
        except Exception:
            # Interrupted (a stopped query, a cancelled job) or failed: tasks of the batch
            # may still run and prepare; the roll-back that follows must see them.
            try:
                self._input().await_tasks_ended()
            except Exception as exc:  # never hide the tasks' own error
                logger.warning("sink %s batch %d: waiting for the batch's tasks to end failed "
                               "(%s)", self.sink.sink_id, batch_id, type(exc).__name__)
            raise

    def _start_tasks(self, batch_id: int) -> Any:
        batch = self._input()
        if self.sink.family is Family.PREPARE_IN_TASK:
            sink_p = cast("PreparedTransactionSink[Any]", self.sink)
            return batch.run_tasks(
                partial(prepare_task, sink_p, self.state.run_id, batch_id, batch.schema))
        sink_s = cast("TaskCommitSink[Any]", self.sink)
        ctx = self.state.context(self.sink.sink_id, batch_id)  # shipped: no batch input
        task = partial(slot_task, sink_s, ctx, batch.schema)
        try:
            return batch.run_tasks(task, barrier=sink_s.barrier)
        finally:  # where the slots ran, for the batch's metrics (a failed one's too)
            self.metrics.extra.update(batch.run_figures())

    def _count_lingering(self, prepared: list[str]) -> None:
        """The batch's metrics: the most of this sink's prepared transactions one sweep
        found (before settling them)."""
        mine = 0
        for raw in prepared:
            tid = TransactionId.parse(raw)
            mine += tid is not None and tid.belongs_to(self.sink.sink_id)
        self.metrics.lingering = max(self.metrics.lingering, mine)

    def _decide(self, entry: LedgerEntry) -> LedgerEntry:
        """Record the decision, the one rule for every program: after an ambiguous
        failure re-read (retried), never guess. Found: that is the decision; not found: not
        decided (the write's error is raised); the ledger still unreachable:
        :class:`~connectors.core.errors.DecisionUnknown`, and nothing may be rolled back."""
        ledger = self.state.ledger
        try:
            return ledger.decide(entry)
        except TransientError as written:
            # The write may or may not have happened: the ledger is the only truth.
            try:
                found = self._retry(partial(ledger.get, entry.batch_id),
                                    f"re-reading the decision of batch {entry.batch_id}",
                                    batch_id=entry.batch_id)
            except TransientError as unread:
                raise DecisionUnknown(
                    f"the decision of batch {entry.batch_id} may or may not be recorded "
                    f"(writing it failed: {type(written).__name__}; re-reading it failed: "
                    f"{type(unread).__name__}); nothing is rolled back: the next run's "
                    "start reads the ledger and finishes or rolls back the batch",
                    sink_id=self.sink_id, batch_id=entry.batch_id) from unread
            if found is None:
                raise
            return cast("LedgerEntry", found)

    # ---- a fan-out's routing and checks ----
    def _for_target(self, command: ForTarget) -> Any:
        try:
            return self.targets[command.sink_id].perform(command.command)
        except ConnectorError as exc:
            if exc.sink_id is None:
                exc.sink_id = command.sink_id
            raise

    def _check_input(self, batch_id: int) -> Future[None]:
        """Start the sink's ``check_input`` of its planned batch in the pool (at once
        without one); its time goes in the figures as ``check_ms``."""
        batch = self._input()
        ctx = self._context(batch_id)

        def check() -> None:
            started = time.monotonic()
            try:
                self.sink.check_input(batch, ctx)
            except ConnectorError as exc:
                if exc.sink_id is None:
                    exc.sink_id = self.sink_id
                raise
            finally:
                self.metrics.extra["check_ms"] = round((time.monotonic() - started) * 1000, 1)

        if self.pool is not None:
            return self.pool.submit(check)
        done: Future[None] = Future()
        try:
            check()
            done.set_result(None)
        except Exception as exc:
            done.set_exception(exc)
        return done

    def _abort(self, command: Abort) -> None:
        sink = cast("PreparedTransactionSink[Any]", self.sink)
        tid = command.transaction_id
        if command.quiet:
            try:
                sink.abort(tid)
            except Exception as exc:  # the sweep of the next run rolls it back
                logger.warning("sink %s: roll-back of %s failed (%s); the next sweep retries",
                               sink.sink_id, tid, type(exc).__name__)
            return
        self._retry(partial(sink.abort, tid), f"roll-back of {tid}",
                    batch_id=command.batch_id, transaction_id=tid)
