"""A fan-out's program: every target prepared, one decision, every target completed
(docs/fan-out.md), as commands, like one sink's coordinator (sans-I/O).

:class:`FanOutProgram` is no second coordinator: it composes its targets' coordinators. A
target's steps are its family's (:meth:`Coordinator.prepare
<connectors.core.protocol.coordinator.Coordinator.prepare>`,
:meth:`~connectors.core.protocol.coordinator.Coordinator.complete`), each command checked by that
target's guard and yielded wrapped in :class:`~connectors.core.protocol.commands.ForTarget`; the
executor performs it with the target's performer. The fan-out's own steps (its run's start,
reading and recording its decision, marking the batch committed, pruning, its crash points)
are commands of its own sink id, checked by its own :class:`~connectors.core.protocol.guard.Guard`.
So the decision is a :class:`~connectors.core.protocol.commands.Decide` like a sink's, performed by
the one rule for an ambiguous write (:meth:`Executor._decide
<connectors.core.driver.executor.Executor>`): after a failed decision nothing is rolled back, and
the next run's start finishes the batch (decided) or sweeps it (not decided).

The decision is a :class:`~connectors.core.ledgers.ledger.LedgerEntry` of the fan-out's sink id
listing every part: a prepared target's transactions, and a marker per other target. A
run's start copies each prepared target's part of a decided, unfinished batch into that
target's ledger (:class:`~connectors.core.protocol.commands.AdoptDecision`) before the target
sweeps, so decided transactions are committed and undecided ones rolled back.

Crash points are the template's, armed for the fan-out's sink id: ``before_decision``
(every target prepared or checked, no decision), ``after_decision`` (the decision durable,
nothing committed), ``between_commits`` (a target committed, a later one not yet),
``after_commit`` (every target has the batch, the decision not yet marked).
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, cast

from connectors.core.errors import ProtocolStateError, QueryBindingError, TransientError
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers.ledger import LedgerEntry, TaskCommit
from connectors.core.naming import TransactionId
from connectors.core.policies.binding import BOUND, Binding
from connectors.core.protocol.commands import (
    Abort,
    AwaitChecks,
    BindQuery,
    CheckInput,
    Command,
    Commit,
    Crash,
    Decide,
    ForTarget,
    MarkCommitted,
    NewRun,
    OpenRun,
    Prune,
    ReadDecision,
    ReadUnfinished,
    TargetFinished,
)
from connectors.core.protocol.coordinator import Coordinator, Steps
from connectors.core.protocol.guard import Guard
from connectors.core.protocol.runs import Part, RunFacts
from connectors.core.states import BatchState, CrashPoint, Family

__all__ = ["TARGET_PREFIX", "FanOutProgram", "FanOutTarget", "parts_of"]

logger = logging.getLogger(__name__)

#: How a decision names a target that prepares nothing (it commits afterwards).
TARGET_PREFIX = "target:"


def _marker(sink_id: str, part: Part) -> TaskCommit:
    """The decision's entry for a target that prepares nothing (it commits afterwards)."""
    return TaskCommit(f"{TARGET_PREFIX}{sink_id}", -1, -1, part.fingerprint or Fingerprint())


def parts_of(decision: LedgerEntry, sink_id: str) -> LedgerEntry | None:
    """``sink_id``'s part of a fan-out's decision, as that target's own decision (its
    transactions, their run and fingerprint), or ``None`` when it prepared nothing."""
    mine = []
    for commit in decision.commits:
        parsed = TransactionId.parse(commit.transaction_id)
        if parsed is not None and parsed.belongs_to(sink_id):
            mine.append((parsed, commit))
    if not mine:
        return None
    runs = {parsed.run_id for parsed, _ in mine}
    if len(runs) != 1:
        raise ProtocolStateError(f"the fan-out's decision of batch {decision.batch_id} lists "
                                 f"transactions of {sorted(runs)} for {sink_id}",
                                 sink_id=sink_id, batch_id=decision.batch_id)
    commits = tuple(c for _, c in mine)
    return LedgerEntry(sink_id, decision.batch_id, runs.pop(), BatchState.DECIDED, commits,
                       sum((c.fingerprint for c in commits), Fingerprint()),
                       decision.query_id)


@dataclass(frozen=True)
class FanOutTarget:
    """One target in one attempt: its coordinator (its run, its guard) and what its run
    knows before the batch."""

    sink_id: str
    family: Family
    coordinator: Coordinator
    facts: RunFacts
    keep_batches: int

    @property
    def prepares(self) -> bool:
        return self.family is Family.PREPARE_IN_TASK


