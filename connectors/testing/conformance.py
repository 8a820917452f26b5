"""The conformance suite: the crash-point suite we run on our sinks, for yours.

Give it a :class:`SinkHarness` (how to build a fresh sink on the same durable target, how
to read what the target holds) and it drives the sink through every crash point of its
protocol family, task retries, speculative attempts, replays, a non-deterministic replay,
batch ids going backwards, a new query, and another sink whose id extends yours; after
each "restart" it checks the output row by row: nothing missing, nothing twice, nothing
left prepared or open.

Use it from pytest by subclassing :class:`SinkConformanceTests`::

    class TestMySink(SinkConformanceTests):
        def make_harness(self):
            return MyHarness(tmp_dir)

or call :func:`run_conformance` directly; it raises ``AssertionError`` naming every
scenario that failed. :class:`DataSourceFormHarness` runs the same scenarios against a
prepared-transaction sink in its DataSource form.
"""

from __future__ import annotations

import collections
import functools
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, cast

import pyarrow as pa

from connectors.core.batch import BatchInput
from connectors.core.errors import NonDeterministicReplayError, QueryBindingError
from connectors.core.protocol import crash
from connectors.core.protocol.crash import SimulatedCrash
from connectors.core.states import CRASH_POINTS, CrashPoint, Family
from connectors.core.templates.template import TwoPhaseCommitSink
from connectors.testing.local import LocalBatch

__all__ = [
    "SCENARIOS",
    "DataSourceFormHarness",
    "SinkConformanceTests",
    "SinkHarness",
    "batch_rows",
    "run_conformance",
]

Row = tuple[Any, ...]
QUERY = "conformance-query"


class SinkHarness(ABC):
    """How the suite builds sinks and reads the target. One harness = one empty target."""

    @abstractmethod
    def new_sink(self, **overrides: Any) -> TwoPhaseCommitSink:
        """A fresh sink instance on the same durable target, as after a driver restart.

        ``overrides`` are sink options (e.g. ``sink_id``, ``reset_binding``) to apply.
        """

    @abstractmethod
    def committed_rows(self) -> list[Row]:
        """Every row the target holds, as tuples of ``(batch, seq, payload)``."""

    @abstractmethod
    def lingering_transactions(self) -> int:
        """Prepared or open transactions the sink left in the target."""

    def make_batch(self, table: pa.Table, *, partitions: int, **options: Any) -> BatchInput:
        """The engine that runs the sink's tasks (default: in-process :class:`LocalBatch`)."""
        return LocalBatch(table, partitions=partitions, **options)


class DataSourceFormHarness(SinkHarness):
    """The sinks of ``harness`` in their DataSource form (``docs/datasource.md``): each
    batch is planned, its tasks run and it is committed by the sink's driver
    (:class:`~connectors.core.driver.sink_driver.SinkDriver`: ``plan``, ``commit``, ``abort``),
    as Spark's planning worker, tasks and commit worker do, the planning and the commit
    each with a fresh sink from ``harness`` (they are other processes: they share only
    the target). A task that
    fails for good makes Spark call ``abort``, which rolls the batch back. Wrap your
    harness in it::

        run_conformance(lambda: DataSourceFormHarness(MyHarness()))
    """

    def __init__(self, harness: SinkHarness) -> None:
        self.harness = harness

    def new_sink(self, **overrides: Any) -> TwoPhaseCommitSink:
        return cast("TwoPhaseCommitSink", _SplitSink(self.harness, overrides))

    def committed_rows(self) -> list[Row]:
        return self.harness.committed_rows()

    def lingering_transactions(self) -> int:
        return self.harness.lingering_transactions()

    def make_batch(self, table: pa.Table, *, partitions: int, **options: Any) -> BatchInput:
        return self.harness.make_batch(table, partitions=partitions, **options)


class _SplitSink:
    """What the scenarios call a sink: ``write_batch`` through the three steps."""

    def __init__(self, harness: SinkHarness, overrides: dict[str, Any]) -> None:
        self._make: Callable[[], TwoPhaseCommitSink] = functools.partial(
            harness.new_sink, **overrides)
        probe = self._make()
        self.sink_id, self.family = probe.sink_id, probe.family

    def write_batch(self, batch: BatchInput, batch_id: int, *, query_id: str | None = None
                    ) -> Any:
        from connectors.core.ledgers.ledger import BATCH_JOB_QUERY_ID
        from connectors.core.templates.tasks import prepare_task

        planner = self._make()
        ticket = planner.driver.plan(batch.schema)
        task = functools.partial(prepare_task, cast("Any", planner), ticket.run_id, batch_id,
                                 batch.schema)
        try:
            outcomes = batch.run_tasks(task)
        except BaseException:
            self._make().driver.abort(ticket, batch_id)
            raise
        return self._make().driver.commit(
            ticket, batch_id, query_id or BATCH_JOB_QUERY_ID, batch.schema, outcomes)


