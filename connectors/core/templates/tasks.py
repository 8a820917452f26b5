"""Executor side: what one Spark task does, for each protocol family.

Runs inside Python workers (``mapInArrow``); the sink arrives by cloudpickle, so nothing
here may rely on driver state. A task that fails aborts its own transaction; a task that is
killed leaves it to the driver's sweep. Errors that a retry cannot mend are *returned* in
the :class:`~connectors.core.batch.TaskOutcome` (see there); everything else is raised and
Spark retries the task.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from connectors.core.batch import BatchContext, TaskInfo, TaskOutcome
from connectors.core.errors import (
    BadInputError,
    ConfigurationError,
    ConnectorError,
    FatalError,
    NonDeterministicReplayError,
)
from connectors.core.fingerprint import Fingerprint, fingerprint_batch, split_row_hash
from connectors.core.ledgers.ledger import TaskCommit
from connectors.core.naming import TransactionId
from connectors.core.protocol.crash import crash_point
from connectors.core.protocol.replay import replay_mismatch
from connectors.core.protocol.transactions import SlotMarker, SlotTransaction, TaskTransaction
from connectors.core.states import CrashPoint

if TYPE_CHECKING:  # the hooks' one declaration (the template runs these tasks)
    from connectors.core.templates.families import PreparedTransactionSink, TaskCommitSink

__all__ = ["SlotMarker", "SlotTransaction", "TaskTransaction", "prepare_task", "slot_task"]

logger = logging.getLogger(__name__)

#: Errors that would fail again on a retried task: returned to the driver, not raised.
DETERMINISTIC_ERRORS: tuple[type[ConnectorError], ...] = (
    BadInputError,
    ConfigurationError,
    NonDeterministicReplayError,
    FatalError,
)


def _abort_quietly(action: str, fn: Any, handle: Any) -> None:
    try:
        fn(handle)
    except Exception as exc:  # the original failure matters more
        logger.warning("%s failed while handling an earlier error: %s", action, type(exc).__name__)


def _returned(
    exc: ConnectorError, sink_id: str, batch_id: int, transaction_id: str
) -> TaskOutcome:
    """A deterministic error as the task's outcome, with the ids filled in."""
    exc.sink_id, exc.batch_id = sink_id, batch_id
    exc.transaction_id = exc.transaction_id or transaction_id
    return TaskOutcome(error=exc)


def prepare_task(
    sink: PreparedTransactionSink[Any],
    run_id: str,
    batch_id: int,
    schema: pa.Schema,
    info: TaskInfo,
    batches: Iterator[pa.RecordBatch],
) -> TaskOutcome:
    """PREPARE_IN_TASK: begin, write every record batch, pre-commit; return the commit.

    Steps:
      1. begin a transaction named by sink, run, batch and Spark's task attempt id;
      2. write each Arrow record batch, fingerprinting it on the way;
      3. pre-commit (flush + prepare): after this the transaction survives the task;
      4. return the committable; on any failure before 4, abort the transaction.
    """
    tid = TransactionId(sink.sink_id, run_id, batch_id, info.task_attempt_id)
    # Step 1
    try:
        handle = sink.begin_transaction(TaskTransaction(tid, info.partition, schema))
    except DETERMINISTIC_ERRORS as exc:  # e.g. bad credentials: nothing to abort yet
        return _returned(exc, sink.sink_id, batch_id, str(tid))
    fp, nbytes = Fingerprint(), 0
    try:
        # Step 2
        for batch in batches:
            batch_fp, data = split_row_hash(batch)
            fp = fp + batch_fp
            nbytes += data.nbytes
            sink.write(handle, data)
        crash_point(
            CrashPoint.BEFORE_PRECOMMIT, sink_id=sink.sink_id, batch_id=batch_id,
            partition=info.partition,
        )
        # Step 3
        sink.pre_commit(handle, fp)
    except DETERMINISTIC_ERRORS as exc:
        _abort_quietly("abort_transaction", sink.abort_transaction, handle)
        return _returned(exc, sink.sink_id, batch_id, str(tid))
    except Exception:
        _abort_quietly("abort_transaction", sink.abort_transaction, handle)
        raise
    crash_point(
        CrashPoint.AFTER_PRECOMMIT, sink_id=sink.sink_id, batch_id=batch_id,
        partition=info.partition,
    )
    # Step 4
    return TaskOutcome(
        commit=TaskCommit(str(tid), info.partition, info.task_attempt_id, fp, nbytes)
    )


def slot_task(
    sink: TaskCommitSink[Any],
    batch_ctx: BatchContext,
    schema: pa.Schema,
    info: TaskInfo,
    batches: Iterator[pa.RecordBatch],
) -> TaskOutcome:
    """COMMIT_IN_TASK: one slot's transaction, committed in the task with its marker.

    Steps:
      1. open the slot (fence its previous owner, begin a transaction);
      2. read the slot's marker for this batch: if present, the slot is already committed:
         fingerprint the input, compare, write nothing;
      3. otherwise write every record batch, fingerprinting on the way;
      4. commit the rows together with the marker (sink, batch, slot, fingerprint); the
         slot's figures (what ``commit_slot`` returned) travel beside its commit.
    """
    slot = info.partition
    batch_id, run_id, generation = batch_ctx.batch_id, batch_ctx.run_id, batch_ctx.generation
    ctx = SlotTransaction(
        sink.sink_id, generation, batch_id, run_id, slot, info.task_attempt_id, schema,
        barrier=info.barrier,
    )
    # Step 1
    try:
        handle = sink.open_slot(ctx)
    except DETERMINISTIC_ERRORS as exc:
        return _returned(exc, sink.sink_id, batch_id, ctx.name)
    fp, nbytes = Fingerprint(), 0
    try:
        # Step 2
        marker = sink.read_marker(handle)
        if marker is not None:
            for batch in batches:
                fp = fp + fingerprint_batch(batch)
            _abort_quietly("abort_slot", sink.abort_slot, handle)
            if marker.fingerprint != fp:
                err = replay_mismatch(sink.sink_id, sink.on_replay_mismatch, batch_id,
                                      marker.fingerprint, fp, what=f"slot {slot}",
                                      transaction_id=ctx.name)
                if err is not None:
                    return TaskOutcome(error=err)
            commit = TaskCommit(ctx.name, slot, info.task_attempt_id, fp, replayed=True)
            return TaskOutcome(commit=commit)
        # Step 3
        for batch in batches:
            batch_fp, data = split_row_hash(batch)
            fp = fp + batch_fp
            nbytes += data.nbytes
            sink.write(handle, data)
        crash_point(
            CrashPoint.BEFORE_PRECOMMIT, sink_id=sink.sink_id, batch_id=batch_id, partition=slot
        )
        # Step 4
        marker = SlotMarker(sink.sink_id, generation, batch_id, slot, run_id, fp)
        figures = sink.commit_slot(handle, marker)
    except DETERMINISTIC_ERRORS as exc:
        _abort_quietly("abort_slot", sink.abort_slot, handle)
        return _returned(exc, sink.sink_id, batch_id, ctx.name)
    except Exception:
        _abort_quietly("abort_slot", sink.abort_slot, handle)
        raise
    crash_point(CrashPoint.AFTER_PRECOMMIT, sink_id=sink.sink_id, batch_id=batch_id, partition=slot)
    return TaskOutcome(commit=TaskCommit(ctx.name, slot, info.task_attempt_id, fp, nbytes),
                       figures=dict(figures or {}))