class FanOutProgram:
    """The steps of one attempt of a fan-out's batch (see the module docstring).

    Args:
        sink_id: the fan-out's (its decisions' key).
        run_id, query_id: the fan-out's run and the query it binds.
        facts: what the fan-out's run knows before the batch.
        targets: in commit order.
        binding: the fan-out's ``reset_binding`` or ``resume_from``.
    """

    def __init__(self, sink_id: str, *, run_id: str, query_id: str, facts: RunFacts,
                 targets: Sequence[FanOutTarget], binding: Binding = BOUND) -> None:
        self.sink_id = sink_id
        self.run_id = run_id
        self.query_id = query_id
        self.facts = facts
        self.targets = list(targets)
        self.binding = binding
        self.guard = Guard(Family.PREPARE_IN_TASK, sink_id, run_id)

    # ---- the doors: the fan-out's own commands, and a target's ----
    def step(self, command: Command) -> Generator[Command, Any, Any]:
        self.guard.before(command)
        result = yield command
        self.guard.after(command, result)
        return result

    def on(self, target: FanOutTarget, steps: Generator[Command, Any, Any]
           ) -> Generator[Command, Any, Any]:
        """Run a target's ``steps`` (each command already passed its guard), wrapped for
        the executor; the fan-out's guard learns what the target committed or rolled
        back (its decision must never list a rolled-back transaction)."""
        result: Any = None
        error: BaseException | None = None
        while True:
            try:
                command = steps.throw(error) if error is not None else steps.send(result)
            except StopIteration as stop:
                return stop.value
            error = None
            try:
                result = yield ForTarget(target.sink_id, command)
            except GeneratorExit:
                steps.close()
                raise
            except BaseException as exc:
                result, error = None, exc
                continue
            if isinstance(command, Commit | Abort):
                self.guard.after(command, result)

    def _crash(self, point: CrashPoint, batch_id: int) -> Steps[None]:
        yield from self.step(Crash(point, batch_id))

    # ---- the attempt ----
    def write(self, batch_id: int) -> Steps[None]:
        """Write the batch into every target under one decision; when any step fails,
        every run (the fan-out's and each target's) ends, and the next attempt starts them
        again."""
        try:
            yield from self._batch(batch_id)
        except GeneratorExit:
            raise
        except BaseException:
            yield from self.step(NewRun())
            for target in self.targets:
                yield from self.on(target, target.coordinator.step(NewRun()))
            raise

    def _batch(self, batch_id: int) -> Steps[None]:
        adopt = yield from self._open(batch_id)
        swept = []
        for target in self.targets:
            swept.append((yield from self.on(target, target.coordinator.open(
                batch_id, target.facts, adopt.get(target.sink_id, ())))))
        decided = cast("LedgerEntry | None", (yield from self.step(ReadDecision(batch_id))))
        parts = yield from self._prepare(batch_id, swept, check=decided is None)
        if decided is None:
            decided = yield from self._decide(batch_id, parts)
        else:
            yield from self._check_replay(decided, parts)
        first = True
        for target, part in zip(self.targets, parts, strict=True):
            if not part.done:
                if not first:
                    yield from self._crash(CrashPoint.BETWEEN_COMMITS, batch_id)
                yield from self.on(target, target.coordinator.complete(part))
                first = False
            self.guard.completed(self._listed(decided, target))
            yield from self.step(TargetFinished(target.sink_id))
        if decided.state is not BatchState.COMMITTED:
            yield from self.step(MarkCommitted(batch_id))
        yield from self._crash(CrashPoint.AFTER_COMMIT, batch_id)
        yield from self.step(Prune(min(t.keep_batches for t in self.targets)))
        for target in self.targets:
            yield from self.on(target, target.coordinator.step(Prune(target.keep_batches)))

    @staticmethod
    def _listed(decision: LedgerEntry, target: FanOutTarget) -> set[str]:
        """The entries of ``decision`` that are ``target``'s part."""
        marker = f"{TARGET_PREFIX}{target.sink_id}"
        found = set()
        for commit in decision.commits:
            parsed = TransactionId.parse(commit.transaction_id)
            if commit.transaction_id == marker or (
                    parsed is not None and parsed.belongs_to(target.sink_id)):
                found.add(commit.transaction_id)
        return found

    def _open(self, batch_id: int) -> Steps[dict[str, tuple[LedgerEntry, ...]]]:
        """The fan-out's run start when due: its unfinished decisions, split into the
        prepared targets' parts to adopt; the binding to the query."""
        if self.facts.started and self.facts.query_id == self.query_id:
            return {}
        yield from self.step(OpenRun(self.run_id, batch_id))
        unfinished = cast("list[LedgerEntry]", (yield from self.step(ReadUnfinished())))
        adopt: dict[str, list[LedgerEntry]] = {}
        for decision in unfinished:
            if decision.batch_id != batch_id:
                raise QueryBindingError(
                    f"batch {decision.batch_id} of fan-out {self.sink_id} is decided but not "
                    f"in every target yet, and batch {batch_id} came instead: run batch "
                    f"{decision.batch_id} again (the query's checkpoint; a batch job's run id)",
                    sink_id=self.sink_id, batch_id=batch_id)
            for target in self.targets:
                part = parts_of(decision, target.sink_id) if target.prepares else None
                if part is not None:
                    adopt.setdefault(target.sink_id, []).append(part)
        yield from self.step(BindQuery(self.query_id, self.binding))
        return {sink_id: tuple(parts) for sink_id, parts in adopt.items()}

    def _prepare(self, batch_id: int, swept: Sequence[bool], *, check: bool
                 ) -> Steps[list[Part]]:
        """Every target's first half; with ``check``, the checks of the targets that
        commit after the decision. Those targets are planned first (nothing visible: a
        schema check, slots planned in their own ledger), and their checks, read-only
        jobs, run beside the prepared targets' tasks. Any failure abandons every prepared
        part (no decision was attempted)."""
        n = len(self.targets)
        parts: list[Part | None] = [None] * n
        later = [i for i in range(n) if not self.targets[i].prepares]
        checks: list[Future[None]] = []
        try:
            for i in [*later, *(i for i in range(n) if i not in later)]:
                target = self.targets[i]
                part = parts[i] = yield from self.on(
                    target, target.coordinator.prepare(batch_id, swept=swept[i]))
                if check and i in later and not part.done:
                    checks.append((yield from self.on(
                        target, target.coordinator.step(CheckInput(batch_id)))))
            yield from self.step(AwaitChecks(tuple(checks)))
        except GeneratorExit:
            raise
        except BaseException:
            yield from self._abandon(parts)
            raise
        return [part for part in parts if part is not None]

    def _decide(self, batch_id: int, parts: Sequence[Part]) -> Steps[LedgerEntry]:
        yield from self._crash(CrashPoint.BEFORE_DECISION, batch_id)
        commits: list[TaskCommit] = []
        for target, part in zip(self.targets, parts, strict=True):
            commits.extend(part.commits if target.prepares else (_marker(target.sink_id, part),))
        self.guard.accept(batch_id, frozenset(c.transaction_id for c in commits))
        mine = LedgerEntry(self.sink_id, batch_id, self.run_id, BatchState.DECIDED,
                           tuple(commits), None, self.query_id)
        # One rule for an ambiguous decision: a failure here rolls nothing back.
        decided = cast("LedgerEntry", (yield from self.step(Decide(mine))))
        if decided.run_id != self.run_id:
            yield from self._abandon(parts)  # another run decided: ours are not listed
            raise TransientError(
                f"batch {batch_id} of fan-out {self.sink_id} was decided by run "
                f"{decided.run_id}, not this run: it runs again as a new run, which finishes "
                "that decision", sink_id=self.sink_id, batch_id=batch_id)
        yield from self._crash(CrashPoint.AFTER_DECISION, batch_id)
        logger.info("fan-out %s batch %d: decided for %d target(s)", self.sink_id, batch_id,
                    len(self.targets))
        return decided

    def _check_replay(self, decided: LedgerEntry, parts: Sequence[Part]) -> Steps[None]:
        """A batch decided earlier: each prepared target found its adopted decision (its
        replay check ran); a prepared target that prepared again would be a second copy."""
        for target, part in zip(self.targets, parts, strict=True):
            if target.prepares and not part.done:
                yield from self._abandon(parts)
                raise ProtocolStateError(
                    f"batch {decided.batch_id} of fan-out {self.sink_id} is decided, but "
                    f"target {target.sink_id} prepared it again instead of finishing its "
                    "part", sink_id=self.sink_id, batch_id=decided.batch_id)

    def _abandon(self, parts: Sequence[Part | None]) -> Steps[None]:
        """Roll back the prepared parts of a batch that this run will not decide (best
        effort: else the next start's sweep)."""
        for target, part in zip(self.targets, parts, strict=False):
            if part is not None and not part.done and part.commits:
                try:
                    yield from self.on(target, target.coordinator.abandon(part))
                except Exception as exc:
                    logger.warning("fan-out %s: rolling back %s's prepared part failed (%s)",
                                   self.sink_id, target.sink_id, type(exc).__name__)
