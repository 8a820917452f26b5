"""A fan-out (issue 41, docs/fan-out.md) on in-memory targets of the three families: one
decision per batch; a crash at every fan-out crash point and at the targets' own leaves
the batch in none of the targets or (after the decision) converging to all of them when
the batch runs again; bad input refused by any target commits nothing anywhere; the
commit order; transient failures after the decision ride out.

A "restart" is what a new driver does: new sink and fan-out objects over the same targets
(their data and ledgers), and the batch Spark had not committed runs again.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any, ClassVar

import pyarrow as pa
import pytest

from connectors import FanOut
from connectors.core.batch import BatchContext, BatchInput
from connectors.core.errors import (
    BadInputError,
    ConfigurationError,
    NonDeterministicReplayError,
    ProtocolStateError,
    QueryBindingError,
    TransientError,
)
from connectors.core.policies.retry import FixedDelay
from connectors.core.protocol import crash
from connectors.core.protocol.crash import SimulatedCrash
from connectors.core.protocol.fanout_program import parts_of
from connectors.core.states import BatchState, CrashPoint
from connectors.testing import (
    InMemoryDriverCommitSink,
    InMemoryPreparedSink,
    InMemoryTarget,
    InMemoryTaskCommitSink,
    LocalBatch,
    batch_rows,
)
from tests._batches import QUERY, expected

FAST = FixedDelay(max_attempts=3, delay=0.0)
FAN = "fan"


class Targets:
    """A database (prepared transactions), a lake (driver commits), a log (task commits)."""

    def __init__(self) -> None:
        self.db, self.lake, self.log = InMemoryTarget(), InMemoryTarget(), InMemoryTarget()

    def fan(self, *, db: type[InMemoryPreparedSink] = InMemoryPreparedSink,
            lake: type[InMemoryDriverCommitSink] = InMemoryDriverCommitSink,
            log: type[InMemoryTaskCommitSink] = InMemoryTaskCommitSink,
            **options: Any) -> FanOut:
        # Given out of commit order on purpose: the fan-out orders them.
        return FanOut(log(self.log, sink_id="log", retry=FAST),
                      lake(self.lake, sink_id="lake", retry=FAST),
                      db(self.db, sink_id="db", retry=FAST), sink_id=FAN, **options)

    def holds(self, *batch_ids: int) -> dict[str, bool]:
        """Per target: holds exactly ``batch_ids``' rows, once each."""
        want = collections.Counter(expected(*batch_ids))
        return {name: collections.Counter(t.committed_rows()) == want
                for name, t in (("db", self.db), ("lake", self.lake), ("log", self.log))}

    def assert_exact(self, *batch_ids: int) -> None:
        assert self.holds(*batch_ids) == {"db": True, "lake": True, "log": True}
        assert (self.db.lingering(), self.log.lingering()) == (0, 0)
        decisions = {e.batch_id: e.state for e in self.db.ledger(FAN).entries()}
        assert all(decisions.get(b) is BatchState.COMMITTED for b in batch_ids), decisions


def write(fan: FanOut, batch_id: int, *, rows_of: int | None = None, **options: Any) -> Any:
    rows = batch_rows(batch_id if rows_of is None else rows_of)
    batch = LocalBatch(rows, partitions=3, **options)
    return fan.write_batches({s.sink_id: batch for s in fan.sinks}, batch_id, query_id=QUERY)


@pytest.fixture
def t() -> Iterator[Targets]:
    crash.disarm_all()
    yield Targets()
    crash.disarm_all()


def test_every_batch_lands_in_every_target_once_and_replays_write_nothing(t: Targets) -> None:
    fan = t.fan()
    assert [s.sink_id for s in fan.sinks] == ["db", "lake", "log"]  # the commit order
    for batch_id in range(3):
        metrics = write(fan, batch_id)
        assert {m.outcome for m in metrics.values()} == {"committed"}
    t.assert_exact(0, 1, 2)
    # Spark replays the last batch after a restart: nothing is written again.
    again = write(t.fan(), 2)
    assert {m.outcome for m in again.values()} == {"replayed"}
    t.assert_exact(0, 1, 2)
    # Each target keeps its own ledger entries; the decision lists the prepared part and
    # names the others.
    decision = t.db.ledger(FAN).get(1)
    assert decision is not None
    names = {c.transaction_id for c in decision.commits}
    assert {"target:lake", "target:log"} <= names
    part = parts_of(decision, "db")
    assert part is not None and part.batch_id == 1 and len(part.commits) == 3
    assert t.db.ledger("db").get(1) is not None and t.lake.ledger("lake").get(1) is not None


