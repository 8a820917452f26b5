"""Every interleaving of crashes and faults, within bounds, for every protocol family.

The real template, coordinator and executor drive the in-memory participants
(:mod:`connectors.testing`) through a stream of ``BATCHES`` batches. At every call of
``write_batch`` (a *batch attempt*) the schedule picks:

- a crash point of the family, or none (at most ``RESTARTS`` crashes in a schedule; a
  crash is a driver restart: a new sink object, the same target and ledger; Spark then
  replays the same batch, split into other partitions);
- how many tasks fail their first attempt and are retried (at most ``TASK_RETRIES`` in a
  schedule);
- a speculative duplicate attempt of a task (at most ``SPECULATIVE``);
- a transient failure of the first commit (at most ``COMMIT_FAILURES``): the driver's
  commit of a transaction or of the whole batch is retried; a task-commit slot's commit
  fails its task, so the batch fails and the query retries it in the same driver.

The schedules are explored depth first: every choice at every attempt, each path run from
the start on a fresh target. After the last batch the target must hold every row exactly
once, nothing prepared or open, every batch recorded committed, and no protocol error may
have been raised. :data:`MUTANTS` are coordinators with one seeded bug each: each must make
the exploration fail, with its guard on and with it off (then the row-by-row check alone
catches it).
"""

from __future__ import annotations

import collections
import copy
import itertools
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from connectors.core.driver import sink_driver
from connectors.core.errors import ProtocolStateError, TransientError
from connectors.core.ledgers.ledger import LedgerEntry, TaskCommit
from connectors.core.policies.retry import FixedDelay
from connectors.core.protocol import crash
from connectors.core.protocol.commands import Abort, Commit, Crash, Decide, MarkCommitted, RunTasks
from connectors.core.protocol.coordinator import Coordinator, Steps
from connectors.core.protocol.crash import SimulatedCrash
from connectors.core.protocol.recovery import Recovery, Settled
from connectors.core.states import CRASH_POINTS, BatchState, CrashPoint, Family
from connectors.core.templates.template import TwoPhaseCommitSink
from connectors.testing import (
    InMemoryDriverCommitSink,
    InMemoryPreparedSink,
    InMemoryTarget,
    InMemoryTaskCommitSink,
    LocalBatch,
    batch_rows,
)

#: The bounds of the unit suite (~10 s a family); ``EOS_WIDE_MATRIX=1`` widens restarts
#: and task retries to 2 (~5 min a family). COMMIT_ON_DRIVER runs no tasks, so its restarts
#: are 2 in both (352 schedules).
WIDE = os.environ.get("EOS_WIDE_MATRIX") == "1"
BATCHES = 3
RESTARTS = 2 if WIDE else 1
TASK_RETRIES = 2 if WIDE else 1
SPECULATIVE = 1
COMMIT_FAILURES = 1
ROWS = 4  # rows per batch
QUERY = "query-x"
FAST = FixedDelay(max_attempts=3, delay=0.0)

Row = tuple[Any, ...]


@dataclass(frozen=True)
class Faults:
    """What one batch attempt meets."""

    crash: CrashPoint | None = None
    retries: int = 0
    speculative: bool = False
    commit_fails: bool = False


@dataclass
class Budget:
    restarts: int
    retries: int
    speculative: int
    commit_failures: int

    @classmethod
    def full(cls, family: Family) -> Budget:
        restarts = 2 if family is Family.COMMIT_ON_DRIVER else RESTARTS
        return cls(restarts, TASK_RETRIES, SPECULATIVE, COMMIT_FAILURES)

    def choices(self, family: Family) -> list[Faults]:
        points: list[CrashPoint | None] = [None]
        if self.restarts:
            points += list(CRASH_POINTS[family])
        tasks = family is not Family.COMMIT_ON_DRIVER
        return [
            Faults(p, r, bool(s), bool(c))
            for p, r, s, c in itertools.product(
                points,
                range(self.retries + 1) if tasks else [0],
                range(self.speculative + 1) if tasks else [0],
                range(self.commit_failures + 1),
            )
        ]

    def spend(self, f: Faults, crashed: bool) -> Budget:
        return Budget(self.restarts - crashed, self.retries - f.retries,
                      self.speculative - f.speculative, self.commit_failures - f.commit_fails)