def batch_rows(batch_id: int, n: int = 7) -> pa.Table:
    """The suite's deterministic input for one batch."""
    return pa.table(
        {
            "batch": pa.array([batch_id] * n, pa.int64()),
            "seq": pa.array(range(n), pa.int64()),
            "payload": pa.array([f"row-{batch_id}-{i}" for i in range(n)], pa.string()),
        }
    )


def _expected(batch_ids: list[int]) -> list[Row]:
    return [tuple(r.values()) for b in batch_ids for r in batch_rows(b).to_pylist()]


def _check_exact(h: SinkHarness, batch_ids: list[int], where: str) -> None:
    got = collections.Counter(h.committed_rows())
    want = collections.Counter(_expected(batch_ids))
    missing = want - got
    extra = got - want
    if missing or extra:
        raise AssertionError(
            f"{where}: output is not exact: {sum(missing.values())} missing, "
            f"{sum(extra.values())} extra/duplicated (e.g. missing {list(missing)[:3]}, "
            f"extra {list(extra)[:3]})"
        )
    lingering = h.lingering_transactions()
    if lingering:
        raise AssertionError(f"{where}: {lingering} transaction(s) left prepared or open")


def _write(h: SinkHarness, sink: TwoPhaseCommitSink, b: int, partitions: int = 3, **kw: Any) -> Any:
    return sink.write_batch(h.make_batch(batch_rows(b), partitions=partitions, **kw), b,
                            query_id=QUERY)


def scenario_plain(make: Callable[[], SinkHarness]) -> None:
    """Three batches, no failure: exact."""
    h = make()
    sink = h.new_sink()
    for b in range(3):
        _write(h, sink, b)
    _check_exact(h, [0, 1, 2], "plain batches")


def scenario_crash_points(make: Callable[[], SinkHarness]) -> None:
    """Every crash point of the family: crash in batch 1, restart, replay (partitioned
    differently), go on: exact, and the crash point was really reached."""
    family = make().new_sink().family
    for point in CRASH_POINTS[family]:
        h = make()
        _write(h, h.new_sink(), 0)
        crash.disarm_all()
        crash.arm(point, batch_id=1, action="raise")
        try:
            try:
                _write(h, h.new_sink(), 1, partitions=3)
            except SimulatedCrash:
                pass
            else:
                raise AssertionError(f"crash point {point.value} was never reached")
            if (point, h.new_sink().sink_id, 1) not in crash.reached:
                raise AssertionError(f"crash point {point.value} not recorded as reached")
        finally:
            crash.disarm_all()
        restarted = h.new_sink()
        _write(h, restarted, 1, partitions=2)  # the replay: other partitioning
        _write(h, restarted, 2)
        _check_exact(h, [0, 1, 2], f"crash at {point.value}, restart, replay")


def scenario_task_retry(make: Callable[[], SinkHarness]) -> None:
    """A task fails mid-write and is retried: only the accepted attempt commits."""
    h = make()
    batch = h.make_batch(batch_rows(0), partitions=3, fail_first_attempt=[0, 2])
    h.new_sink().write_batch(batch, 0, query_id=QUERY)
    runs_tasks = h.new_sink().family is not Family.COMMIT_ON_DRIVER
    if runs_tasks and isinstance(batch, LocalBatch) and not any(
        a.kind == "failed" for a in batch.attempts
    ):
        raise AssertionError("no task attempt failed: the retry was not exercised")
    _check_exact(h, [0], "task retried")


def scenario_speculation(make: Callable[[], SinkHarness]) -> None:
    """Speculative duplicate attempts run: their transactions never commit."""
    h = make()
    sink = h.new_sink()
    batch = h.make_batch(batch_rows(0), partitions=3, speculate=[0, 1, 2])
    sink.write_batch(batch, 0, query_id=QUERY)
    runs_tasks = sink.family is not Family.COMMIT_ON_DRIVER
    if runs_tasks and isinstance(batch, LocalBatch) and not any(
        a.kind == "speculative" for a in batch.attempts
    ):
        raise AssertionError("no speculative attempt ran")
    _write(h, sink, 1)
    _check_exact(h, [0, 1], "speculative attempts")


def scenario_replay_of_committed_batch(make: Callable[[], SinkHarness]) -> None:
    """A batch replayed after it committed (Spark's commit log missed it) writes nothing."""
    h = make()
    _write(h, h.new_sink(), 0)
    metrics = _write(h, h.new_sink(), 0, partitions=1)
    if metrics.outcome != "replayed":
        raise AssertionError(f"replay of a committed batch had outcome {metrics.outcome!r}")
    _check_exact(h, [0], "replay of a committed batch")


def scenario_nondeterministic_replay(make: Callable[[], SinkHarness]) -> None:
    """A replay holding other rows than the committed batch is refused, not absorbed."""
    h = make()
    _write(h, h.new_sink(), 0)
    other = h.make_batch(batch_rows(99), partitions=2)
    try:
        h.new_sink().write_batch(other, 0, query_id=QUERY)
    except NonDeterministicReplayError:
        pass
    else:
        raise AssertionError("a replay with different rows was accepted")
    _check_exact(h, [0], "non-deterministic replay refused")


