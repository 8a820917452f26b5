"""One listing of the target's prepared transactions per batch in steady state.

A PREPARE_IN_TASK batch closes with a sweep (losing attempts of the batch); once every
attempt of its tasks has ended, nothing can prepare after it, so the next batch of the same
driver run does not sweep again before its tasks (before: two or three listings per batch,
``pg_prepared_xacts`` reads on PostgreSQL). The start of a run sweeps once; a batch whose
engine cannot tell that its tasks ended (Spark Connect) leaves the next batch its opening
sweep.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from connectors.core.driver.executor import Executor
from connectors.core.protocol.commands import ListPrepared
from connectors.testing import InMemoryPreparedSink, InMemoryTarget, LocalBatch, batch_rows

QUERY = "query-1"


class CountingSink(InMemoryPreparedSink):
    listings = 0

    def list_prepared(self) -> Iterable[str]:
        type(self).listings += 1
        return super().list_prepared()


class UnsureBatch(LocalBatch):
    """An engine that cannot tell whether the batch's tasks ended (Spark Connect)."""

    def tasks_ended(self) -> bool:
        return False


def listings_per_batch(batch_type: type[LocalBatch], batches: int = 5, **options: Any
                       ) -> list[int]:
    target = InMemoryTarget()
    sink = CountingSink(target, sink_id="events")
    CountingSink.listings = 0
    counts = []
    for b in range(batches):
        before = CountingSink.listings
        sink.write_batch(batch_type(batch_rows(b), partitions=3, **options), b,
                         query_id=QUERY)
        counts.append(CountingSink.listings - before)
    assert target.lingering() == 0, "nothing left prepared"
    assert len(target.committed_rows()) == sum(batch_rows(b).num_rows for b in range(batches))
    return counts


def test_steady_state_lists_prepared_transactions_once_per_batch() -> None:
    # The run's start sweeps, then every batch closes with one sweep.
    assert listings_per_batch(LocalBatch) == [2, 1, 1, 1, 1]


def test_losing_attempts_are_rolled_back_by_the_one_sweep() -> None:
    # Every batch has a speculative duplicate and a retried task: still one listing, and
    # nothing stays prepared (checked in listings_per_batch).
    counts = listings_per_batch(LocalBatch, speculate={0}, fail_first_attempt={1})
    assert counts == [2, 1, 1, 1, 1]


def test_an_engine_that_cannot_tell_keeps_the_opening_sweep() -> None:
    assert listings_per_batch(UnsureBatch) == [2, 2, 2, 2, 2]


def test_the_sweep_is_a_command_the_coordinator_yields() -> None:
    # The listing happens only through the coordinator's ListPrepared command.
    seen: list[Any] = []
    original = Executor.perform

    def spy(self: Executor, command: Any) -> Any:
        seen.append(command)
        return original(self, command)

    Executor.perform = spy  # type: ignore[method-assign]
    try:
        listings_per_batch(LocalBatch, batches=2)
    finally:
        Executor.perform = original  # type: ignore[method-assign]
    assert sum(isinstance(c, ListPrepared) for c in seen) == CountingSink.listings == 3