class _FailOnce:
    """A transient failure of the first commit, once."""

    def __init__(self) -> None:
        self.armed = False

    def fire(self) -> None:
        if self.armed:
            self.armed = False
            raise TransientError("simulated commit failure")


class _Prepared(InMemoryPreparedSink):
    fail: _FailOnce

    def commit(self, commit: TaskCommit) -> None:
        self.fail.fire()
        super().commit(commit)


class _Slots(InMemoryTaskCommitSink):
    fail: _FailOnce

    def commit_slot(self, handle: Any, marker: Any) -> Mapping[str, float] | None:
        self.fail.fire()
        return super().commit_slot(handle, marker)


class _Driver(InMemoryDriverCommitSink):
    fail: _FailOnce

    def commit_batch(self, batch: Any, ctx: Any) -> None:
        self.fail.fire()
        super().commit_batch(batch, ctx)


def _make(family: Family, target: InMemoryTarget, fail: _FailOnce) -> TwoPhaseCommitSink:
    sink: _Prepared | _Slots | _Driver
    if family is Family.PREPARE_IN_TASK:
        sink = _Prepared(target, sink_id="x", retry=FAST, outage_timeout=0)
    elif family is Family.COMMIT_IN_TASK:
        sink = _Slots(target, sink_id="x", slots=2, retry=FAST, outage_timeout=0)
    else:
        sink = _Driver(target, sink_id="x", retry=FAST, outage_timeout=0)
    sink.fail = fail
    return sink


@dataclass
class Outcome:
    kind: str  # "ok", "crashed", "failed"
    error: BaseException | None = None


class Stream:
    """One schedule's world: a target that outlives drivers, and the current driver."""

    def __init__(self, family: Family) -> None:
        self.family = family
        self.target = InMemoryTarget()
        self.fail = _FailOnce()
        self.sink = _make(family, self.target, self.fail)
        self.batch = 0
        self.attempt = 0
        self.happened = True

    def copy(self) -> Stream:
        """An independent copy of this world (target, ledger, driver)."""
        lock = self.target.lock
        return copy.deepcopy(self, {id(lock): threading.RLock()})

    def run(self, f: Faults) -> Outcome:
        crash.disarm_all()
        if f.crash is not None:
            crash.arm(f.crash, batch_id=self.batch, action="raise")
        self.fail.armed = f.commit_fails
        partitions = 2 + self.attempt % 2  # a replay is split differently
        data = LocalBatch(batch_rows(self.batch, ROWS), partitions=partitions,
                          fail_first_attempt=list(range(f.retries)),
                          speculate=[0] if f.speculative else [])
        self.attempt += 1
        batch = self.batch
        try:
            self.sink.write_batch(data, batch, query_id=QUERY)
            outcome = Outcome("ok")
            self.batch += 1
        except SimulatedCrash:
            self.sink = _make(self.family, self.target, self.fail)  # driver restart
            outcome = Outcome("crashed")
        except (ProtocolStateError, TransientError) as exc:
            outcome = Outcome("failed", exc)  # the query fails; this driver retries it
        finally:
            reached = any(p is f.crash and b == batch for p, _, b in crash.reached)
            crash.disarm_all()
            failed_commit = f.commit_fails and not self.fail.armed
            self.fail.armed = False
        kinds = {a.kind for a in data.attempts}
        # Whether each fault of ``f`` really happened (else the schedule repeats another).
        self.happened = (
            (f.crash is None or reached)
            and (not f.retries or "failed" in kinds)
            and (not f.speculative or "speculative" in kinds)
            and (not f.commit_fails or failed_commit)
        )
        return outcome

    def check(self, where: str) -> None:
        want = sorted((tuple(r.values()) for b in range(BATCHES)
                       for r in batch_rows(b, ROWS).to_pylist()), key=repr)
        got = self.target.committed_rows()
        if got != want:
            extra = collections.Counter(got) - collections.Counter(want)
            missing = collections.Counter(want) - collections.Counter(got)
            raise AssertionError(f"{where}: {sum(extra.values())} row(s) twice, "
                                 f"{sum(missing.values())} missing")
        if self.target.lingering():
            raise AssertionError(f"{where}: {self.target.lingering()} transaction(s) left "
                                 "prepared or open")
        ledger = self.target.ledger("x")
        states = {b: e.state for b in range(BATCHES) if (e := ledger.get(b)) is not None}
        if states != dict.fromkeys(range(BATCHES), BatchState.COMMITTED):
            raise AssertionError(f"{where}: ledger {states}")