def scenario_batch_ids_backwards(make: Callable[[], SinkHarness]) -> None:
    """Batch ids going backwards are refused (another query, or a reused run id)."""
    h = make()
    sink = h.new_sink()
    for b in range(3):
        _write(h, sink, b)
    try:
        _write(h, h.new_sink(), 1)
    except QueryBindingError:
        pass
    else:
        raise AssertionError("batch id 1 after batch 2 was accepted")
    _check_exact(h, [0, 1, 2], "batch ids backwards")


def scenario_query_binding(make: Callable[[], SinkHarness]) -> None:
    """A new query (new checkpoint) is refused unless the binding is reset explicitly."""
    h = make()
    _write(h, h.new_sink(), 0)
    try:
        h.new_sink().write_batch(h.make_batch(batch_rows(0), partitions=2), 0, query_id="other")
    except QueryBindingError:
        pass
    else:
        raise AssertionError("a sink bound to one query wrote batch 0 of another query")
    reset = h.new_sink(reset_binding=True)
    reset.write_batch(h.make_batch(batch_rows(5), partitions=2), 0, query_id="other")
    _check_exact(h, [0, 5], "new query after an explicit reset")


def scenario_prefix_isolation(make: Callable[[], SinkHarness]) -> None:
    """Sink ``s`` never touches the transactions of sink ``s-2`` (exact id match)."""
    h = make()
    base = h.new_sink()
    if base.family is not Family.PREPARE_IN_TASK:
        return  # slots and driver commits leave nothing prepared between batches
    other_id = f"{base.sink_id}-2"[:40]
    crash.disarm_all()
    crash.arm(CrashPoint.BEFORE_DECISION, sink_id=other_id, action="raise")
    try:
        _write(h, h.new_sink(sink_id=other_id), 0)
    except SimulatedCrash:
        pass
    else:
        raise AssertionError("the other sink never reached its crash point")
    finally:
        crash.disarm_all()
    left = h.lingering_transactions()
    if not left:
        raise AssertionError("the other sink's crash left nothing prepared to protect")
    _write(h, h.new_sink(), 0)  # reconciles and sweeps: must leave the other sink alone
    if h.lingering_transactions() != left:
        raise AssertionError(f"sink {base.sink_id!r} rolled back transactions of {other_id!r}")
    _write(h, h.new_sink(sink_id=other_id), 0)  # the other sink recovers its own
    got = collections.Counter(h.committed_rows())
    if got != collections.Counter(_expected([0, 0])) or h.lingering_transactions():
        raise AssertionError("prefix-named sinks: output not exact after both recovered")


SCENARIOS: dict[str, Callable[[Callable[[], SinkHarness]], None]] = {
    "plain": scenario_plain,
    "crash_points": scenario_crash_points,
    "task_retry": scenario_task_retry,
    "speculation": scenario_speculation,
    "replay_of_committed_batch": scenario_replay_of_committed_batch,
    "nondeterministic_replay": scenario_nondeterministic_replay,
    "batch_ids_backwards": scenario_batch_ids_backwards,
    "query_binding": scenario_query_binding,
    "prefix_isolation": scenario_prefix_isolation,
}


def run_conformance(make: Callable[[], SinkHarness]) -> list[str]:
    """Run every scenario; return their names, or raise naming each one that failed."""
    failures = []
    for name, scenario in SCENARIOS.items():
        try:
            scenario(make)
        except AssertionError as exc:
            failures.append(f"{name}: {exc}")
        except Exception as exc:
            failures.append(f"{name}: unexpected {type(exc).__name__}: {exc}")
    if failures:
        raise AssertionError("sink fails the conformance suite:\n  " + "\n  ".join(failures))
    return list(SCENARIOS)


class SinkConformanceTests:
    """pytest base class: subclass it and implement :meth:`make_harness`."""

    def make_harness(self) -> SinkHarness:
        raise NotImplementedError("return a SinkHarness on a new, empty target")

    def test_plain_batches_are_exact(self) -> None:
        scenario_plain(self.make_harness)

    def test_every_crash_point_then_restart_is_exact(self) -> None:
        scenario_crash_points(self.make_harness)

    def test_task_retry_commits_only_the_accepted_attempt(self) -> None:
        scenario_task_retry(self.make_harness)

    def test_speculative_attempts_never_commit(self) -> None:
        scenario_speculation(self.make_harness)

    def test_replay_of_committed_batch_writes_nothing(self) -> None:
        scenario_replay_of_committed_batch(self.make_harness)

    def test_nondeterministic_replay_is_refused(self) -> None:
        scenario_nondeterministic_replay(self.make_harness)

    def test_batch_ids_going_backwards_are_refused(self) -> None:
        scenario_batch_ids_backwards(self.make_harness)

    def test_new_query_needs_explicit_reset(self) -> None:
        scenario_query_binding(self.make_harness)

    def test_sink_never_touches_a_sink_whose_id_extends_its_own(self) -> None:
        scenario_prefix_isolation(self.make_harness)
