"""A split batch (the DataSource form's steps, ``connectors.core.driver.planned``), in process: the
planning step, the tasks (``prepare_task`` called as Spark's tasks would), the commit
step by another sink's driver (``SinkDriver``) and a fresh ledger handle, as Spark's
commit worker does."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from connectors.core.batch import TaskInfo, TaskOutcome
from connectors.core.driver.planned import RunTicket, SplitInput
from connectors.core.errors import (
    BadInputError,
    ConfigurationError,
    FencedError,
    QueryBindingError,
)
from connectors.core.protocol import crash
from connectors.core.states import CrashPoint
from connectors.core.templates.options import Options
from connectors.core.templates.tasks import prepare_task
from connectors.testing import InMemoryPreparedSink, InMemoryTarget

SCHEMA = pa.schema([("id", pa.int64())])
QUERY = "query-1"


class Refusing(InMemoryPreparedSink):
    """Refuses negative ids in its tasks (bad input travels as the task's outcome)."""

    def write(self, handle: Any, batch: pa.RecordBatch) -> None:
        if min(batch.column(0).to_pylist(), default=0) < 0:
            raise BadInputError("negative id")
        super().write(handle, batch)


def _sink(target: InMemoryTarget, cls: type[InMemoryPreparedSink] = InMemoryPreparedSink
          ) -> InMemoryPreparedSink:
    return cls(target, sink_id="split")


def _tasks(sink: InMemoryPreparedSink, ticket: RunTicket, batch_id: int,
           parts: list[list[int]], first_attempt: int = 100) -> list[TaskOutcome]:
    """Spark's tasks: each partition prepared under the planning step's run."""
    return [
        prepare_task(sink, ticket.run_id, batch_id, SCHEMA,
                     TaskInfo(partition=p, attempt_number=0, task_attempt_id=first_attempt + p),
                     iter([pa.record_batch([pa.array(ids, pa.int64())], schema=SCHEMA)]))
        for p, ids in enumerate(parts)
    ]


def _batch(target: InMemoryTarget, batch_id: int, parts: list[list[int]],
           query: str = QUERY) -> str:
    """Plan, run the tasks, commit (each step with its own sink object); the outcome."""
    ticket = _sink(target).driver.plan(SCHEMA)
    outcomes = _tasks(_sink(target), ticket, batch_id, parts)
    metrics = _sink(target).driver.commit(ticket, batch_id, query, SCHEMA, outcomes)
    return metrics.outcome


def _ids(target: InMemoryTarget) -> list[int]:
    return sorted(r[0] for r in target.committed_rows())


def test_batches_commit_exactly_and_leave_nothing_prepared() -> None:
    target = InMemoryTarget()
    assert _batch(target, 0, [[1, 2], [3]]) == "committed"
    assert _batch(target, 1, [[4], [5, 6]]) == "committed"
    assert _ids(target) == [1, 2, 3, 4, 5, 6] and target.lingering() == 0


def test_a_replay_the_ledger_has_rolls_back_what_the_tasks_wrote_again() -> None:
    target = InMemoryTarget()
    _batch(target, 0, [[1, 2], [3]])
    # Spark replays batch 0 after a restart: the tasks write it again, partitioned otherwise.
    assert _batch(target, 0, [[3, 1], [2]]) == "replayed"
    assert _ids(target) == [1, 2, 3] and target.lingering() == 0


def test_a_replay_with_other_rows_is_refused() -> None:
    target = InMemoryTarget()
    _batch(target, 0, [[1, 2]])
    with pytest.raises(Exception, match="replay"):
        _batch(target, 0, [[1, 2, 9]])
    _sink(target).driver.plan(SCHEMA)  # the next planning rolls the tasks' work back
    assert _ids(target) == [1, 2] and target.lingering() == 0


@pytest.mark.parametrize("point", [CrashPoint.BEFORE_DECISION, CrashPoint.AFTER_DECISION,
                                   CrashPoint.AFTER_COMMIT])
def test_a_commit_worker_that_dies_is_settled_by_the_next_planning(point: CrashPoint) -> None:
    target = InMemoryTarget()
    _batch(target, 0, [[1]])
    crash.arm(point, batch_id=1)
    with pytest.raises(crash.SimulatedCrash):
        _batch(target, 1, [[2], [3]])
    # Spark runs batch 1 again after the restart: planning settles, the tasks write again.
    outcome = _batch(target, 1, [[2, 3]])
    assert outcome == ("committed" if point is CrashPoint.BEFORE_DECISION else "replayed")
    assert _ids(target) == [1, 2, 3] and target.lingering() == 0


def test_another_query_is_refused_at_the_commit_and_its_tasks_rolled_back() -> None:
    target = InMemoryTarget()
    _batch(target, 0, [[1]])
    with pytest.raises(QueryBindingError):
        _batch(target, 0, [[7]], query="a-new-checkpoint")
    _sink(target).driver.plan(SCHEMA)
    assert _ids(target) == [1] and target.lingering() == 0


def test_tasks_of_a_run_a_newer_planning_swept_never_commit() -> None:
    target = InMemoryTarget()
    old = _sink(target).driver.plan(SCHEMA)
    stale = _tasks(_sink(target), old, 0, [[1], [2]])
    _sink(target).driver.plan(SCHEMA)  # another start: rolls back and forbids them
    with pytest.raises(FencedError):
        _sink(target).driver.commit(old, 0, QUERY, SCHEMA, stale)
    assert _ids(target) == [] and target.lingering() == 0


def test_a_task_error_fails_the_batch_and_rolls_back_the_other_tasks() -> None:
    target = InMemoryTarget()
    ticket = _sink(target, Refusing).driver.plan(SCHEMA)
    outcomes = _tasks(_sink(target, Refusing), ticket, 0, [[1], [-1]])
    assert outcomes[1].error is not None and target.lingering() == 1
    with pytest.raises(BadInputError, match="negative id"):
        _sink(target, Refusing).driver.commit(ticket, 0, QUERY, SCHEMA, outcomes)
    assert _ids(target) == [] and target.lingering() == 0


def test_spark_abort_rolls_back_the_batch() -> None:
    target = InMemoryTarget()
    ticket = _sink(target).driver.plan(SCHEMA)
    _tasks(_sink(target), ticket, 0, [[1], [2]])
    assert target.lingering() == 2
    _sink(target).driver.abort(ticket, 0)
    assert target.lingering() == 0 and _ids(target) == []
    assert _batch(target, 0, [[1, 2]]) == "committed"


def test_a_split_batch_cannot_route_rows() -> None:
    with pytest.raises(ConfigurationError, match=r"cannot route rows.*foreachBatch"):
        SplitInput(SCHEMA, sink_id="split").slotted(2, ["id"])


def test_only_prepared_transaction_sinks_have_the_form() -> None:
    from connectors.testing.memory import InMemoryTaskCommitSink

    with pytest.raises(ConfigurationError, match="no DataSource form"):
        InMemoryTaskCommitSink(InMemoryTarget(), sink_id="slots").driver.plan(SCHEMA)


# ---- options ----


def test_options_are_typed_and_every_error_names_the_option_not_the_value() -> None:
    opts = Options({"Sink_Id": "s", "keep_batches": "x", "create_table": "maybe",
                    "password": "hunter2"}, "s")
    assert opts.text("sink_id") == "s"
    with pytest.raises(ConfigurationError, match='"keep_batches" must be a whole number'):
        opts.integer("keep_batches", 1)
    with pytest.raises(ConfigurationError, match='"create_table" must be true or false'):
        opts.flag("create_table")
    with pytest.raises(ConfigurationError, match=r"unknown option\(s\) \['password'\]") as e:
        opts.check_all_read()
    assert "hunter2" not in str(e.value) and "hunter2" not in repr(opts)


def test_template_options_and_a_sink_without_the_form() -> None:
    opts = Options({"reset_binding": "true", "keep_batches": "7", "outage_timeout": "0"})
    assert InMemoryPreparedSink.template_options(opts) == {
        "reset_binding": True, "on_replay_mismatch": "fail", "keep_batches": 7,
        "values_in_errors": False, "outage_timeout": 0.0, "resume_from": None,
        "checkpoint_location": None}
    with pytest.raises(ConfigurationError, match="InMemoryPreparedSink has no DataSource"):
        InMemoryPreparedSink.from_options(opts)
