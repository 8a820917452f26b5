"""The template driven through ``write_batch`` on in-memory participants and LocalBatch:
metrics, retries, restarts, bad input, data loss, pickling, entry-point checks and the
race between two drivers."""

from __future__ import annotations

import collections
import logging
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pytest
from pyspark import cloudpickle

from connectors.core.batch import BatchContext, BatchInput
from connectors.core.errors import (
    BadInputError,
    ConfigurationError,
    DataLossError,
    FatalError,
    FencedError,
    NonDeterministicReplayError,
    RetriesExhaustedError,
    TransientError,
)
from connectors.core.ledgers.ledger import Ledger, LedgerEntry, TaskCommit
from connectors.core.policies.retry import FixedDelay, NoRetry
from connectors.core.protocol import crash
from connectors.core.protocol.crash import SimulatedCrash
from connectors.core.states import BatchState, CrashPoint, Family
from connectors.core.templates.template import TwoPhaseCommitSink
from connectors.testing import (
    InMemoryDriverCommitSink,
    InMemoryPreparedSink,
    InMemoryTarget,
    InMemoryTaskCommitSink,
    LocalBatch,
    batch_rows,
)
from tests._batches import QUERY, assert_exact, expected, write

FAST = FixedDelay(max_attempts=5, delay=0.0)  # retries without sleeping


SINKS: dict[str, Callable[..., TwoPhaseCommitSink]] = {
    "prepared": InMemoryPreparedSink,
    "task_commit": InMemoryTaskCommitSink,
    "driver_commit": InMemoryDriverCommitSink,
}


@pytest.fixture
def target() -> InMemoryTarget:
    return InMemoryTarget()


# --- metrics -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "family", "tasks"),
    [
        ("prepared", Family.PREPARE_IN_TASK, 3),  # one task per partition
        ("task_commit", Family.COMMIT_IN_TASK, 3),  # one task per slot (slots=3)
        ("driver_commit", Family.COMMIT_ON_DRIVER, 0),  # no task of the protocol
    ],
)
def test_metrics_of_a_committed_then_replayed_batch(
    target: InMemoryTarget, kind: str, family: Family, tasks: int
) -> None:
    sink = SINKS[kind](target, sink_id="events", retry=FAST)
    metrics = write(sink, 0)
    assert sink.last_metrics is metrics
    assert (metrics.sink_id, metrics.batch_id, metrics.family) == ("events", 0, family.value)
    assert metrics.outcome == "committed"
    assert metrics.rows == 7
    assert metrics.tasks == tasks
    assert metrics.retries == 0
    assert metrics.extra["total_ms"] >= 0
    if kind != "driver_commit":
        assert metrics.bytes > 0

    replay = write(sink, 0, partitions=1)
    assert replay.outcome == "replayed"
    assert replay.rows == 0
    assert sink.last_metrics is replay
    assert_exact(target, 0)


def test_first_batch_of_a_restarted_driver_counts_reconciled_transactions(
    target: InMemoryTarget,
) -> None:
    crash.arm(CrashPoint.AFTER_DECISION, batch_id=0)
    with pytest.raises(SimulatedCrash):
        write(InMemoryPreparedSink(target, sink_id="events"), 0)
    metrics = write(InMemoryPreparedSink(target, sink_id="events"), 1)
    assert metrics.reconciled == 3  # batch 0's three decided transactions
    assert metrics.outcome == "committed"
    assert_exact(target, 0, 1)


def test_losing_attempts_are_swept_and_counted_as_aborted(target: InMemoryTarget) -> None:
    sink = InMemoryPreparedSink(target, sink_id="events")
    metrics = write(sink, 0, speculate=[0, 2])
    assert metrics.aborted == 2
    assert metrics.tasks == 3
    assert_exact(target, 0)


def test_metrics_log_line_is_emitted_on_the_metrics_logger(
    target: InMemoryTarget, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="connectors.metrics")
    write(InMemoryPreparedSink(target, sink_id="events"), 0)
    records = [r for r in caplog.records if r.name == "connectors.metrics"]
    assert len(records) == 1
    assert records[0].levelno == logging.INFO
    line = records[0].getMessage()
    assert line.startswith("batch sink_id=events batch_id=0 family=prepare_in_task ")
    assert " outcome=committed " in line
    assert " rows=7 " in line
    assert " tasks=3 " in line
    assert " total_ms=" in line


