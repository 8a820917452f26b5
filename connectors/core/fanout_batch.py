"""One attempt of a fan-out's batch: every target prepared, one decision, every target
completed (docs/fan-out.md). :class:`~connectors.core.fanout.FanOut` runs it, again as a
new run when it failed with a transient error.

Each target keeps its own coordinator, executor, run and ledger: the steps of a target are
its family's (:meth:`Coordinator.prepare <connectors.core.coordinator.Coordinator.prepare>`
and :meth:`~connectors.core.coordinator.Coordinator.complete`), and its guard checks them.
What this module adds is the order across targets and the fan-out's decision, a
:class:`~connectors.core.ledger.LedgerEntry` of the fan-out's sink id listing every part:
a prepared target's transactions, and a marker per other target. A run's start copies
each prepared target's part of a decided, unfinished batch into that target's ledger
(:class:`~connectors.core.commands.AdoptDecision`) before the target sweeps, so decided
transactions are committed and undecided ones rolled back.

Crash points are the template's, armed for the fan-out's sink id: ``before_decision``
(every target prepared or checked, no decision), ``after_decision`` (the decision durable,
nothing committed), ``between_commits`` (a target committed, a later one not yet),
``after_commit`` (every target has the batch, the decision not yet marked).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from connectors.core.batch import BatchInput
from connectors.core.coordinator import Coordinator
from connectors.core.crash import crash_point
from connectors.core.errors import (
    ConnectorError,
    ProtocolStateError,
    QueryBindingError,
    TransientError,
)
from connectors.core.executor import DriverState, Executor
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledger import Ledger, LedgerEntry, TaskCommit
from connectors.core.metrics import BatchMetrics
from connectors.core.naming import TransactionId
from connectors.core.protocol import BatchState, CrashPoint, Family
from connectors.core.retry import RetryPolicy, call_with_retry
from connectors.core.runs import Part

if TYPE_CHECKING:
    from connectors.core.template import TwoPhaseCommitSink

__all__ = ["TARGET_PREFIX", "FanOutBatch", "parts_of"]

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


class _Target:
    """One target in one attempt: its sink, run, coordinator and executor."""

    def __init__(self, sink: TwoPhaseCommitSink, batch: BatchInput, query_id: str,
                 metrics: BatchMetrics) -> None:
        self.sink = sink
        self.state: DriverState = sink._driver_state()
        self.coordinator: Coordinator = sink._coordinator(self.state.run_id, query_id, metrics)
        self.executor = Executor(sink, self.state, metrics, batch)

    def check_input(self, part: Part) -> None:
        """The target's checks of what it would refuse only while committing, run now,
        before the decision (:meth:`TwoPhaseCommitSink.check_input`)."""
        batch = self.executor.batch
        if self.sink.family is Family.PREPARE_IN_TASK or part.done or batch is None:
            return
        sink = self.sink
        started = time.monotonic()
        try:
            sink.check_input(batch, self.state.context(sink.sink_id, part.batch_id, batch))
        except ConnectorError as exc:
            if exc.sink_id is None:
                exc.sink_id = sink.sink_id
            raise
        finally:
            self.executor.metrics.extra["check_ms"] = round(
                (time.monotonic() - started) * 1000, 1)

    def run(self, steps: Any) -> Any:
        """Perform ``steps``; an error that names no sink names this target."""
        try:
            return self.executor.run(steps)
        except ConnectorError as exc:
            if exc.sink_id is None:
                exc.sink_id = self.sink.sink_id
            raise


class FanOutBatch:
    """One attempt of batch ``batch_id`` into ``sinks`` (in commit order), deciding in the
    fan-out's ``state`` (its ledger and run); ``finished(sink)`` once a target has the
    batch (its figures are final)."""

    def __init__(self, sink_id: str, state: DriverState, sinks: Sequence[TwoPhaseCommitSink],
                 inputs: Mapping[str, BatchInput], query_id: str,
                 metrics: Mapping[str, BatchMetrics], *, retry: RetryPolicy,
                 reset_binding: bool = False,
                 finished: Callable[[TwoPhaseCommitSink], None] = lambda _sink: None) -> None:
        self.sink_id = sink_id
        self.finished = finished
        self.state = state
        self.query_id = query_id
        self.retry = retry
        self.reset_binding = reset_binding
        self.targets = [_Target(s, inputs[s.sink_id], query_id, metrics[s.sink_id])
                        for s in sinks]

    # ---- the fan-out's own ledger ----
    @property
    def ledger(self) -> Ledger:
        return self.state.ledger

    def _retried(self, fn: Callable[[], Any], doing: str, batch_id: int) -> Any:
        return call_with_retry(fn, policy=self.retry, description=doing,
                               sink_id=self.sink_id, batch_id=batch_id)

    def _crash(self, point: CrashPoint, batch_id: int) -> None:
        crash_point(point, sink_id=self.sink_id, batch_id=batch_id)

    # ---- the attempt ----
    def run(self, batch_id: int) -> None:
        """Write the batch into every target under one decision; on any failure every run
        (the fan-out's and each target's) ends, and the next attempt starts them again."""
        try:
            self._run(batch_id)
        except BaseException:
            self.state.new_run()
            for target in self.targets:
                target.state.new_run()
            raise

    def _run(self, batch_id: int) -> None:
        adopt = self._open(batch_id)
        swept = [t.run(t.coordinator.open(batch_id, t.state.facts(), adopt.get(t.sink.sink_id,
                                                                                ())))
                 for t in self.targets]
        decided = self._retried(lambda: self.ledger.get(batch_id),
                                f"reading the fan-out's decision of batch {batch_id}", batch_id)
        parts = self._prepare(batch_id, swept, check=decided is None)
        if decided is None:
            decided = self._decide(batch_id, parts)
        else:
            self._check_replay(decided, parts)
        first = True
        for target, part in zip(self.targets, parts, strict=True):
            if not part.done:
                if not first:
                    self._crash(CrashPoint.BETWEEN_COMMITS, batch_id)
                target.run(target.coordinator.complete(part))
                first = False
            self.finished(target.sink)  # its figures are final: logged as it is done
        if decided.state is not BatchState.COMMITTED:
            self._retried(lambda: self.ledger.mark_committed(batch_id),
                          f"recording batch {batch_id} committed in every target", batch_id)
        self._crash(CrashPoint.AFTER_COMMIT, batch_id)
        keep = min(t.sink.keep_batches for t in self.targets)
        self.ledger.prune(keep)
        for target in self.targets:
            target.state.ledger.prune(target.sink.keep_batches)

    def _prepare(self, batch_id: int, swept: Sequence[bool], *, check: bool) -> list[Part]:
        """Every target's first half; with ``check``, the checks of the targets that
        commit after the decision (:meth:`_Target.check_input`). Those targets are planned
        first (nothing visible: a schema check, slots planned in their own ledger), and
        their checks, read-only Spark jobs, run in threads while the prepared targets'
        tasks write. Any failure abandons every prepared part."""
        n = len(self.targets)
        parts: list[Part | None] = [None] * n
        later = [i for i in range(n)
                 if self.targets[i].sink.family is not Family.PREPARE_IN_TASK]
        pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"fan-out-{self.sink_id}")
        checks: list[Future[None]] = []
        try:
            for i in [*later, *(i for i in range(n) if i not in later)]:
                target = self.targets[i]
                part = parts[i] = target.run(target.coordinator.prepare(batch_id,
                                                                        swept=swept[i]))
                if check and i in later:
                    checks.append(pool.submit(target.check_input, part))
            for future in checks:
                future.result()
        except BaseException:
            self._abandon(parts)
            raise
        finally:
            pool.shutdown(wait=True)
        return [part for part in parts if part is not None]

    def _open(self, batch_id: int) -> dict[str, tuple[LedgerEntry, ...]]:
        """The fan-out's run start when due: its unfinished decisions, split into the
        prepared targets' parts to adopt; the binding to the query."""
        state = self.state
        if state.started and state.query_id == self.query_id:
            return {}
        # The decisions' ledger may be the first target's kind, which may need what its
        # run's start takes from the batch (DeltaSink: the session): that start first.
        first = self.targets[0]
        first.sink.begin_run(first.state.context(first.sink.sink_id, batch_id,
                                                 first.executor.batch))
        state.ledger.open_run(state.run_id)
        adopt: dict[str, list[LedgerEntry]] = {}
        for decision in state.ledger.unfinished():
            if decision.batch_id != batch_id:
                raise QueryBindingError(
                    f"batch {decision.batch_id} of fan-out {self.sink_id} is decided but not "
                    f"in every target yet, and batch {batch_id} came instead: run batch "
                    f"{decision.batch_id} again (the query's checkpoint; a batch job's run id)",
                    sink_id=self.sink_id, batch_id=batch_id)
            for target in self.targets:
                if target.sink.family is Family.PREPARE_IN_TASK:
                    part = parts_of(decision, target.sink.sink_id)
                    if part is not None:
                        adopt.setdefault(target.sink.sink_id, []).append(part)
        state.generation = state.ledger.bind_query(self.query_id, reset=self.reset_binding)
        state.query_id, state.started = self.query_id, True
        return {sink_id: tuple(parts) for sink_id, parts in adopt.items()}

    def _decide(self, batch_id: int, parts: Sequence[Part]) -> LedgerEntry:
        self._crash(CrashPoint.BEFORE_DECISION, batch_id)
        commits: list[TaskCommit] = []
        for target, part in zip(self.targets, parts, strict=True):
            if target.sink.family is Family.PREPARE_IN_TASK:
                commits.extend(part.commits)
            else:
                commits.append(_marker(target.sink.sink_id, part))
        mine = LedgerEntry(self.sink_id, batch_id, self.state.run_id, BatchState.DECIDED,
                           tuple(commits), None, self.query_id)
        try:
            decided: LedgerEntry = self._retried(lambda: self.ledger.decide(mine),
                                                 f"deciding batch {batch_id}", batch_id)
        except BaseException:
            self._abandon(parts)  # no decision (or an unknown one): the sweep settles it
            raise
        if decided.run_id != self.state.run_id:
            self._abandon(parts)
            raise TransientError(
                f"batch {batch_id} of fan-out {self.sink_id} was decided by run "
                f"{decided.run_id}, not this run: it runs again as a new run, which finishes "
                "that decision", sink_id=self.sink_id, batch_id=batch_id)
        self._crash(CrashPoint.AFTER_DECISION, batch_id)
        logger.info("fan-out %s batch %d: decided for %d target(s)", self.sink_id, batch_id,
                    len(self.targets))
        return decided

    def _check_replay(self, decided: LedgerEntry, parts: Sequence[Part]) -> None:
        """A batch decided earlier: each prepared target found its adopted decision (its
        replay check ran); a prepared target that prepared again would be a second copy."""
        for target, part in zip(self.targets, parts, strict=True):
            if target.sink.family is Family.PREPARE_IN_TASK and not part.done:
                self._abandon(parts)
                raise ProtocolStateError(
                    f"batch {decided.batch_id} of fan-out {self.sink_id} is decided, but "
                    f"target {target.sink.sink_id} prepared it again instead of finishing "
                    "its part", sink_id=self.sink_id, batch_id=decided.batch_id)

    def _abandon(self, parts: Sequence[Part | None]) -> None:
        for target, part in zip(self.targets, parts, strict=False):
            if part is not None and not part.done and part.commits:
                try:
                    target.run(target.coordinator.abandon(part))
                except Exception as exc:  # the next start's sweep rolls them back
                    logger.warning("fan-out %s: rolling back %s's prepared part failed (%s)",
                                   self.sink_id, target.sink.sink_id, type(exc).__name__)

