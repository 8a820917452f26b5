"""The coordinator: every protocol step of a batch, in order, as commands (sans-I/O).

The coordinator does no I/O. Like psycopg's generators, it *yields* a command (read the
decision, run the tasks, decide, commit one transaction, crash point, ...) and receives
its result; an executor (:mod:`connectors.core.executor`) performs each command against
the ledger, the engine and the sink's hooks. So the order of the steps, for all three
protocol families and for recovery after a restart, is written once, here, and nowhere
else; and every command passes one guard (:class:`Guard`) *before* it is yielded: a
commit without a durable decision listing it, an abort of a decided transaction, a
second decision with other committables, a batch recorded committed before all of its
transactions are: each raises :class:`~connectors.core.errors.ProtocolStateError`
before the side effect could happen.

Crash points are commands too (:class:`Crash`): the list of crash points is the list of
places where the coordinator yields one (task-side points are the tasks' own, in
:mod:`connectors.core.tasks`). Recovery is not a second code path: the start of a driver
run (:meth:`Coordinator.start`) finishes the ledger's unfinished decisions with the same
:meth:`Coordinator.finish` a batch uses, and settles stray transactions with the same
:meth:`Coordinator.sweep` that runs before and after every batch.

Example, driving a coordinator by hand (what the executor does)::

    >>> from connectors.core.coordinator import Coordinator, ReadDecision, LastBatchId
    >>> c = Coordinator(Family.COMMIT_ON_DRIVER, "events", run_id="r1", query_id="q")
    >>> steps = c.write(0, start=False)
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
from connectors.core.errors import ProtocolStateError, QueryBindingError
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledger import LedgerEntry
from connectors.core.metrics import BatchMetrics
from connectors.core.naming import TransactionId
from connectors.core.protocol import BatchProtocol, BatchState, CrashPoint, Family
from connectors.core.rules import Guard, check_replay, split_outcomes
from connectors.core.steps import (
    Abort,
    BindQuery,
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
    OpenRun,
    PrepareInput,
    Prune,
    ReadDecision,
    ReadUnfinished,
    RunTasks,
    TargetHasBatch,
)

__all__ = ["Coordinator", "Steps"]

logger = logging.getLogger(__name__)
T = TypeVar("T")
#: A coordinator's steps: yields commands, receives their results, returns at the end.
Steps = Generator[Command, Any, T]


class Coordinator:
    """The steps of one sink's driver run, for its protocol family.

    Args:
        family: the sink's protocol family.
        sink_id: the sink's id (transaction ids of other sinks are never touched).
        run_id: this driver run's id (written into transaction ids and decisions).
        query_id: the query the sink is bound to (recorded with decisions).
        reset_binding: bind to a new query, forgetting the ledger.
        on_replay_mismatch: ``"fail"`` or ``"warn"``, see the template.
        fingerprint_in_commit: COMMIT_ON_DRIVER: the commit observes the fingerprint.
        keep_batches: decisions kept in the ledger.
        metrics: counts (outcome, rows, reconciled, aborted) go here; timings are the
            executor's.
    """

    def __init__(
        self,
        family: Family,
        sink_id: str,
        *,
        run_id: str,
        query_id: str,
        reset_binding: bool = False,
        on_replay_mismatch: str = "fail",
        fingerprint_in_commit: bool = False,
        keep_batches: int = 100,
        metrics: BatchMetrics | None = None,
    ) -> None:
        self.family = family
        self.sink_id = sink_id
        self.run_id = run_id
        self.query_id = query_id
        self.reset_binding = reset_binding
        self.on_replay_mismatch = on_replay_mismatch
        self.fingerprint_in_commit = fingerprint_in_commit
        self.keep_batches = keep_batches
        self.metrics = metrics or BatchMetrics(sink_id, -1, family.value)
        self.guard = Guard(family, sink_id, run_id)

    # ---- the one door every command goes through ----
    def _do(self, command: Command) -> Generator[Command, Any, Any]:
        self.guard.before(command)
        result = yield command
        self.guard.after(command, result)
        return result

    def _crash(self, point: CrashPoint, batch_id: int) -> Steps[None]:
        yield from self._do(Crash(point, batch_id))

    # ---- a whole write: start of the run if needed, the batch, pruning ----
    def write(self, batch_id: int, *, start: bool) -> Steps[None]:
        """Steps of ``sink.write_batch``: the run's start (if ``start``), the batch-id
        check, the batch, then pruning the ledger."""
        if start:
            yield from self.start()
        last = cast("int | None", (yield from self._do(LastBatchId())))
        if last is not None and batch_id < last:
            raise QueryBindingError(
                f"batch id went backwards: got {batch_id}, but batch {last} is already "
                "decided. Spark only replays the last batch; this is another query or a "
                "reused run id. Use the original checkpoint or a new sink_id; "
                "reset_binding=True forgets the ledger, and rows the new query reads "
                "again are then written again (duplicates)",
                sink_id=self.sink_id,
                batch_id=batch_id,
            )
        yield from self.batch(batch_id)
        yield from self._do(Prune(self.keep_batches))

    def start(self) -> Steps[int]:
        """RECONCILING, the start of a driver run: open the run, settle what earlier runs
        left (finish decided batches, roll back undecided transactions, fence slots),
        then bind to the query. Returns the binding's generation."""
        logger.info("sink %s: RECONCILING (run %s, query %s)", self.sink_id, self.run_id,
                    self.query_id)
        yield from self._do(OpenRun(self.run_id))
        if self.family is Family.PREPARE_IN_TASK:
            for entry in cast("Sequence[LedgerEntry]", (yield from self._do(ReadUnfinished()))):
                logger.info(
                    "sink %s: RECONCILING batch %d: committing %d decided transaction(s)",
                    self.sink_id, entry.batch_id, len(entry.commits),
                )
                yield from self.finish(entry)
                self.metrics.reconciled += len(entry.commits)
            yield from self.sweep()
        elif self.family is Family.COMMIT_IN_TASK:
            self.metrics.reconciled += cast("int", (yield from self._do(FenceAll())))
        # COMMIT_ON_DRIVER: the target's commit is the decision; nothing stays prepared.
        generation = yield from self._do(BindQuery(self.query_id, self.reset_binding))
        return cast("int", generation)

    def batch(self, batch_id: int) -> Steps[None]:
        """The steps of one batch, for the sink's family."""
        self.metrics.batch_id = batch_id
        entry = cast("LedgerEntry | None", (yield from self._do(ReadDecision(batch_id))))
        if entry is not None:
            yield from self._replay(entry)
            self.metrics.outcome = "replayed"
            return
        if self.family is Family.PREPARE_IN_TASK:
            yield from self._prepared_batch(batch_id)
        elif self.family is Family.COMMIT_IN_TASK:
            yield from self._slot_batch(batch_id)
        else:
            yield from self._driver_batch(batch_id)

    # ---- shared pieces: replay, finish, sweep ----
    def _replay(self, entry: LedgerEntry) -> Steps[None]:
        """A batch the ledger has: check the replay holds the recorded rows; finish the
        commits of a decision (PREPARE_IN_TASK); write nothing."""
        actual = cast("Fingerprint | None", (yield from self._do(InputFingerprint())))
        recorded = entry.fingerprint
        if self.family is Family.COMMIT_ON_DRIVER and recorded is None and actual is not None:
            # Recorded without one: the sink recomputes it from what the target holds.
            recorded = yield from self._do(CommittedFingerprint(entry.batch_id))
        check_replay(self.sink_id, self.on_replay_mismatch, entry.batch_id, recorded, actual)
        if entry.state is BatchState.DECIDED:
            yield from self.finish(entry)

    def finish(self, entry: LedgerEntry) -> Steps[None]:
        """Commit every transaction of a durable decision, then record the batch committed.

        Idempotent: runs again after any crash; the participant proves (never presumes)
        what is already committed."""
        for i, commit in enumerate(entry.commits):
            yield from self._do(Commit(entry.batch_id, commit))
            if i == 0 and len(entry.commits) > 1:
                yield from self._crash(CrashPoint.BETWEEN_COMMITS, entry.batch_id)
        yield from self._do(MarkCommitted(entry.batch_id))

    def sweep(self) -> Steps[None]:
        """Settle every prepared transaction of exactly this sink: commit what a decision
        lists, roll back the rest after forbidding its run's decision (presumed abort)."""
        prepared = cast("Sequence[str]", (yield from self._do(ListPrepared())))
        for raw in prepared:
            tid = TransactionId.parse(raw)
            if tid is None or not tid.belongs_to(self.sink_id):
                continue  # another sink's, or not ours at all: never touched
            entry = yield from self._do(ReadDecision(tid.batch_id))
            if entry is None:
                # No decision: forbid this run's decision first, then roll back.
                entry = yield from self._do(ForbidDecision(tid.batch_id, tid.run_id))
            listed = [c for c in entry.commits if c.transaction_id == raw] if entry else []
            if entry is not None and listed:
                if entry.state is BatchState.DECIDED:
                    yield from self.finish(entry)
                else:  # recorded committed, yet still prepared: commit again (idempotent)
                    yield from self._do(Commit(entry.batch_id, listed[0]))
                self.metrics.reconciled += 1
                continue
            logger.info("sink %s: rolling back undecided transaction %s (batch %d, run %s)",
                        self.sink_id, raw, tid.batch_id, tid.run_id)
            yield from self._do(Abort(tid.batch_id, raw))
            self.metrics.aborted += 1

    def settle(
        self,
        transactions: Sequence[str],
        *,
        commit_decided: bool,
        abort_undecided: bool,
        keep: frozenset[str] = frozenset(),
    ) -> Steps[dict[str, list[str]]]:
        """``connectors recover``, an operator's recovery of a PREPARE_IN_TASK sink:
        finish the decided batches (``commit_decided``), then settle ``transactions``
        (prepared ones of this sink): commit what a decision lists, roll back the rest
        after forbidding its run's decision (``abort_undecided``; never those in
        ``keep``). Returns the ids ``committed``, ``aborted`` and ``left``."""
        done: dict[str, list[str]] = {"committed": [], "aborted": [], "left": []}
        if commit_decided:
            for entry in cast("Sequence[LedgerEntry]", (yield from self._do(ReadUnfinished()))):
                yield from self.finish(entry)
                done["committed"] += [c.transaction_id for c in entry.commits]
        for raw in transactions:
            tid = TransactionId.parse(raw)
            if tid is None or not tid.belongs_to(self.sink_id) or raw in done["committed"]:
                continue
            entry = yield from self._do(ReadDecision(tid.batch_id))
            listed = [c for c in entry.commits if c.transaction_id == raw] if entry else []
            if listed:
                if commit_decided:
                    yield from self._do(Commit(tid.batch_id, listed[0]))
                done["committed" if commit_decided else "left"].append(raw)
                continue
            if not abort_undecided or raw in keep:
                done["left"].append(raw)
                continue
            found = yield from self._do(ForbidDecision(tid.batch_id, tid.run_id))
            if found is not None and raw in {c.transaction_id for c in found.commits}:
                done["left"].append(raw)  # decided meanwhile: never roll it back
                continue
            yield from self._do(Abort(tid.batch_id, raw))
            done["aborted"].append(raw)
        return done

    # ---- PREPARE_IN_TASK ----
    def _prepared_batch(self, batch_id: int) -> Steps[None]:
        protocol = BatchProtocol(self.family, self.sink_id, batch_id)
        yield from self.sweep()
        yield from self._do(PrepareInput(batch_id))
        yield from self._crash(CrashPoint.BEFORE_TASKS, batch_id)
        try:
            outcomes = cast("Sequence[TaskOutcome]", (yield from self._do(RunTasks(batch_id))))
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
                yield from self._do(Abort(batch_id, commit.transaction_id, quiet=True))
            protocol.advance(BatchState.ABORTED)
            raise errors[0]
        protocol.advance(BatchState.PREPARED)
        yield from self._crash(CrashPoint.BEFORE_DECISION, batch_id)
        fp = sum((c.fingerprint for c in commits), Fingerprint())
        mine = LedgerEntry(self.sink_id, batch_id, self.run_id, BatchState.DECIDED,
                           tuple(commits), fp, self.query_id)
        decision = cast("LedgerEntry", (yield from self._do(Decide(mine))))
        if decision.run_id != self.run_id:
            # Another driver decided this batch first: ours must never commit.
            logger.warning(
                "sink %s batch %d: decided by run %s, not this run %s; aborting this run's "
                "transactions", self.sink_id, batch_id, decision.run_id, self.run_id,
            )
            for commit in commits:
                yield from self._do(Abort(batch_id, commit.transaction_id))
            check_replay(self.sink_id, self.on_replay_mismatch, batch_id,
                         decision.fingerprint, fp)
            if decision.state is BatchState.DECIDED:
                yield from self.finish(decision)
            self.metrics.outcome = "replayed"
            return
        protocol.advance(BatchState.DECIDED)
        yield from self._crash(CrashPoint.AFTER_DECISION, batch_id)
        yield from self.finish(decision)
        protocol.advance(BatchState.COMMITTED)
        self.metrics.rows, self.metrics.bytes = fp.rows, sum(c.nbytes for c in commits)
        self.metrics.outcome = "committed"
        # Losing attempts (retries, speculation) of this batch.
        yield from self.sweep()
        yield from self._crash(CrashPoint.AFTER_COMMIT, batch_id)

    def _roll_back_undecided(self, batch_id: int) -> Steps[None]:
        """After the tasks of ``batch_id`` failed: the sweep (roll back every undecided
        transaction of this sink). Best effort: when it fails, the next start's sweep does
        it, and the tasks' own error is the one raised."""
        try:
            yield from self.sweep()
        except Exception as exc:
            logger.warning("sink %s batch %d: rolling back after the tasks failed did not "
                           "finish (%s); the next start does it", self.sink_id, batch_id,
                           type(exc).__name__)

    # ---- COMMIT_IN_TASK ----
    def _slot_batch(self, batch_id: int) -> Steps[None]:
        protocol = BatchProtocol(self.family, self.sink_id, batch_id)
        slots = cast("int", (yield from self._do(PrepareInput(batch_id))))
        yield from self._crash(CrashPoint.BEFORE_TASKS, batch_id)
        try:
            outcomes = cast("Sequence[TaskOutcome]", (yield from self._do(RunTasks(batch_id))))
        except BaseException:
            yield from self._do(FenceAll())
            raise
        commits, errors = split_outcomes(self.sink_id, outcomes, batch_id)
        self.metrics.tasks = len(commits) + len(errors)
        if errors:
            yield from self._do(FenceAll())
            protocol.advance(BatchState.ABORTED)
            raise errors[0]
        if sorted(c.partition for c in commits) != list(range(slots)):
            raise ProtocolStateError(
                f"expected one result per slot 0..{slots - 1}, got partitions "
                f"{[c.partition for c in commits]}", sink_id=self.sink_id, batch_id=batch_id)
        protocol.advance(BatchState.PREPARED)
        yield from self._crash(CrashPoint.BEFORE_DECISION, batch_id)
        fp = sum((c.fingerprint for c in commits), Fingerprint())
        done = LedgerEntry(self.sink_id, batch_id, self.run_id, BatchState.COMMITTED,
                           tuple(commits), fp, self.query_id)
        recorded = cast("LedgerEntry", (yield from self._do(Decide(done))))
        check_replay(self.sink_id, self.on_replay_mismatch, batch_id, recorded.fingerprint, fp)
        protocol.advance(BatchState.DECIDED)
        protocol.advance(BatchState.COMMITTED)
        written = [c for c in commits if not c.replayed]
        self.metrics.rows = sum(c.fingerprint.rows for c in written)
        self.metrics.bytes = sum(c.nbytes for c in written)
        self.metrics.outcome = "committed" if written else "replayed"
        yield from self._crash(CrashPoint.AFTER_COMMIT, batch_id)

    # ---- COMMIT_ON_DRIVER ----
    def _driver_batch(self, batch_id: int) -> Steps[None]:
        protocol = BatchProtocol(self.family, self.sink_id, batch_id)
        yield from self._do(PrepareInput(batch_id))
        yield from self._crash(CrashPoint.BEFORE_TASKS, batch_id)
        fp: Fingerprint | None = None
        if not self.fingerprint_in_commit:  # a sink that observes it in its write skips it
            fp = yield from self._do(InputFingerprint())
        record = LedgerEntry(self.sink_id, batch_id, self.run_id, BatchState.COMMITTED, (),
                             fp, self.query_id)
        if (yield from self._do(TargetHasBatch(batch_id))):
            logger.info("sink %s batch %d: RECONCILING: the target has the batch, recording it",
                        self.sink_id, batch_id)
            yield from self._do(Decide(record))
            self.metrics.outcome, self.metrics.reconciled = "replayed", 1
            return
        yield from self._crash(CrashPoint.BEFORE_DECISION, batch_id)
        observed = cast("Fingerprint | None", (yield from self._do(CommitBatch(batch_id))))
        if observed is not None:
            fp = observed
            record = dataclasses.replace(record, fingerprint=fp)
        protocol.advance(BatchState.DECIDED)
        yield from self._crash(CrashPoint.AFTER_DECISION, batch_id)
        yield from self._do(Decide(record))
        protocol.advance(BatchState.COMMITTED)
        self.metrics.rows = fp.rows if fp else 0
        self.metrics.outcome = "committed"
        yield from self._crash(CrashPoint.AFTER_COMMIT, batch_id)
