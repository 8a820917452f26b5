"""The coordinator: every protocol step of a batch, in order, as commands (sans-I/O).

The coordinator does no I/O. Like psycopg's generators, it *yields* a command (read the
decision, run the tasks, decide, commit one transaction, crash point, ...) and receives its
result; an executor (:mod:`connectors.core.driver.executor`) performs each command against the
ledger, the engine and the sink's hooks. So the order of the steps, for all three protocol
families and for recovery after a restart, is written once, here, and nowhere else; and
every command passes one guard (:class:`Guard`) *before* it is yielded: a commit without a
durable decision listing it, an abort of a decided transaction, a second decision with other
committables, a batch recorded committed before all of its transactions are: each raises
:class:`~connectors.core.errors.ProtocolStateError` before the side effect could happen.

Crash points are commands too (:class:`Crash`; task-side ones: ``templates/tasks.py``).
Recovery is no second code path: a run's start (:meth:`Coordinator.start`) finishes decided
batches with the ``Recovery.finish`` (:mod:`.recovery`) a batch uses, and settles
stray transactions with the sweep that closes every PREPARE_IN_TASK batch. The coordinator
decides when a run starts (:class:`RunFacts`) and ends it when a batch fails (:class:`NewRun`).
A batch is two halves, :meth:`Coordinator.prepare` (nothing visible) and
:meth:`Coordinator.complete`, so that a fan-out decides between them.

Example, driving a coordinator by hand (what the executor does)::

    >>> from connectors.core.protocol.coordinator import Coordinator, RunFacts
    >>> c = Coordinator(Family.COMMIT_ON_DRIVER, "events", run_id="r1", query_id="q")
    >>> steps = c.write(0, RunFacts(started=True, query_id="q"))
    >>> next(steps)
    LastBatchId()
    >>> steps.send(None)
    ReadDecision(batch_id=0)
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Generator, Sequence
from typing import Any, TypeVar, cast

from connectors.core.batch import TaskOutcome
from connectors.core.errors import ProtocolStateError
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers.ledger import LedgerEntry
from connectors.core.metrics import BatchMetrics
from connectors.core.policies.binding import BOUND, Binding, went_backwards
from connectors.core.protocol.commands import (
    Abort,
    AdoptDecision,
    BindQuery,
    Command,
    CommitBatch,
    CommittedFingerprint,
    Crash,
    Decide,
    FenceAll,
    InputFingerprint,
    LastBatchId,
    NewRun,
    NoteSwept,
    OpenRun,
    PlanInput,
    PlanSlots,
    Prune,
    ReadDecision,
    RecordIntent,
    RecordSlots,
    RunTasks,
    TargetHasBatch,
    TasksEnded,
)
from connectors.core.protocol.guard import Guard, split_outcomes
from connectors.core.protocol.recovery import Recovery, Settled
from connectors.core.protocol.replay import check_replay
from connectors.core.protocol.runs import Part, RunFacts
from connectors.core.protocol.transactions import SlotPlan
from connectors.core.states import BatchState, CrashPoint, Family

__all__ = ["Coordinator", "Part", "RunFacts", "Steps"]

logger = logging.getLogger(__name__)
T = TypeVar("T")
#: A coordinator's steps: yields commands, receives their results, returns at the end.
Steps = Generator[Command, Any, T]


class Coordinator:
    """The steps of one sink's driver run, for its protocol family.

    Args:
        family, sink_id: the sink's (transaction ids of other sinks are never touched).
        run_id: this driver run's id (written into transaction ids and decisions).
        query_id: the query the sink is bound to (recorded with decisions).
        binding, on_replay_mismatch, keep_batches, fingerprint_in_commit: the template's
            options (``binding``: its ``reset_binding`` or ``resume_from``; the last:
            COMMIT_ON_DRIVER's commit observes it).
        metrics: counts (outcome, rows, reconciled, aborted); timings are the executor's.
    """

    def __init__(
        self,
        family: Family,
        sink_id: str,
        *,
        run_id: str,
        query_id: str,
        binding: Binding = BOUND,
        on_replay_mismatch: str = "fail",
        fingerprint_in_commit: bool = False,
        keep_batches: int = 100,
        metrics: BatchMetrics | None = None,
    ) -> None:
        self.family = family
        self.sink_id = sink_id
        self.run_id = run_id
        self.query_id = query_id
        self.binding = binding
        self.on_replay_mismatch = on_replay_mismatch
        self.fingerprint_in_commit = fingerprint_in_commit
        self.keep_batches = keep_batches
        self.metrics = metrics or BatchMetrics(sink_id, -1, family.value)
        #: The one keeper of what this coordinator knows: decisions, transactions, and
        #: the state of each batch it touched.
        self.guard = Guard(family, sink_id, run_id)
        self.recovery = Recovery(sink_id, self.step, self.metrics)

    # ---- the one door every command goes through (also a split batch's: planned.py) ----
    def step(self, command: Command) -> Generator[Command, Any, Any]:
        self.guard.before(command)
        result = yield command
        self.guard.after(command, result)
        return result

    def _crash(self, point: CrashPoint, batch_id: int) -> Steps[None]:
        yield from self.step(Crash(point, batch_id))

    # ---- a whole write: start of the run if needed, the batch, pruning ----
    def write(self, batch_id: int, run: RunFacts) -> Steps[None]:
        """Steps of ``sink.write_batch``: :meth:`open`, the batch, pruning the ledger. When
        any step fails, the run ends (:class:`NewRun`)."""
        try:
            swept = yield from self.open(batch_id, run)
            yield from self.batch(batch_id, swept=swept)
            yield from self.step(Prune(self.keep_batches))
        except GeneratorExit:
            raise
        except BaseException:
            yield from self.step(NewRun())
            raise

    def open(self, batch_id: int, run: RunFacts,
             adopt: Sequence[LedgerEntry] = ()) -> Steps[bool]:
        """Before a batch: the run's start when ``run`` has not started for this query
        (``adopt``: see :meth:`start`), then the batch-id check. Returns whether nothing
        of this sink can be prepared that a sweep did not settle (:class:`RunFacts`)."""
        swept = run.swept
        if not run.started or run.query_id != self.query_id:
            yield from self.start(batch_id, adopt)
            swept = True
        last = cast("int | None", (yield from self.step(LastBatchId())))
        if last is not None and batch_id < last:
            raise went_backwards(self.sink_id, batch_id, last)
        return swept

    def start(self, batch_id: int, adopt: Sequence[LedgerEntry] = ()) -> Steps[int]:
        """RECONCILING, the start of a driver run at batch ``batch_id``: open the run,
        record ``adopt`` (this sink's parts of a fan-out's decisions, so that they are
        finished, not swept), settle what earlier runs left (finish decided batches, roll
        back undecided transactions, fence slots), then bind to the query. Returns the
        binding's generation."""
        logger.info("sink %s: RECONCILING (run %s, query %s)", self.sink_id, self.run_id,
                    self.query_id)
        yield from self.step(OpenRun(self.run_id, batch_id))
        for entry in adopt:
            yield from self.step(AdoptDecision(entry))
        yield from self.reconcile()
        generation = yield from self.step(BindQuery(self.query_id, self.binding))
        return cast("int", generation)

    def reconcile(self) -> Steps[None]:
        """Settle what earlier runs left: finish decided batches and sweep (PREPARE_IN_TASK),
        fence every slot (COMMIT_IN_TASK); COMMIT_ON_DRIVER leaves nothing prepared."""
        if self.family is Family.PREPARE_IN_TASK:
            yield from self.recovery.finish_unfinished()
            yield from self.recovery.sweep()
        elif self.family is Family.COMMIT_IN_TASK:
            self.metrics.reconciled += cast("int", (yield from self.step(FenceAll())))

    def settle(
        self,
        transactions: Sequence[str],
        *,
        commit_decided: bool,
        abort_undecided: bool,
        keep: frozenset[str] = frozenset(),
        adopt: Sequence[LedgerEntry] = (),
    ) -> Steps[Settled]:
        """``connectors recover``, an operator's recovery: the steps a driver's start runs,
        with the operator's choices. PREPARE_IN_TASK: record ``adopt`` (as :meth:`start`),
        finish the decided batches (``commit_decided``), then sweep ``transactions``
        (those in ``keep`` are left). COMMIT_IN_TASK: fence every slot (``abort_undecided``)."""
        for entry in adopt:
            yield from self.step(AdoptDecision(entry))
        if self.family is Family.COMMIT_IN_TASK:
            if abort_undecided:
                yield from self.reconcile()
            return Settled()
        return (yield from self.recovery.settle(transactions, commit_decided=commit_decided,
                                                abort_undecided=abort_undecided, keep=keep))

    def batch(self, batch_id: int, *, swept: bool = False) -> Steps[None]:
        """The steps of one batch, for the sink's family (``swept``: see
        :class:`RunFacts`): :meth:`prepare`, then :meth:`complete`."""
        part = yield from self.prepare(batch_id, swept=swept)
        if not part.done:
            yield from self.complete(part)

    def prepare(self, batch_id: int, *, swept: bool = False) -> Steps[Part]:
        """The first half of a batch; nothing of it is visible after it. A replay the ledger
        has is finished here (``done``); else PREPARE_IN_TASK prepares its transactions,
        COMMIT_IN_TASK plans its slots and checks every record, COMMIT_ON_DRIVER checks the
        batch and asks the target for it (``done`` when it has it)."""
        self.metrics.batch_id = batch_id
        entry = cast("LedgerEntry | None", (yield from self.step(ReadDecision(batch_id))))
        if entry is not None:
            yield from self._replay(entry)
            self.metrics.outcome = "replayed"
            return Part(batch_id, done=True)
        if self.family is Family.PREPARE_IN_TASK:
            return (yield from self._prepare_transactions(batch_id, swept))
        if self.family is Family.COMMIT_IN_TASK:
            return (yield from self._plan_slots(batch_id))
        return (yield from self._check_driver_batch(batch_id))

    def complete(self, part: Part) -> Steps[None]:
        """The second half: decide and commit (PREPARE_IN_TASK), run the slots, which commit
        in their tasks (COMMIT_IN_TASK), commit on the driver (COMMIT_ON_DRIVER)."""
        if self.family is Family.PREPARE_IN_TASK:
            yield from self._decide_and_commit(part)
        elif self.family is Family.COMMIT_IN_TASK:
            yield from self._run_slots(part)
        else:
            yield from self._commit_driver_batch(part)

    def abandon(self, part: Part) -> Steps[None]:
        """A part that will not be decided (a fan-out's other target refused the batch):
        roll back its prepared transactions now (best effort: else the next sweep)."""
        for commit in part.commits:
            yield from self.step(Abort(part.batch_id, commit.transaction_id, quiet=True))

    def _replay(self, entry: LedgerEntry) -> Steps[None]:
        """A batch the ledger has: check the replay holds the recorded rows; finish the
        commits of a decision (PREPARE_IN_TASK); write nothing."""
        actual = cast("Fingerprint | None", (yield from self.step(InputFingerprint())))
        recorded = entry.fingerprint
        if self.family is Family.COMMIT_ON_DRIVER and recorded is None and actual is not None:
            # Recorded without one: the sink recomputes it from what the target holds.
            recorded = yield from self.step(CommittedFingerprint(entry.batch_id))
        check_replay(self.sink_id, self.on_replay_mismatch, entry.batch_id, recorded, actual)
        if entry.state is BatchState.DECIDED:
            yield from self.recovery.finish(entry)

    # ---- PREPARE_IN_TASK ----
    def _prepare_transactions(self, batch_id: int, swept: bool) -> Steps[Part]:
        if not swept:  # a losing attempt of an earlier batch may have prepared since
            yield from self.recovery.sweep()
        yield from self.step(PlanInput(batch_id))
        yield from self._crash(CrashPoint.BEFORE_TASKS, batch_id)
        try:
            outcomes = cast("Sequence[TaskOutcome]", (yield from self.step(RunTasks(batch_id))))
        except Exception:
            # Interrupted before the decision (query.stop(), a cancelled job) or failed:
            # roll back what the tasks prepared now, not at the next start (a query
            # stopped for good has no next start).
            yield from self._roll_back_undecided(batch_id)
            raise
        commits, errors = split_outcomes(self.sink_id, outcomes, batch_id)
        self.metrics.tasks = len(commits) + len(errors)
        if errors:
            for commit in commits:
                yield from self.step(Abort(batch_id, commit.transaction_id, quiet=True))
            raise errors[0]
        return Part(batch_id, commits=tuple(commits),
                    fingerprint=sum((c.fingerprint for c in commits), Fingerprint()))

    def _decide_and_commit(self, part: Part) -> Steps[None]:
        batch_id, commits = part.batch_id, list(part.commits)
        fp = cast("Fingerprint", part.fingerprint)  # prepare sets it
        yield from self._crash(CrashPoint.BEFORE_DECISION, batch_id)
        mine = LedgerEntry(self.sink_id, batch_id, self.run_id, BatchState.DECIDED,
                           tuple(commits), fp, self.query_id)
        decision = cast("LedgerEntry", (yield from self.step(Decide(mine))))
        if decision.run_id != self.run_id:
            # Another driver decided this batch first: ours must never commit.
            logger.warning(
                "sink %s batch %d: decided by run %s, not this run %s; aborting this run's "
                "transactions", self.sink_id, batch_id, decision.run_id, self.run_id,
            )
            for commit in commits:
                yield from self.step(Abort(batch_id, commit.transaction_id))
            check_replay(self.sink_id, self.on_replay_mismatch, batch_id,
                         decision.fingerprint, fp)
            if decision.state is BatchState.DECIDED:
                yield from self.recovery.finish(decision)
            self.metrics.outcome = "replayed"
            return
        yield from self._crash(CrashPoint.AFTER_DECISION, batch_id)
        yield from self.recovery.finish(decision)
        self.metrics.rows, self.metrics.bytes = fp.rows, sum(c.nbytes for c in commits)
        self.metrics.outcome = "committed"
        # Losing attempts (retries, speculation) of this batch; once every attempt ended,
        # nothing can prepare after this sweep and the next batch need not sweep again.
        ended = cast("bool", (yield from self.step(TasksEnded(batch_id))))
        yield from self.recovery.sweep()
        yield from self.step(NoteSwept(ended))
        yield from self._crash(CrashPoint.AFTER_COMMIT, batch_id)

    def _roll_back_undecided(self, batch_id: int) -> Steps[None]:
        """After the tasks of ``batch_id`` failed: the sweep (roll back every undecided
        transaction of this sink). Best effort: when it fails, the next start's sweep does
        it, and the tasks' own error is the one raised."""
        try:
            yield from self.recovery.sweep()
        except Exception as exc:
            logger.warning("sink %s batch %d: rolling back after the tasks failed did not "
                           "finish (%s); the next start does it", self.sink_id, batch_id,
                           type(exc).__name__)

    # ---- COMMIT_IN_TASK ----
    def _plan_slots(self, batch_id: int) -> Steps[Part]:
        plan = cast("SlotPlan", (yield from self.step(PlanSlots(batch_id))))
        if plan.record:
            yield from self.step(RecordSlots(batch_id, plan))
        slots = cast("int", (yield from self.step(PlanInput(batch_id))))
        return Part(batch_id, slots=slots)

    def _run_slots(self, part: Part) -> Steps[None]:
        batch_id, slots = part.batch_id, part.slots
        yield from self._crash(CrashPoint.BEFORE_TASKS, batch_id)
        try:
            outcomes = cast("Sequence[TaskOutcome]", (yield from self.step(RunTasks(batch_id))))
        except BaseException:
            yield from self.step(FenceAll())
            raise
        commits, errors = split_outcomes(self.sink_id, outcomes, batch_id)
        self.metrics.tasks = len(commits) + len(errors)
        if errors:
            yield from self.step(FenceAll())
            raise errors[0]
        if sorted(c.partition for c in commits) != list(range(slots)):
            raise ProtocolStateError(
                f"expected one result per slot 0..{slots - 1}, got partitions "
                f"{[c.partition for c in commits]}", sink_id=self.sink_id, batch_id=batch_id)
        yield from self._crash(CrashPoint.BEFORE_DECISION, batch_id)
        fp = sum((c.fingerprint for c in commits), Fingerprint())
        done = LedgerEntry(self.sink_id, batch_id, self.run_id, BatchState.COMMITTED,
                           tuple(commits), fp, self.query_id)
        recorded = cast("LedgerEntry", (yield from self.step(Decide(done))))
        check_replay(self.sink_id, self.on_replay_mismatch, batch_id, recorded.fingerprint, fp)
        written = [c for c in commits if not c.replayed]
        self.metrics.rows = sum(c.fingerprint.rows for c in written)
        self.metrics.bytes = sum(c.nbytes for c in written)
        self.metrics.outcome = "committed" if written else "replayed"
        yield from self._crash(CrashPoint.AFTER_COMMIT, batch_id)

    # ---- COMMIT_ON_DRIVER ----
    def _check_driver_batch(self, batch_id: int) -> Steps[Part]:
        yield from self.step(PlanInput(batch_id))
        yield from self._crash(CrashPoint.BEFORE_TASKS, batch_id)
        fp: Fingerprint | None = None
        if not self.fingerprint_in_commit:  # a sink that observes it in its write skips it
            fp = yield from self.step(InputFingerprint())
        record = LedgerEntry(self.sink_id, batch_id, self.run_id, BatchState.COMMITTED, (),
                             fp, self.query_id)
        if (yield from self.step(TargetHasBatch(batch_id))):
            logger.info("sink %s batch %d: RECONCILING: the target has the batch, recording it",
                        self.sink_id, batch_id)
            yield from self.step(Decide(record))
            self.metrics.outcome, self.metrics.reconciled = "replayed", 1
            return Part(batch_id, done=True)
        return Part(batch_id, fingerprint=fp, record=record)

    def _commit_driver_batch(self, part: Part) -> Steps[None]:
        batch_id, fp = part.batch_id, part.fingerprint
        record = cast("LedgerEntry", part.record)  # prepare sets it
        yield from self._crash(CrashPoint.BEFORE_DECISION, batch_id)
        yield from self.step(RecordIntent(batch_id))
        observed = cast("Fingerprint | None", (yield from self.step(CommitBatch(batch_id))))
        if observed is not None:
            fp = observed
            record = dataclasses.replace(record, fingerprint=fp)
        yield from self._crash(CrashPoint.AFTER_DECISION, batch_id)
        yield from self.step(Decide(record))
        self.metrics.rows = fp.rows if fp else 0
        self.metrics.outcome = "committed"
        yield from self._crash(CrashPoint.AFTER_COMMIT, batch_id)