@pytest.mark.parametrize("point", [CrashPoint.BEFORE_DECISION, CrashPoint.AFTER_DECISION,
                                   CrashPoint.BETWEEN_COMMITS, CrashPoint.AFTER_COMMIT])
def test_a_crash_at_each_fan_out_point_converges_when_the_batch_runs_again(
        t: Targets, point: CrashPoint) -> None:
    write(t.fan(), 0)
    crash.arm(point, sink_id=FAN, batch_id=1)
    with pytest.raises(SimulatedCrash):
        write(t.fan(), 1)
    seen = t.holds(0, 1)
    if point in (CrashPoint.BEFORE_DECISION, CrashPoint.AFTER_DECISION):
        assert seen == {"db": False, "lake": False, "log": False}  # in none of them
    elif point is CrashPoint.BETWEEN_COMMITS:
        assert seen == {"db": True, "lake": False, "log": False}  # the documented window
    else:
        assert seen == {"db": True, "lake": True, "log": True}
    decided = t.db.ledger(FAN).get(1)
    assert (decided is None) == (point is CrashPoint.BEFORE_DECISION)
    restarted = t.fan()
    write(restarted, 1)  # Spark replays batch 1
    write(restarted, 2)
    t.assert_exact(0, 1, 2)


@pytest.mark.parametrize("split", [False, True], ids=["in-every-target", "between-commits"])
def test_a_replay_holding_other_rows_is_refused_and_writes_nothing_more(
        t: Targets, split: bool) -> None:
    """Spark replays batch 1 with other rows (a non-deterministic query): the first target
    that has the batch refuses it (its fingerprint check) before any target writes, also
    when only the prepared target had it (a crash between the commits); the replay of the
    rows that were decided then finishes it."""
    write(t.fan(), 0)
    if split:
        crash.arm(CrashPoint.BETWEEN_COMMITS, sink_id=FAN, batch_id=1)
        with pytest.raises(SimulatedCrash):
            write(t.fan(), 1)
        crash.disarm_all()
    else:
        write(t.fan(), 1)
    before = t.holds(0, 1)
    with pytest.raises(NonDeterministicReplayError) as info:
        write(t.fan(), 1, rows_of=7)
    # The targets that commit after the decision are prepared first, in commit order:
    # the lake refuses when it has the batch; after the split only the db has it.
    assert info.value.sink_id == ("db" if split else "lake")
    assert t.holds(0, 1) == before  # nothing more written anywhere
    assert (t.db.lingering(), t.log.lingering()) == (0, 0)
    write(t.fan(), 1)
    t.assert_exact(0, 1)


@pytest.mark.parametrize(("point", "partition"), [
    (CrashPoint.BEFORE_TASKS, None), (CrashPoint.AFTER_PRECOMMIT, 1),
    (CrashPoint.BEFORE_DECISION, None), (CrashPoint.AFTER_DECISION, None)])
@pytest.mark.parametrize("target", ["db", "lake", "log"])
def test_a_crash_at_a_targets_own_point_converges(
        t: Targets, target: str, point: CrashPoint, partition: int | None) -> None:
    write(t.fan(), 0)
    crash.arm(point, sink_id=target, batch_id=1, partition=partition)
    try:
        write(t.fan(), 1)
    except SimulatedCrash:
        pass
    else:  # a point this target's family never reaches in this phase
        assert t.holds(0, 1) == {"db": True, "lake": True, "log": True}
    restarted = t.fan()
    write(restarted, 1)
    write(restarted, 2)
    t.assert_exact(0, 1, 2)


class RefusingPrepared(InMemoryPreparedSink):
    def write(self, handle: Any, batch: pa.RecordBatch) -> None:
        if 3 in batch.column("seq").to_pylist():
            raise BadInputError("row 3: NULL in NOT NULL column 'payload'")
        super().write(handle, batch)