def explore(family: Family) -> int:
    """Run every schedule; return how many (raise on the first one that is not exact).

    Depth first over worlds: each choice runs on a copy of the world its prefix left, so
    no prefix runs twice. A choice that did not happen (a crash point, retry, duplicate or
    commit failure the attempt never reached) repeats a schedule without it: dropped.
    """
    count = 0
    stack: list[tuple[Stream, Budget, tuple[Faults, ...]]] = [
        (Stream(family), Budget.full(family), ())]
    while stack:
        world, budget, prefix = stack.pop()
        for choice in budget.choices(family):
            stream = world.copy()
            schedule = (*prefix, choice)
            outcome = stream.run(choice)
            if outcome.kind == "failed" and isinstance(outcome.error, ProtocolStateError):
                raise AssertionError(f"{_path(schedule)}: {outcome.error}")
            if not stream.happened:
                continue
            if stream.batch < BATCHES:
                stack.append((stream, budget.spend(choice, outcome.kind == "crashed"),
                              schedule))
                continue
            stream.check(_path(schedule))
            count += 1
    return count


def _path(schedule: Sequence[Faults]) -> str:
    return " ".join(map(_short, schedule))


def _short(f: Faults) -> str:
    parts = [f.crash.value if f.crash else "-"]
    if f.retries:
        parts.append(f"r{f.retries}")
    if f.speculative:
        parts.append("s")
    if f.commit_fails:
        parts.append("c")
    return "+".join(parts)



# ---- the exploration, on the real coordinator ----
#: Schedules explored per family with the bounds above (measured; the test checks them, so
#: a change of the exploration cannot shrink it silently).
EXPECTED = {
    Family.PREPARE_IN_TASK: 1660,
    Family.COMMIT_IN_TASK: 1651,
    Family.COMMIT_ON_DRIVER: 352,
}


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    # Retries log a WARNING each; tens of thousands would dominate the run time.
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
        crash.disarm_all()


@pytest.mark.parametrize("family", list(Family), ids=lambda f: f.value)
def test_every_interleaving_within_the_bounds_is_exact(family: Family) -> None:
    start = time.monotonic()
    count = explore(family)
    took = time.monotonic() - start
    print(f"{family.value}: {count} schedules in {took:.1f} s "
          f"({BATCHES} batches, <= {Budget.full(family).restarts} restarts, <= {TASK_RETRIES} "
          f"task retries, <= {SPECULATIVE} speculative, <= {COMMIT_FAILURES} commit failure)")
    if not WIDE:
        assert count == EXPECTED[family]


# ---- seeded mutants: each must make the exploration fail ----
class CommitBeforeDecide(Coordinator):
    """Commits the tasks' transactions at BEFORE_DECISION, before any decision."""

    mutant_commits: Sequence[TaskCommit] = ()

    def step(self, command: Any) -> Steps[Any]:
        if isinstance(command, Crash) and command.point is CrashPoint.BEFORE_DECISION:
            for commit in self.mutant_commits:
                yield from super().step(Commit(command.batch_id, commit))
        result = yield from super().step(command)
        if isinstance(command, RunTasks):
            self.mutant_commits = [o.commit for o in result if o.commit is not None]
        return result


class _NoSweep(Recovery):
    def sweep(self, *args: Any, **kwargs: Any) -> Steps[Settled]:
        return Settled()
        yield


