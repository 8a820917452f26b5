"""Riding out an unavailable target (``outage_timeout``): a batch that failed with a
transient error, on the driver or in a task, runs again as a new driver run and lands
exactly once; past the bound it fails naming the target and the bound; an error that
running the batch again cannot mend ends it at once.

The waits are real code paths with a fake clock: ``time.sleep`` advances it.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Iterator
from typing import Any

import pytest

from connectors.core.batch import BatchContext
from connectors.core.errors import (
    BadInputError,
    ConfigurationError,
    RetriesExhaustedError,
    TransientError,
)
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers.ledger import TaskCommit
from connectors.core.policies import restarts
from connectors.core.policies.restarts import BatchRestarts, Outage
from connectors.core.policies.retry import ExponentialBackoff, NoRetry
from connectors.core.states import Family
from connectors.testing import (
    InMemoryDriverCommitSink,
    InMemoryPreparedSink,
    InMemoryTarget,
    InMemoryTaskCommitSink,
    LocalBatch,
    batch_rows,
)
from tests._batches import QUERY, assert_exact, write

#: Failures left per (sink class, hook), shared by the copies LocalBatch gives the tasks.
FAILURES: collections.Counter[str] = collections.Counter()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    fake = FakeClock()
    monkeypatch.setattr(restarts, "time", fake)
    FAILURES.clear()
    yield fake
    FAILURES.clear()


def _fail(hook: str) -> None:
    if FAILURES[hook] > 0:
        FAILURES[hook] -= 1
        raise TransientError(f"{hook}: connection refused (the server is restarting)")


class Prepared(InMemoryPreparedSink):
    def begin_transaction(self, txn: Any) -> Any:
        _fail("begin_transaction")  # a task: the database is down
        return super().begin_transaction(txn)

    def commit(self, commit: TaskCommit) -> None:
        _fail("commit")  # the driver, after the decision
        super().commit(commit)

    def describe_target(self) -> str:
        return "PostgreSQL db.example:5432/app"


class Slots(InMemoryTaskCommitSink):
    def open_slot(self, slot: Any) -> Any:
        _fail("open_slot")  # a task: the broker is down
        return super().open_slot(slot)


class Driver(InMemoryDriverCommitSink):
    def commit_batch(self, batch: Any, ctx: BatchContext) -> Fingerprint | None:
        _fail("commit_batch")
        return super().commit_batch(batch, ctx)


@pytest.mark.parametrize(("make", "hook"), [
    (Prepared, "begin_transaction"), (Prepared, "commit"), (Slots, "open_slot"),
    (Driver, "commit_batch"),
], ids=["prepare-task", "prepare-commit", "slot-task", "driver-commit"])
def test_a_target_down_for_a_while_does_not_end_the_batch(
    clock: FakeClock, make: Any, hook: str
) -> None:
    target = InMemoryTarget()
    # NoRetry: each failure fails its step at once (the step retries would hide a short one)
    kwargs: dict[str, Any] = {"slots": 2} if make is Slots else {}
    sink = make(target, sink_id="events", retry=NoRetry(), **kwargs)
    write(sink, 0)
    FAILURES[hook] = 4  # four attempts meet the restarting target
    metrics = write(sink, 1)
    assert metrics.outcome in ("committed", "replayed")
    assert metrics.extra["batch_restarts"] == 4
    assert FAILURES[hook] == 0
    assert_exact(target, 0, 1)
    # the waits: 1 s doubling (jittered by up to 20 %), capped at 10 s
    assert len(clock.sleeps) == 4
    for got, base in zip(clock.sleeps, [1, 2, 4, 8], strict=True):
        assert base * 0.8 <= got <= base * 1.2
    write(sink, 2)
    assert_exact(target, 0, 1, 2)


def test_past_the_bound_the_batch_fails_naming_the_target_and_the_bound(
    clock: FakeClock,
) -> None:
    target = InMemoryTarget()
    sink = Prepared(target, sink_id="events", outage_timeout=30)
    FAILURES["begin_transaction"] = 10**6
    with pytest.raises(RetriesExhaustedError) as info:
        write(sink, 0)
    message = str(info.value)
    assert "PostgreSQL db.example:5432/app stayed unavailable" in message
    assert "outage_timeout (30 s)" in message
    assert "connection refused" in message  # the last error
    assert isinstance(info.value.__cause__, TransientError)
    assert (info.value.sink_id, info.value.batch_id) == ("events", 0)
    assert sum(clock.sleeps) <= 30
    assert sink.last_metrics is not None and sink.last_metrics.outcome == "failed"
    # the target is back: the restarted query writes the batch once
    FAILURES.clear()
    write(Prepared(target, sink_id="events"), 0)
    assert_exact(target, 0)


def test_zero_turns_it_off(clock: FakeClock) -> None:
    target = InMemoryTarget()
    FAILURES["commit"] = 1
    with pytest.raises(RetriesExhaustedError):  # the step's own retries ran out
        write(Prepared(target, sink_id="events", retry=NoRetry(), outage_timeout=0), 0)
    assert clock.sleeps == []


def test_an_error_a_new_attempt_cannot_mend_ends_the_batch_at_once(clock: FakeClock) -> None:
    class Refusing(InMemoryPreparedSink):
        def validate_input(self, schema: Any) -> None:
            raise BadInputError("column x: NULL in a NOT NULL column; fix the input")

    with pytest.raises(BadInputError):
        write(Refusing(InMemoryTarget(), sink_id="events"), 0)
    assert clock.sleeps == []


def test_a_requested_graceful_stop_ends_the_outage_wait(clock: FakeClock) -> None:
    class Stopping(LocalBatch):
        stop = False

        def stop_requested(self, query_id: str) -> bool:
            return self.stop

    target = InMemoryTarget()
    sink = Prepared(target, sink_id="events")
    FAILURES["begin_transaction"] = 10**6
    data = Stopping(batch_rows(0), partitions=2)
    data.stop = False
    first = True

    def sleep_then_stop(seconds: float) -> None:
        nonlocal first
        clock.now += seconds
        if not first:
            data.stop = True  # the operator asks the query to stop during the outage
        first = False

    clock.sleep = sleep_then_stop  # type: ignore[method-assign] # the wait between attempts
    with pytest.raises(TransientError) as info:
        sink.write_batch(data, 0, query_id=QUERY)
    assert not isinstance(info.value, RetriesExhaustedError)  # the attempt's own error
    assert "connection refused" in str(info.value) and not first
    FAILURES.clear()
    write(Prepared(target, sink_id="events"), 0)
    assert_exact(target, 0)


def test_batch_restarts_alone() -> None:
    now = [0.0]
    steady = ExponentialBackoff(initial_delay=1.0, max_delay=10.0, jitter=0.0)
    r = BatchRestarts(Outage(timeout=25, backoff=steady), "s", 3, target=lambda: "T",
                      clock=lambda: now[0], rng=random.Random(1))
    delays = []
    with pytest.raises(RetriesExhaustedError, match=r"T stayed unavailable for 25 s"):
        while True:
            delay = r.after(TransientError("down"))
            assert delay is not None
            delays.append(delay)
            now[0] += delay
    assert delays == [1, 2, 4, 8, 10]  # the next (10 s) would end past 25 s
    assert r.after(ValueError("not a target's")) is None
    assert BatchRestarts(Outage(timeout=0), "s", 3, target=lambda: "T").after(
        TransientError("down")) is None


def test_the_default_waits_are_jittered_around_1_2_4_8_10_s() -> None:
    outage, rng = Outage(), random.Random(7)
    for failures, base in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (60, 10.0)):
        assert base * 0.8 <= outage.delay(failures, rng) <= base * 1.2
    with pytest.raises(ConfigurationError, match="ExponentialBackoff"):
        Outage(backoff=NoRetry())  # type: ignore[arg-type]


class Named(InMemoryPreparedSink):
    """Counts how often the template asks for the target's name."""

    asked = 0

    def describe_target(self) -> str:
        Named.asked += 1
        return "the in-memory target"


def test_the_target_is_named_only_once_a_batch_failed(clock: FakeClock) -> None:
    target = InMemoryTarget()
    Named.asked = 0
    for batch_id in range(3):
        write(Named(target, sink_id="events"), batch_id)
    assert Named.asked == 0  # a batch that succeeds asks for no name
    FAILURES["begin_transaction"] = 1

    class Failing(Named, Prepared):
        pass

    write(Failing(target, sink_id="events"), 3)
    assert Named.asked == 1
    assert_exact(target, 0, 1, 2, 3)


@pytest.mark.parametrize("bad", [-1, float("nan"), "120", True])
def test_the_bound_is_validated(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="outage_timeout"):
        InMemoryPreparedSink(InMemoryTarget(), sink_id="events", outage_timeout=bad)


def test_every_family_rides_out() -> None:
    assert {Prepared.family, Slots.family, Driver.family} == set(Family)
