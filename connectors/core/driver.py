"""Driver side: decide, commit, record, for each protocol family.

Called by the template (:mod:`connectors.core.template`) once per batch, after the sink
was bound to its query and a previous run's leftovers were reconciled. Every step that
changes durable state is numbered in the docstrings and marked ``# Step N`` in the code.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from connectors.core import recovery
from connectors.core.batch import BatchContext, BatchInput, TaskOutcome
from connectors.core.crash import crash_point
from connectors.core.errors import (
    ConnectorError,
    NonDeterministicReplayError,
    ProtocolStateError,
    TransientError,
)
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledger import LedgerEntry, TaskCommit
from connectors.core.metrics import BatchMetrics
from connectors.core.naming import new_run_id
from connectors.core.protocol import BatchProtocol, BatchState, CrashPoint
from connectors.core.retry import call_with_retry
from connectors.core.tasks import prepare_task, slot_task

if TYPE_CHECKING:
    from connectors.core.ledger import Ledger
    from connectors.core.template import (
        DriverCommitSink,
        PreparedTransactionSink,
        TaskCommitSink,
        TwoPhaseCommitSink,
    )

__all__ = [
    "DriverState",
    "check_replay",
    "finish_decided",
    "run_driver_batch",
    "run_prepared_batch",
    "run_slot_batch",
]

logger = logging.getLogger("connectors.core")


@dataclass
class DriverState:
    """What one driver run of a sink holds: its ledger, run id and query binding."""

    ledger: Ledger
    run_id: str = field(default_factory=new_run_id)
    query_id: str | None = None
    generation: int = 0
    started: bool = False

    def context(self, sink_id: str, batch_id: int) -> BatchContext:
        return BatchContext(sink_id, batch_id, self.run_id, self.generation, self.query_id)

    def new_run(self) -> None:
        """Start a new run: new run id, and reconcile again before the next batch."""
        self.run_id = new_run_id()
        self.started = False


def _ms(start: float) -> float:
    return (time.monotonic() - start) * 1000


def _crash(sink: TwoPhaseCommitSink, point: CrashPoint, batch_id: int) -> None:
    crash_point(point, sink_id=sink.sink_id, batch_id=batch_id)


def check_replay(
    sink: TwoPhaseCommitSink,
    batch_id: int,
    recorded: Fingerprint | None,
    actual: Fingerprint | None,
) -> None:
    """The one replay policy: a replay must hold the rows that were committed."""
    if recorded is None or actual is None or recorded == actual:
        return
    err = NonDeterministicReplayError(
        f"replayed batch differs from the committed one: committed {recorded}, replay has "
        f"{actual}. The query is not deterministic (rand(), uuid(), a changed source?). "
        'Make it deterministic, or pass on_replay_mismatch="warn" to keep the committed rows',
        sink_id=sink.sink_id,
        batch_id=batch_id,
    )
    if sink.on_replay_mismatch == "fail":
        raise err
    logger.warning("%s", err)


def _split(
    sink: TwoPhaseCommitSink, outcomes: Sequence[TaskOutcome], batch_id: int
) -> tuple[list[TaskCommit], list[ConnectorError]]:
    commits = [o.commit for o in outcomes if o.commit is not None]
    errors = [o.error for o in outcomes if o.error is not None]
    partitions = [c.partition for c in commits]
    if len(set(partitions)) != len(partitions):
        raise ProtocolStateError(
            f"two task results for one partition ({sorted(partitions)}): the engine must "
            "return exactly one accepted attempt per partition",
            sink_id=sink.sink_id,
            batch_id=batch_id,
        )
    return sorted(commits, key=lambda c: c.partition), errors


def _retrying(sink: TwoPhaseCommitSink, metrics: BatchMetrics) -> Any:
    def count(_attempt: int, _error: BaseException, _delay: float) -> None:
        metrics.retries += 1

    return partial(call_with_retry, policy=sink.retry, on_retry=count, sink_id=sink.sink_id)


def finish_decided(
    sink: PreparedTransactionSink[Any], ledger: Ledger, entry: LedgerEntry, metrics: BatchMetrics
) -> None:
    """Commit every transaction of a decision, then record the batch as committed.

    Idempotent: runs again after any crash, commits what is still prepared, and relies on
    the participant to prove (not presume) what is already committed.
    """
    retry = _retrying(sink, metrics)
    start = time.monotonic()
    for i, commit in enumerate(entry.commits):
        retry(
            partial(sink.commit, commit),
            description=f"commit of {commit.transaction_id}",
            batch_id=entry.batch_id,
            transaction_id=commit.transaction_id,
        )
        if i == 0 and len(entry.commits) > 1:
            _crash(sink, CrashPoint.BETWEEN_COMMITS, entry.batch_id)
    retry(
        partial(ledger.mark_committed, entry.batch_id),
        description=f"recording batch {entry.batch_id} as committed",
        batch_id=entry.batch_id,
    )
    metrics.commit_ms += _ms(start)


def _decide(
    sink: TwoPhaseCommitSink, ledger: Ledger, entry: LedgerEntry, metrics: BatchMetrics
) -> LedgerEntry:
    """Record the decision; after an ambiguous failure re-read, never guess."""
    retry = _retrying(sink, metrics)
    try:
        return ledger.decide(entry)
    except TransientError:
        # The write may or may not have happened: the ledger is the only truth.
        found = retry(
            partial(ledger.get, entry.batch_id),
            description=f"re-reading the decision of batch {entry.batch_id}",
            batch_id=entry.batch_id,
        )
        if found is None:
            raise
        return found  # type: ignore[no-any-return]


def run_prepared_batch(
    sink: PreparedTransactionSink[Any],
    state: DriverState,
    batch: BatchInput,
    batch_id: int,
    metrics: BatchMetrics,
) -> None:
    """PREPARE_IN_TASK, on the driver.

    Steps:
      1. a batch the ledger already decided is a replay: check its fingerprint, finish
         its commits if needed, write nothing;
      2. sweep: roll back this sink's prepared transactions that no decision lists;
      3. run the tasks: each writes and prepares, and returns its committable;
      4. decide: record exactly the committables Spark returned (the commit point);
      5. commit each decided transaction (idempotent, retried), record COMMITTED;
      6. sweep again: losing attempts (retries, speculation) of this batch.
    """
    ledger = state.ledger
    protocol = BatchProtocol(sink.family, sink.sink_id, batch_id)
    # Step 1
    entry = ledger.get(batch_id)
    if entry is not None:
        check_replay(sink, batch_id, entry.fingerprint, batch.fingerprint())
        if entry.state is BatchState.DECIDED:
            finish_decided(sink, ledger, entry, metrics)
        metrics.outcome = "replayed"
        return
    # Step 2
    recovery.sweep_prepared(sink, state, metrics)
    sink.validate_input(batch.schema)
    batch = sink.partition_input(batch)
    # Step 3
    start = time.monotonic()
    task = partial(prepare_task, sink, state.run_id, batch_id, batch.schema)
    commits, errors = _split(sink, batch.run_tasks(task), batch_id)
    metrics.prepare_ms = _ms(start)
    metrics.tasks = len(commits) + len(errors)
    if errors:
        for commit in commits:
            try:
                sink.abort(commit.transaction_id)
            except Exception as exc:  # the sweep of the next run rolls it back
                logger.warning("sink %s: roll-back of %s failed (%s); the next sweep retries",
                               sink.sink_id, commit.transaction_id, type(exc).__name__)
        protocol.advance(BatchState.ABORTED)
        raise errors[0]
    protocol.advance(BatchState.PREPARED)
    _crash(sink, CrashPoint.BEFORE_DECISION, batch_id)
    # Step 4
    start = time.monotonic()
    fp = sum((c.fingerprint for c in commits), Fingerprint())
    mine = LedgerEntry(
        sink.sink_id, batch_id, state.run_id, BatchState.DECIDED, tuple(commits), fp,
        state.query_id,
    )
    decision = _decide(sink, ledger, mine, metrics)
    metrics.decide_ms = _ms(start)
    if decision.run_id != state.run_id:
        # Another driver decided this batch first: ours must never commit.
        logger.warning(
            "sink %s batch %d: decided by run %s, not this run %s; aborting this run's "
            "transactions", sink.sink_id, batch_id, decision.run_id, state.run_id,
        )
        for commit in commits:
            sink.abort(commit.transaction_id)
        check_replay(sink, batch_id, decision.fingerprint, fp)
        if decision.state is BatchState.DECIDED:
            finish_decided(sink, ledger, decision, metrics)
        metrics.outcome = "replayed"
        return
    protocol.advance(BatchState.DECIDED)
    _crash(sink, CrashPoint.AFTER_DECISION, batch_id)
    # Step 5
    finish_decided(sink, ledger, decision, metrics)
    protocol.advance(BatchState.COMMITTED)
    metrics.rows, metrics.bytes = fp.rows, sum(c.nbytes for c in commits)
    metrics.outcome = "committed"
    # Step 6
    recovery.sweep_prepared(sink, state, metrics)
    _crash(sink, CrashPoint.AFTER_COMMIT, batch_id)


def run_slot_batch(
    sink: TaskCommitSink[Any],
    state: DriverState,
    batch: BatchInput,
    batch_id: int,
    metrics: BatchMetrics,
) -> None:
    """COMMIT_IN_TASK, on the driver.

    Steps:
      1. a batch the ledger records as committed is a replay: check its fingerprint;
      2. place rows into the sink's slots by a hash of their content (of their
         ``slot_key`` column, where the sink names one and the row's is not null);
      3. run one task per slot: it commits its rows with its marker, or finds the marker
         of an earlier attempt and writes nothing;
      4. record the batch COMMITTED with every slot's fingerprint.
    """
    ledger = state.ledger
    protocol = BatchProtocol(sink.family, sink.sink_id, batch_id)
    # Step 1
    entry = ledger.get(batch_id)
    if entry is not None:
        check_replay(sink, batch_id, entry.fingerprint, batch.fingerprint())
        metrics.outcome = "replayed"
        return
    sink.validate_input(batch.schema)
    # Step 2
    slotted = batch.slotted(sink.slots, sink.slot_columns, key=sink.slot_key)
    # Step 3
    start = time.monotonic()
    task = partial(slot_task, sink, state.context(sink.sink_id, batch_id), batch.schema)
    try:
        commits, errors = _split(sink, slotted.run_tasks(task, barrier=sink.barrier), batch_id)
    except BaseException:
        sink.fence_all()
        raise
    metrics.prepare_ms = _ms(start)
    metrics.tasks = len(commits) + len(errors)
    if errors:
        sink.fence_all()
        protocol.advance(BatchState.ABORTED)
        raise errors[0]
    if sorted(c.partition for c in commits) != list(range(sink.slots)):
        raise ProtocolStateError(
            f"expected one result per slot 0..{sink.slots - 1}, got partitions "
            f"{[c.partition for c in commits]}",
            sink_id=sink.sink_id,
            batch_id=batch_id,
        )
    protocol.advance(BatchState.PREPARED)
    _crash(sink, CrashPoint.BEFORE_DECISION, batch_id)
    # Step 4
    start = time.monotonic()
    fp = sum((c.fingerprint for c in commits), Fingerprint())
    done = LedgerEntry(
        sink.sink_id, batch_id, state.run_id, BatchState.COMMITTED, tuple(commits), fp,
        state.query_id,
    )
    recorded = _decide(sink, ledger, done, metrics)
    check_replay(sink, batch_id, recorded.fingerprint, fp)
    protocol.advance(BatchState.DECIDED)
    protocol.advance(BatchState.COMMITTED)
    metrics.decide_ms = _ms(start)
    written = [c for c in commits if not c.replayed]
    metrics.rows = sum(c.fingerprint.rows for c in written)
    metrics.bytes = sum(c.nbytes for c in written)
    metrics.outcome = "committed" if written else "replayed"
    _crash(sink, CrashPoint.AFTER_COMMIT, batch_id)


def run_driver_batch(
    sink: DriverCommitSink,
    state: DriverState,
    batch: BatchInput,
    batch_id: int,
    metrics: BatchMetrics,
) -> None:
    """COMMIT_ON_DRIVER, on the driver.

    Steps:
      1. a batch the ledger records as committed is a replay: check its fingerprint;
      2. a batch the target already holds (crash after its commit) is recorded, not
         rewritten;
      3. commit the whole batch to the target, idempotently keyed by batch id (retried);
         a sink with ``fingerprint_in_commit`` returns the fingerprint its write observed;
      4. record the batch COMMITTED with its fingerprint.
    """
    ledger = state.ledger
    protocol = BatchProtocol(sink.family, sink.sink_id, batch_id)
    # Step 1
    entry = ledger.get(batch_id)
    if entry is not None:
        actual = sink.fingerprint_input(batch)
        recorded = entry.fingerprint
        if recorded is None and actual is not None:
            # Recorded without one: the sink recomputes it from what the target holds.
            recorded = sink.committed_fingerprint(state.context(sink.sink_id, batch_id))
        check_replay(sink, batch_id, recorded, actual)
        metrics.outcome = "replayed"
        return
    sink.validate_input(batch.schema)
    # A sink that observes the fingerprint inside its write skips the separate job.
    fp = None if sink.fingerprint_in_commit else sink.fingerprint_input(batch)
    record = LedgerEntry(
        sink.sink_id, batch_id, state.run_id, BatchState.COMMITTED, (), fp, state.query_id
    )
    ctx = state.context(sink.sink_id, batch_id)
    # Step 2
    if sink.is_committed(ctx):
        logger.info(
            "sink %s batch %d: RECONCILING: the target has the batch, recording it",
            sink.sink_id, batch_id,
        )
        _decide(sink, ledger, record, metrics)
        metrics.outcome, metrics.reconciled = "replayed", 1
        return
    _crash(sink, CrashPoint.BEFORE_DECISION, batch_id)
    # Step 3
    start = time.monotonic()
    observed = _retrying(sink, metrics)(
        partial(sink.commit_batch, batch, ctx),
        description=f"commit of batch {batch_id}",
        batch_id=batch_id,
    )
    if observed is not None:
        fp = observed
        record = dataclasses.replace(record, fingerprint=fp)
    metrics.commit_ms = _ms(start)
    protocol.advance(BatchState.DECIDED)
    _crash(sink, CrashPoint.AFTER_DECISION, batch_id)
    # Step 4
    _decide(sink, ledger, record, metrics)
    protocol.advance(BatchState.COMMITTED)
    metrics.rows = fp.rows if fp else 0
    metrics.outcome = "committed"
    _crash(sink, CrashPoint.AFTER_COMMIT, batch_id)