def test_failed_batch_emits_metrics_with_outcome_failed(
    target: InMemoryTarget, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="connectors.metrics")
    sink = InMemoryPreparedSink(target, sink_id="events")
    crash.arm(CrashPoint.BEFORE_DECISION)
    with pytest.raises(SimulatedCrash):
        write(sink, 0)
    assert sink.last_metrics is not None
    assert sink.last_metrics.outcome == "failed"
    (record,) = [r for r in caplog.records if r.name == "connectors.metrics"]
    assert " outcome=failed " in record.getMessage()


# --- retries -----------------------------------------------------------------------------


class FlakyCommitSink(InMemoryPreparedSink):
    """Its driver-side commit fails ``failures`` times with a TransientError, then works."""

    def __init__(self, target: InMemoryTarget, *, failures: int, **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        self.failures = failures
        self.commit_calls = 0

    def commit(self, commit: TaskCommit) -> None:
        self.commit_calls += 1
        if self.failures:
            self.failures -= 1
            raise TransientError("connection reset", transaction_id=commit.transaction_id)
        super().commit(commit)


def test_transient_commit_failures_are_retried_and_counted(
    target: InMemoryTarget, caplog: pytest.LogCaptureFixture
) -> None:
    sink = FlakyCommitSink(target, failures=2, sink_id="events", retry=FAST)
    with caplog.at_level(logging.WARNING):
        metrics = write(sink, 0)
    assert metrics.outcome == "committed"
    assert metrics.retries == 2
    assert sink.commit_calls == 3 + 2
    assert sum("retrying" in r.getMessage() for r in caplog.records) == 2
    assert_exact(target, 0)


class FlakyDriverSink(InMemoryDriverCommitSink):
    def __init__(self, target: InMemoryTarget, *, failures: int, **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        self.failures = failures

    def commit_batch(self, batch: BatchInput, ctx: BatchContext) -> None:
        if self.failures:
            self.failures -= 1
            raise TransientError("lock timeout")
        super().commit_batch(batch, ctx)


def test_transient_driver_commit_failures_are_retried_and_counted(
    target: InMemoryTarget,
) -> None:
    metrics = write(FlakyDriverSink(target, failures=2, sink_id="events", retry=FAST), 0)
    assert metrics.retries == 2
    assert metrics.outcome == "committed"
    assert_exact(target, 0)


def test_commit_that_always_fails_exhausts_retries_then_a_restart_commits_exactly(
    target: InMemoryTarget,
) -> None:
    write(InMemoryPreparedSink(target, sink_id="events"), 0)
    broken = FlakyCommitSink(  # outage_timeout=0: the failed batch ends the query
        target, failures=10**6, sink_id="events", retry=FixedDelay(max_attempts=3, delay=0.0),
        outage_timeout=0,
    )
    with pytest.raises(RetriesExhaustedError) as info:
        write(broken, 1)
    err = info.value
    assert err.attempts == 3
    assert (err.sink_id, err.batch_id) == ("events", 1)
    assert err.transaction_id is not None and err.transaction_id.startswith("eos1|events|")
    assert isinstance(err.__cause__, TransientError)
    assert broken.last_metrics is not None and broken.last_metrics.outcome == "failed"
    # The decision is durable: batch 1 is DECIDED, its transactions are still prepared.
    ledger = target.ledger("events")
    assert [e.batch_id for e in ledger.unfinished()] == [1]
    assert len(target.prepared) == 3
    assert collections.Counter(target.committed_rows()) == collections.Counter(expected(0))

    # A restarted driver (new sink instance, same target) replays batch 1.
    restarted = InMemoryPreparedSink(target, sink_id="events")
    metrics = write(restarted, 1, partitions=2)
    assert metrics.outcome == "replayed"
    assert metrics.reconciled == 3
    assert ledger.unfinished() == []
    write(restarted, 2)
    assert_exact(target, 0, 1, 2)


def test_a_fatal_commit_error_is_not_retried(target: InMemoryTarget) -> None:
    class FencedCommitSink(InMemoryPreparedSink):
        calls = 0

        def commit(self, commit: TaskCommit) -> None:
            type(self).calls += 1
            raise FencedError("another owner")

    with pytest.raises(FencedError):
        write(FencedCommitSink(target, sink_id="events", retry=FAST), 0)
    assert FencedCommitSink.calls == 1


# --- bad input ---------------------------------------------------------------------------


class BadRowSink(InMemoryPreparedSink):
    """Refuses rows whose ``seq`` is 3: only one partition of a batch holds such a row."""

    def write(self, handle: Any, batch: pa.RecordBatch) -> None:
        if 3 in batch.column("seq").to_pylist():
            raise BadInputError("row 3 does not fit column 'payload' (max 5 bytes)")
        super().write(handle, batch)


class BadRowSlotSink(InMemoryTaskCommitSink):
    def write(self, handle: Any, batch: pa.RecordBatch) -> None:
        if 3 in batch.column("seq").to_pylist():
            raise BadInputError("row 3 does not fit")
        super().write(handle, batch)


def test_bad_input_in_a_task_fails_the_batch_and_leaves_nothing(target: InMemoryTarget) -> None:
    write(InMemoryPreparedSink(target, sink_id="events"), 0)
    with pytest.raises(BadInputError) as info:
        write(BadRowSink(target, sink_id="events"), 1)
    err = info.value
    assert (err.sink_id, err.batch_id) == ("events", 1)
    assert err.transaction_id is not None and "|1|" in err.transaction_id
    assert "does not fit" in str(err)
    assert_exact(target, 0)  # nothing of batch 1 committed, nothing left prepared
    assert target.ledger("events").get(1) is None

    # After the fix (a new sink without the fault) the batch commits exactly once.
    fixed = InMemoryPreparedSink(target, sink_id="events")
    assert write(fixed, 1).outcome == "committed"
    write(fixed, 1)
    assert_exact(target, 0, 1)


def test_bad_input_in_one_slot_then_the_fix_commits_every_slot_exactly_once(
    target: InMemoryTarget,
) -> None:
    # Slots commit in their tasks: the good slots are committed before the bad one fails;
    # the fixed replay finds their markers and writes only the missing slot.
    with pytest.raises(BadInputError):
        write(BadRowSlotSink(target, sink_id="events"), 0)
    assert target.lingering() == 0
    assert len(target.committed_rows()) < 7
    metrics = write(InMemoryTaskCommitSink(target, sink_id="events"), 0)
    assert metrics.outcome == "committed"
    assert 0 < metrics.rows < 7
    assert_exact(target, 0)


@pytest.mark.parametrize("kind", list(SINKS))
def test_validate_input_refusal_writes_nothing(target: InMemoryTarget, kind: str) -> None:
    calls = []

    class Refusing(SINKS[kind]):  # type: ignore[misc, valid-type]
        def validate_input(self, schema: pa.Schema) -> None:
            calls.append(schema)
            raise BadInputError("column 'payload' must not be a string")

    with pytest.raises(BadInputError, match="must not be a string"):
        write(Refusing(target, sink_id="events"), 0)
    assert calls == [batch_rows(0).schema]
    assert target.committed_rows() == []
    assert target.lingering() == 0
    assert target.ledger("events").entries() == []


# --- data loss ---------------------------------------------------------------------------


def test_decided_transaction_that_vanished_raises_data_loss(target: InMemoryTarget) -> None:
    write(InMemoryPreparedSink(target, sink_id="events"), 0)
    crash.arm(CrashPoint.AFTER_DECISION, batch_id=1)
    with pytest.raises(SimulatedCrash):
        write(InMemoryPreparedSink(target, sink_id="events"), 1)
    decision = target.ledger("events").get(1)
    assert decision is not None and decision.state is BatchState.DECIDED
    vanished = decision.commits[1].transaction_id
    del target.prepared[vanished]  # e.g. an operator rolled it back by hand

    with pytest.raises(DataLossError) as info:
        write(InMemoryPreparedSink(target, sink_id="events"), 1)
    assert isinstance(info.value, FatalError)
    assert info.value.transaction_id == vanished
    # Never presumed committed: the batch stays unfinished in the ledger.
    assert [e.batch_id for e in target.ledger("events").unfinished()] == [1]


# --- pickling ----------------------------------------------------------------------------

_TARGETS: dict[str, InMemoryTarget] = {}


class RegisteredTargetSink(InMemoryPreparedSink):
    """Holds its target by name, as a real sink holds a DSN: its configuration pickles."""

    def __init__(self, target_name: str, **kwargs: Any) -> None:
        super().__init__(_TARGETS[target_name], **kwargs)
        self.target_name = target_name

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        del state["target"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.target = _TARGETS[self.target_name]


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps], ids=["pickle", "cloudpickle"])
def test_sink_pickles_without_its_driver_state(
    target: InMemoryTarget, dumps: Callable[[Any], bytes]
) -> None:
    _TARGETS["pickled"] = target
    sink = RegisteredTargetSink("pickled", sink_id="events", retry=FAST, keep_batches=5)
    write(sink, 0)
    assert sink._driver is not None  # holds the ledger (and its lock): must not travel

    copy = pickle.loads(dumps(sink))
    assert copy._driver is None
    assert copy.last_metrics is None
    assert (copy.sink_id, copy.retry, copy.keep_batches) == ("events", FAST, 5)
    # The original keeps its state; the copy works on its own.
    assert sink._driver is not None and sink.last_metrics is not None
    assert write(copy, 1).outcome == "committed"
    assert_exact(target, 0, 1)


def test_sink_without_driver_state_pickles_before_any_batch() -> None:
    _TARGETS["fresh"] = InMemoryTarget()
    copy = pickle.loads(pickle.dumps(RegisteredTargetSink("fresh", sink_id="events")))
    assert repr(copy) == "RegisteredTargetSink(sink_id='events')"


# --- entry-point checks ------------------------------------------------------------------


class FakeStreamingDataFrame:
    isStreaming = True

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the sink touched {name!r} of a streaming DataFrame")


@pytest.mark.parametrize("kind", list(SINKS))
def test_calling_the_sink_with_a_streaming_dataframe_is_refused(
    target: InMemoryTarget, kind: str
) -> None:
    sink = SINKS[kind](target, sink_id="events")
    with pytest.raises(ConfigurationError) as info:
        sink(FakeStreamingDataFrame(), 0)  # type: ignore[arg-type]
    assert "writeStream.foreachBatch(sink)" in str(info.value)
    assert info.value.sink_id == "events"
    assert target.ledger("events").bound_query() is None


@pytest.mark.parametrize("batch_id", [-1, True, False, 1.0, "1", None, 2**0.5])
def test_invalid_batch_ids_are_refused(target: InMemoryTarget, batch_id: Any) -> None:
    sink = InMemoryPreparedSink(target, sink_id="events")
    with pytest.raises(ConfigurationError, match="batch id must be an int >= 0"):
        sink.write_batch(LocalBatch(batch_rows(0)), batch_id, query_id=QUERY)
    assert sink._driver is None  # refused before touching the ledger
    assert target.committed_rows() == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sink_id": "bad id"}, "invalid sink_id"),
        ({"sink_id": "events", "retry": 3}, "retry must be a RetryPolicy"),
        ({"sink_id": "events", "on_replay_mismatch": "ignore"}, "on_replay_mismatch"),
        ({"sink_id": "events", "keep_batches": 0}, "keep_batches"),
        ({"sink_id": "events", "keep_batches": 1.5}, "keep_batches"),
    ],
)
def test_invalid_options_are_refused(
    target: InMemoryTarget, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        InMemoryPreparedSink(target, **kwargs)


@pytest.mark.parametrize("slots", [0, -1, True, 2.0])
def test_invalid_slot_counts_are_refused(target: InMemoryTarget, slots: Any) -> None:
    with pytest.raises(ConfigurationError, match="slots must be an int >= 1"):
        InMemoryTaskCommitSink(target, sink_id="events", slots=slots)


def test_keep_batches_prunes_the_ledger(target: InMemoryTarget) -> None:
    sink = InMemoryPreparedSink(target, sink_id="events", keep_batches=2)
    for b in range(5):
        write(sink, b)
    assert [e.batch_id for e in target.ledger("events").entries()] == [3, 4]
    assert_exact(target, 0, 1, 2, 3, 4)


def test_close_releases_the_ledger_and_the_sink_can_go_on(target: InMemoryTarget) -> None:
    sink = InMemoryPreparedSink(target, sink_id="events")
    write(sink, 0)
    sink.close()
    assert sink._driver is None
    sink.close()  # twice is fine
    write(sink, 1)
    assert_exact(target, 0, 1)


# --- replays -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(SINKS))
def test_nondeterministic_replay_may_be_accepted_with_a_warning(
    target: InMemoryTarget, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    write(SINKS[kind](target, sink_id="events"), 0)
    with pytest.raises(NonDeterministicReplayError):
        write(SINKS[kind](target, sink_id="events"), 0, rows_of=9)
    lenient = SINKS[kind](target, sink_id="events", on_replay_mismatch="warn")
    with caplog.at_level(logging.WARNING):
        metrics = write(lenient, 0, rows_of=9)
    assert metrics.outcome == "replayed"
    assert any("differs" in r.getMessage() for r in caplog.records)
    assert_exact(target, 0)  # the committed rows are kept


def test_replay_of_a_batch_split_differently_is_recognised(target: InMemoryTarget) -> None:
    sink = InMemoryPreparedSink(target, sink_id="events")
    write(sink, 0, partitions=3)
    parts: Sequence[Sequence[pa.RecordBatch]] = [
        batch_rows(0).slice(0, 2).to_batches(),
        batch_rows(0).slice(2).to_batches(max_chunksize=1),
    ]
    assert sink.write_batch(LocalBatch(parts), 0, query_id=QUERY).outcome == "replayed"
    assert_exact(target, 0)


# --- two drivers -------------------------------------------------------------------------


class HookedLedger(Ledger):
    """Delegates to ``inner``; calls ``before_decide`` (once) just before deciding."""

    def __init__(self, inner: Ledger, before_decide: Callable[[], None]) -> None:
        self.inner = inner
        self.sink_id = inner.sink_id
        self.before_decide: Callable[[], None] | None = before_decide

    def decide(self, entry: LedgerEntry) -> LedgerEntry:
        hook, self.before_decide = self.before_decide, None
        if hook is not None:
            hook()
        return self.inner.decide(entry)

    def bound_query(self) -> str | None:
        return self.inner.bound_query()

    def bind_query(self, query_id: str, *, reset: bool = False) -> int:
        return self.inner.bind_query(query_id, reset=reset)

    def get(self, batch_id: int) -> LedgerEntry | None:
        return self.inner.get(batch_id)

    def forbid_decision(self, batch_id: int, run_id: str) -> LedgerEntry | None:
        return self.inner.forbid_decision(batch_id, run_id)

    def mark_committed(self, batch_id: int) -> None:
        self.inner.mark_committed(batch_id)

    def entries(self) -> Sequence[LedgerEntry]:
        return self.inner.entries()

    def prune(self, keep: int) -> None:
        self.inner.prune(keep)


class RacingSink(InMemoryPreparedSink):
    def __init__(self, target: InMemoryTarget, before_decide: Callable[[], None],
                 **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        self.before_decide = before_decide

    def create_ledger(self) -> Ledger:
        return HookedLedger(super().create_ledger(), self.before_decide)


def test_a_second_driver_sweeping_before_the_decision_fences_the_first(
    target: InMemoryTarget,
) -> None:
    write(InMemoryPreparedSink(target, sink_id="events"), 0)
    second = InMemoryPreparedSink(target, sink_id="events")
    swept = []

    def second_driver_starts() -> None:
        # Spark replays batch 0 on the new driver: it reconciles first, and its sweep
        # rolls back the first driver's prepared, undecided transactions of batch 1.
        prepared_before = len(target.prepared)
        write(second, 0)
        swept.append((prepared_before, len(target.prepared)))

    first = RacingSink(target, second_driver_starts, sink_id="events")
    first.write_batch(LocalBatch(batch_rows(0), partitions=3), 0, query_id=QUERY)  # replay
    with pytest.raises(FencedError) as info:
        write(first, 1)
    assert swept == [(3, 0)]
    assert info.value.batch_id == 1
    assert first.last_metrics is not None and first.last_metrics.outcome == "failed"
    assert_exact(target, 0)  # batch 1: nothing committed, nothing left prepared

    # Both retry (in either order), and the output is exact.
    assert write(first, 1).outcome == "committed"
    assert write(second, 1).outcome == "replayed"
    write(second, 2)
    assert_exact(target, 0, 1, 2)


def test_a_second_driver_deciding_first_makes_the_first_replay(target: InMemoryTarget) -> None:
    second = InMemoryPreparedSink(target, sink_id="events")
    first = RacingSink(target, lambda: write(second, 0), sink_id="events")
    metrics = write(first, 0)
    # The second driver swept the first's transactions, wrote and decided batch 0 itself;
    # the first found that decision, aborted its own transactions and did not commit.
    assert metrics.outcome == "replayed"
    assert second.last_metrics is not None and second.last_metrics.outcome == "committed"
    assert_exact(target, 0)
    write(first, 1)
    assert_exact(target, 0, 1)


def test_sink_ids_that_extend_each_other_do_not_share_anything(target: InMemoryTarget) -> None:
    crash.arm(CrashPoint.BEFORE_DECISION, sink_id="events-2")
    with pytest.raises(SimulatedCrash):
        write(InMemoryPreparedSink(target, sink_id="events-2"), 0)
    theirs = set(target.prepared)
    assert len(theirs) == 3
    write(InMemoryPreparedSink(target, sink_id="events"), 0)
    write(InMemoryPreparedSink(target, sink_id="event"), 0)
    assert set(target.prepared) == theirs  # neither touched the other sink's
    write(InMemoryPreparedSink(target, sink_id="events-2"), 0)
    assert collections.Counter(target.committed_rows()) == collections.Counter(
        expected(0, 0, 0)
    )
    assert target.lingering() == 0


def test_no_retry_policy_fails_on_the_first_transient_error(target: InMemoryTarget) -> None:
    sink = FlakyCommitSink(target, failures=1, sink_id="events", retry=NoRetry(),
                           outage_timeout=0)
    with pytest.raises(RetriesExhaustedError) as info:
        write(sink, 0)
    assert info.value.attempts == 1
    assert write(InMemoryPreparedSink(target, sink_id="events"), 0).outcome == "replayed"
    assert_exact(target, 0)


class NoAccessSink(InMemoryPreparedSink):
    """Refuses to open a transaction in every task (bad credentials, missing privilege)."""

    def begin_transaction(self, txn: Any) -> Any:
        raise ConfigurationError("permission denied: grant the sink's role INSERT")


class NoAccessSlotSink(InMemoryTaskCommitSink):
    def open_slot(self, slot: Any) -> Any:
        raise ConfigurationError("permission denied: grant the sink's role INSERT")


@pytest.mark.parametrize("cls", [NoAccessSink, NoAccessSlotSink])
def test_error_while_a_task_begins_is_returned_not_retried(
    target: InMemoryTarget, cls: type[TwoPhaseCommitSink]
) -> None:
    """A deterministic error raised before the task has a transaction reaches the caller
    as the library's own error (Spark would retry a raised one, then report a traceback
    string); nothing is committed and the fixed sink then writes the batch once."""
    with pytest.raises(ConfigurationError, match="permission denied") as info:
        write(cls(target, sink_id="events"), 0)  # type: ignore[call-arg]
    assert (info.value.sink_id, info.value.batch_id) == ("events", 0)
    assert info.value.transaction_id is not None
    assert_exact(target)
    fixed = (InMemoryPreparedSink if cls is NoAccessSink else InMemoryTaskCommitSink)
    write(fixed(target, sink_id="events"), 0)
    assert_exact(target, 0)