class RefusingDriver(InMemoryDriverCommitSink):
    def plan_input(self, batch: BatchInput, ctx: BatchContext) -> BatchInput:
        raise BadInputError("column 'payload' is string, the table has it as bigint")


class RefusingSlots(InMemoryTaskCommitSink):
    def plan_input(self, batch: BatchInput, ctx: BatchContext) -> BatchInput:
        raise BadInputError("a record of 2 MB is larger than the topic's max.message.bytes")


@pytest.mark.parametrize("refusing", ["db", "lake", "log"])
def test_a_batch_one_target_refuses_commits_nothing_anywhere_then_lands_after_the_fix(
        t: Targets, refusing: str) -> None:
    write(t.fan(), 0)
    bad = {"db": {"db": RefusingPrepared}, "lake": {"lake": RefusingDriver},
           "log": {"log": RefusingSlots}}[refusing]
    with pytest.raises(BadInputError) as info:
        write(t.fan(**bad), 1)
    assert info.value.sink_id == refusing
    assert t.holds(0) == {"db": True, "lake": True, "log": True}
    assert (t.db.lingering(), t.log.lingering()) == (0, 0)  # rolled back at once
    assert t.db.ledger(FAN).get(1) is None
    fixed = t.fan()
    write(fixed, 1)
    write(fixed, 2)
    t.assert_exact(0, 1, 2)


class CheckedLateSlots(InMemoryTaskCommitSink):
    """Leaves its record check to the slots' job on its own (as KafkaSink does with a
    given topic); a fan-out runs it by ``check_input`` before deciding."""

    checked: ClassVar[list[int]] = []

    def check_input(self, batch: BatchInput, ctx: BatchContext) -> None:
        CheckedLateSlots.checked.append(ctx.batch_id)
        if ctx.batch_id == 1:
            raise BadInputError("a record of 2 MB is larger than the topic's max.message.bytes")


def test_a_task_commit_targets_deferred_checks_run_before_the_decision(t: Targets) -> None:
    CheckedLateSlots.checked = []
    write(t.fan(log=CheckedLateSlots), 0)
    with pytest.raises(BadInputError) as info:
        write(t.fan(log=CheckedLateSlots), 1)
    assert info.value.sink_id == "log"
    assert t.holds(0) == {"db": True, "lake": True, "log": True}
    assert t.db.ledger(FAN).get(1) is None and t.db.lingering() == 0
    write(t.fan(), 1)  # the fix: the records fit
    t.assert_exact(0, 1)
    assert CheckedLateSlots.checked == [0, 1]


class RefusingSlotWrites(InMemoryTaskCommitSink):
    """Refuses a row in its tasks (a check its ``plan_input`` did not make): after the
    decision, so the targets before it have the batch."""

    def write(self, handle: Any, batch: pa.RecordBatch) -> None:
        if 3 in batch.column("seq").to_pylist():
            raise BadInputError("row 3 refused by the broker")
        super().write(handle, batch)


def test_a_task_commit_target_refusing_after_the_decision_converges_after_the_fix(
        t: Targets) -> None:
    write(t.fan(), 0)
    with pytest.raises(BadInputError):
        write(t.fan(log=RefusingSlotWrites), 1)
    assert t.holds(0, 1) == {"db": True, "lake": True, "log": False}
    decided = t.db.ledger(FAN).get(1)
    assert decided is not None and decided.state is BatchState.DECIDED
    # A new batch cannot pass the decided one (a batch job's next run id, too).
    with pytest.raises(QueryBindingError, match="run batch 1 again"):
        write(t.fan(), 2)
    fixed = t.fan()
    write(fixed, 1)
    write(fixed, 2)
    t.assert_exact(0, 1, 2)


class FlakyLake(InMemoryDriverCommitSink):
    failures = 0

    def commit_batch(self, batch: BatchInput, ctx: BatchContext) -> None:
        if FlakyLake.failures:
            FlakyLake.failures -= 1
            raise TransientError("the object store answered 503")
        super().commit_batch(batch, ctx)


