"""LocalBatch's barrier stages: every task at once, one barrier, retried as a whole.

Before, ``run_tasks(fn, barrier=True)`` ran the tasks one after another with no barrier, so
a sink in barrier mode (``KafkaSink(barrier=True)``) committed a slot before a later slot
had failed: what Spark's barrier stage exists to prevent.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pyarrow as pa
import pytest

from connectors.core.batch import TaskInfo, TaskOutcome
from connectors.core.errors import BadInputError
from connectors.testing import LocalBatch


def _batch(**kwargs: object) -> LocalBatch:
    return LocalBatch(pa.table({"x": list(range(9))}), partitions=3, **kwargs)  # type: ignore[arg-type]


def test_every_task_sees_every_message_of_the_stage() -> None:
    seen: dict[int, list[str]] = {}
    lock = threading.Lock()

    def task(info: TaskInfo, rows: Iterator[pa.RecordBatch]) -> TaskOutcome:
        assert info.barrier is not None and info.barrier.tasks() == 3
        count = sum(b.num_rows for b in rows)
        messages = info.barrier.all_gather(f"{info.partition}:{count}")
        again = info.barrier.all_gather(f"second-{info.partition}")  # a second round
        with lock:
            seen[info.partition] = messages + again
        return TaskOutcome()

    batch = _batch()
    assert len(batch.run_tasks(task, barrier=True)) == 3
    expected = ["0:3", "1:3", "2:3", "second-0", "second-1", "second-2"]
    assert seen == {p: expected for p in range(3)}
    assert [a.kind for a in batch.attempts] == ["accepted"] * 3


def test_a_failed_task_breaks_the_others_wait_and_the_whole_stage_runs_again() -> None:
    gathered: list[tuple[int, int]] = []
    lock = threading.Lock()

    def task(info: TaskInfo, rows: Iterator[pa.RecordBatch]) -> TaskOutcome:
        list(rows)  # partition 1 fails while its rows are read, in attempt 0
        assert info.barrier is not None
        info.barrier.all_gather("ok")
        with lock:
            gathered.append((info.partition, info.attempt_number))
        return TaskOutcome()

    batch = _batch(fail_first_attempt=[1])
    assert len(batch.run_tasks(task, barrier=True)) == 3
    # Nobody passed the barrier of attempt 0; all three passed it in attempt 1.
    assert sorted(gathered) == [(0, 1), (1, 1), (2, 1)]
    kinds = [(a.partition, a.attempt_number, a.kind) for a in batch.attempts]
    assert (1, 0, "failed") in kinds and (0, 0, "failed") in kinds
    assert {(p, 1, "accepted") for p in range(3)} <= set(kinds)


def test_an_error_other_than_a_simulated_failure_is_raised_and_nobody_commits() -> None:
    committed: list[int] = []

    def task(info: TaskInfo, rows: Iterator[pa.RecordBatch]) -> TaskOutcome:
        list(rows)
        if info.partition == 2:
            raise BadInputError("slot 2 holds a bad record")
        assert info.barrier is not None
        info.barrier.all_gather("ok")
        committed.append(info.partition)
        return TaskOutcome()

    with pytest.raises(BadInputError, match="bad record"):
        _batch().run_tasks(task, barrier=True)
    assert committed == []
