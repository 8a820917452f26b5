"""Graceful stops in the template, on in-memory participants: the next batch is refused
before any side effect, the query is busy while a batch runs, and an interrupted batch
rolls back what its tasks prepared before control returns."""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from connectors.core.batch import TaskFunction, TaskOutcome
from connectors.core.errors import GRACEFUL_STOP_TAG, GracefulStop
from connectors.core.policies import stopping
from connectors.core.templates.template import TwoPhaseCommitSink
from connectors.testing import (
    InMemoryDriverCommitSink,
    InMemoryPreparedSink,
    InMemoryTarget,
    InMemoryTaskCommitSink,
    LocalBatch,
    batch_rows,
)

QUERY = "query-stop"
SINKS: dict[str, Callable[..., TwoPhaseCommitSink]] = {
    "prepared": InMemoryPreparedSink,
    "task_commit": InMemoryTaskCommitSink,
    "driver_commit": InMemoryDriverCommitSink,
}


@pytest.fixture(autouse=True)
def _no_stop_left() -> Iterator[None]:
    yield
    stopping.withdraw_stop(QUERY)
    assert not stopping.busy(QUERY)


def rows(*batch_ids: int) -> collections.Counter[tuple[Any, ...]]:
    return collections.Counter(tuple(r.values()) for b in batch_ids
                               for r in batch_rows(b).to_pylist())


@pytest.mark.parametrize("kind", SINKS)
def test_a_requested_stop_refuses_the_next_batch_before_any_side_effect(kind: str) -> None:
    target = InMemoryTarget()
    sink = SINKS[kind](target, sink_id="events")
    sink.write_batch(LocalBatch(batch_rows(0)), 0, query_id=QUERY)
    stopping.request_stop(QUERY)
    with pytest.raises(GracefulStop) as caught:
        sink.write_batch(LocalBatch(batch_rows(1)), 1, query_id=QUERY)
    assert str(caught.value).startswith(GRACEFUL_STOP_TAG)
    assert caught.value.batch_id == 1
    assert sink.create_ledger().get(1) is None  # nothing decided, nothing written
    assert collections.Counter(target.committed_rows()) == rows(0)
    assert target.lingering() == 0
    assert not stopping.stop_requested("another-query")
    stopping.withdraw_stop(QUERY)
    # The restart replays the refused batch: exact.
    sink.write_batch(LocalBatch(batch_rows(1)), 1, query_id=QUERY)
    assert collections.Counter(target.committed_rows()) == rows(0, 1)


def test_the_query_is_busy_while_a_batch_runs_and_idle_after() -> None:
    seen: list[bool] = []

    class Watching(LocalBatch):
        def run_tasks(self, fn: TaskFunction, *, barrier: bool = False) -> list[TaskOutcome]:
            seen.append(stopping.busy(QUERY))
            return super().run_tasks(fn, barrier=barrier)

    sink = InMemoryPreparedSink(InMemoryTarget(), sink_id="events")
    sink.write_batch(Watching(batch_rows(0)), 0, query_id=QUERY)
    assert seen == [True]
    assert not stopping.busy(QUERY)


def test_a_stop_requested_during_a_batch_lets_it_finish() -> None:
    target = InMemoryTarget()

    class Stopped(LocalBatch):
        def run_tasks(self, fn: TaskFunction, *, barrier: bool = False) -> list[TaskOutcome]:
            stopping.request_stop(QUERY)  # arrives while the batch is in flight
            return super().run_tasks(fn, barrier=barrier)

    sink = InMemoryPreparedSink(target, sink_id="events")
    sink.write_batch(Stopped(batch_rows(0)), 0, query_id=QUERY)
    assert collections.Counter(target.committed_rows()) == rows(0)
    with pytest.raises(GracefulStop):
        sink.write_batch(LocalBatch(batch_rows(1)), 1, query_id=QUERY)


def test_a_stop_between_two_sinks_of_one_batch_refuses_neither() -> None:
    # One foreachBatch function writing two sinks: the stop arrives after the first began
    # the batch; the second finishes it too, and the next batch is refused by both.
    first_target, second_target = InMemoryTarget(), InMemoryTarget()
    first = InMemoryPreparedSink(first_target, sink_id="first")
    second = InMemoryDriverCommitSink(second_target, sink_id="second")
    first.write_batch(LocalBatch(batch_rows(0)), 0, query_id=QUERY)
    stopping.request_stop(QUERY)
    second.write_batch(LocalBatch(batch_rows(0)), 0, query_id=QUERY)
    assert collections.Counter(second_target.committed_rows()) == rows(0)
    for sink in (first, second):
        with pytest.raises(GracefulStop):
            sink.write_batch(LocalBatch(batch_rows(1)), 1, query_id=QUERY)


class Interrupted(LocalBatch):
    """Runs every task (they prepare), then fails as a job of a stopped query does."""

    waited = 0

    def run_tasks(self, fn: TaskFunction, *, barrier: bool = False) -> list[TaskOutcome]:
        super().run_tasks(fn, barrier=barrier)
        raise RuntimeError("Job 7 cancelled part of cancelled job group")

    def await_tasks_ended(self) -> None:
        type(self).waited += 1

    def slotted(self, slots: int, columns: list[str] | None = None, *,
                key: str | None = None) -> LocalBatch:
        placed = super().slotted(slots, columns, key=key)
        placed.__class__ = Interrupted  # the slots' job is the one interrupted
        return placed


@pytest.mark.parametrize("kind", ["prepared", "task_commit"])
def test_an_interrupted_batch_rolls_back_what_its_tasks_left(
        kind: str, caplog: pytest.LogCaptureFixture) -> None:
    target = InMemoryTarget()
    sink = SINKS[kind](target, sink_id="events")
    Interrupted.waited = 0
    with caplog.at_level(logging.INFO), pytest.raises(RuntimeError, match="cancelled"):
        sink.write_batch(Interrupted(batch_rows(0)), 0, query_id=QUERY)
    assert Interrupted.waited == 1  # the tasks were awaited before the roll-back
    assert target.lingering() == 0  # nothing left prepared or open
    if kind == "prepared":  # (a slot commits in its task: the replay finds its marker)
        assert target.committed_rows() == []
        assert "rolling back undecided transaction" in caplog.text
    # The restart writes the batch exactly once.
    sink.write_batch(LocalBatch(batch_rows(0)), 0, query_id=QUERY)
    assert collections.Counter(target.committed_rows()) == rows(0)
    assert target.lingering() == 0