class SkippedSweep(Coordinator):
    """Never settles stray prepared transactions."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recovery = _NoSweep(self.sink_id, self.step, self.metrics)


class _AbortingRecovery(Recovery):
    run_id = ""

    def finish(self, entry: LedgerEntry) -> Steps[None]:
        if entry.run_id == self.run_id:
            yield from super().finish(entry)
            return
        for commit in entry.commits:
            yield from self._do(Abort(entry.batch_id, commit.transaction_id))
        yield from self._do(MarkCommitted(entry.batch_id))


class AbortDecided(Coordinator):
    """Rolls back the transactions of a decision an earlier run left, instead of
    committing them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recovery = _AbortingRecovery(self.sink_id, self.step, self.metrics)
        self.recovery.run_id = self.run_id


class LostMarkCommitted(Coordinator):
    """Never records a decided batch as committed."""

    def step(self, command: Any) -> Steps[Any]:
        if isinstance(command, MarkCommitted):
            return None
        return (yield from super().step(command))


class ReDecide(Coordinator):
    """Writes a replayed batch again and decides it with the new committables, believing
    its own decision over the ledger's."""

    def _replay(self, entry: LedgerEntry) -> Steps[None]:
        if self.family is not Family.PREPARE_IN_TASK:
            yield from super()._replay(entry)
            return
        part = yield from self._prepare_transactions(entry.batch_id, False)
        yield from self._decide_and_commit(part)

    def step(self, command: Any) -> Steps[Any]:
        result = yield from super().step(command)
        return command.entry if isinstance(command, Decide) else result


class SlotsNeverRecorded(Coordinator):
    """COMMIT_IN_TASK: never records a batch whose slots all committed."""

    def step(self, command: Any) -> Steps[Any]:
        if isinstance(command, Decide) and self.family is Family.COMMIT_IN_TASK:
            return command.entry
        return (yield from super().step(command))


MUTANTS: dict[type[Coordinator], Family] = {
    CommitBeforeDecide: Family.PREPARE_IN_TASK,
    SkippedSweep: Family.PREPARE_IN_TASK,
    AbortDecided: Family.PREPARE_IN_TASK,
    LostMarkCommitted: Family.PREPARE_IN_TASK,
    ReDecide: Family.PREPARE_IN_TASK,
    SlotsNeverRecorded: Family.COMMIT_IN_TASK,
}


def _unguarded(mutant: type[Coordinator]) -> type[Coordinator]:
    class Unguarded(mutant):  # type: ignore[valid-type, misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.guard.before = lambda command: None

    return Unguarded


@pytest.mark.parametrize("guarded", [True, False], ids=["guard-on", "guard-off"])
@pytest.mark.parametrize("mutant", list(MUTANTS), ids=lambda m: m.__name__)
def test_each_seeded_mutant_fails_the_exploration(
    mutant: type[Coordinator], guarded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sink_driver, "Coordinator", mutant if guarded else _unguarded(mutant))
    with pytest.raises(AssertionError) as caught:
        explore(MUTANTS[mutant])
    print(f"{mutant.__name__} ({'guard on' if guarded else 'guard off'}): {caught.value}")


def test_the_real_coordinator_is_what_the_driver_runs() -> None:
    # The mutants are swapped in through this name; the exploration must use it.
    assert getattr(sink_driver, "Coordinator") is Coordinator  # noqa: B009


def test_the_architecture_diagram_names_the_crash_points_of_the_code() -> None:
    import ast
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs" / "architecture.md").read_text()
    section = doc[doc.index("## The coordinator"):doc.index("## Layout")]
    diagram = section[section.index("```text"):section.index("```\n", section.index("```text") + 7)]
    in_doc = set(re.findall(r"crash point (\w+)", diagram))
    in_code: set[str] = set()
    for module in ("protocol/coordinator.py", "protocol/recovery.py", "templates/tasks.py"):
        tree = ast.parse((root / "connectors" / "core" / module).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "CrashPoint":
                in_code.add(CrashPoint[node.attr].value)
    assert in_doc == in_code == {p.value for p in CrashPoint}