def test_a_transient_failure_after_the_decision_runs_the_batch_again_and_lands(
        t: Targets, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("connectors.core.policies.restarts.time.sleep", lambda _s: None)
    FlakyLake.failures = 4  # more than the step's retries (FAST: 3 attempts)
    fan = t.fan(lake=FlakyLake)
    metrics = write(fan, 0)
    assert metrics["lake"].extra["batch_restarts"] == 1
    write(fan, 1)
    t.assert_exact(0, 1)


def test_the_decision_is_adopted_before_the_prepared_target_sweeps(t: Targets) -> None:
    """After ``after_decision`` the prepared transactions are the decision's: a restart
    commits them (never rolls them back) even before Spark replays the batch."""
    write(t.fan(), 0)
    crash.arm(CrashPoint.AFTER_DECISION, sink_id=FAN, batch_id=1)
    with pytest.raises(SimulatedCrash):
        write(t.fan(), 1)
    assert t.db.lingering() == 3
    prepared = set(t.db.prepared)
    write(t.fan(), 1)
    assert prepared <= t.db.receipts  # committed, by the restart
    t.assert_exact(0, 1)


@pytest.mark.parametrize(("targets", "match"), [
    ((), "two targets or more"),
    (("one",), "two targets or more"),
    (("db", "db"), "repeat"),
    (("db", FAN), "repeat"),
])
def test_configuration_errors(targets: tuple[str, ...], match: str) -> None:
    target = InMemoryTarget()
    sinks = [InMemoryPreparedSink(target, sink_id=s) for s in targets]
    with pytest.raises(ConfigurationError, match=match):
        FanOut(*sinks, sink_id=FAN)
    with pytest.raises(ConfigurationError, match="must be a sink"):
        FanOut(object(), InMemoryPreparedSink(target, sink_id="db"),  # type: ignore[arg-type]
               sink_id=FAN)


def test_a_decision_that_lists_another_sinks_transaction_is_not_adopted(t: Targets) -> None:
    write(t.fan(), 0)
    decision = t.db.ledger(FAN).get(0)
    assert decision is not None
    assert parts_of(decision, "nobody") is None
    part = parts_of(decision, "db")
    assert part is not None
    from connectors.core.driver.driver_state import DriverState
    from connectors.core.driver.executor import Executor
    from connectors.core.protocol.coordinator import Coordinator
    from connectors.core.states import Family

    sink = InMemoryPreparedSink(t.lake, sink_id="other")
    state = DriverState(sink.create_ledger)
    steps = Coordinator(Family.PREPARE_IN_TASK, "other", run_id=state.run_id,
                        query_id=QUERY).start(0, adopt=[part])
    with pytest.raises(ProtocolStateError, match="adopting"):
        Executor(sink, state, sink.last_metrics or _metrics()).run(steps)


def _metrics() -> Any:
    from connectors.core.metrics import BatchMetrics

    return BatchMetrics("other", 0, "prepare_in_task")


_BY_NAME: dict[str, InMemoryTarget] = {}


class _Named:
    """Holds its in-memory target by name, as a real sink holds a DSN (it pickles)."""

    target: InMemoryTarget

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()  # type: ignore[misc]
        state["target"] = next(k for k, v in _BY_NAME.items() if v is self.target)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.target = _BY_NAME[state["target"]]


class NamedPrepared(_Named, InMemoryPreparedSink):
    pass


class NamedLake(_Named, InMemoryDriverCommitSink):
    pass


def test_a_pickled_fan_out_carries_its_configuration_not_its_driver_state(t: Targets) -> None:
    import pickle

    _BY_NAME.update(db=t.db, lake=t.lake)
    fan = FanOut(NamedPrepared(t.db, sink_id="db"), NamedLake(t.lake, sink_id="lake"),
                 sink_id=FAN, query_name="orders")
    batch = LocalBatch(batch_rows(0), partitions=2)
    fan.write_batches({"db": batch, "lake": batch}, 0, query_id=QUERY)
    assert fan._driver is not None and fan.last_metrics
    copy = pickle.loads(pickle.dumps(fan))
    assert copy._driver is None and copy.last_metrics == {}
    assert (copy.sink_id, copy.query_name, [s.sink_id for s in copy.sinks]) == (
        FAN, "orders", ["db", "lake"])
    write_again = LocalBatch(batch_rows(1), partitions=2)
    copy.write_batches({"db": write_again, "lake": write_again}, 1, query_id=QUERY)
    assert len(t.db.committed_rows()) == len(t.lake.committed_rows()) == 14
