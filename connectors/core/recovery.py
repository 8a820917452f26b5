"""Recovery: settle what earlier runs (crashed drivers, losing task attempts) left behind.

For PREPARE_IN_TASK sinks the rule is Flink's ``recoverAndCommit`` / ``recoverAndAbort``
with presumed abort:

- a transaction listed in a decision is committed, always;
- any other prepared transaction of *exactly this sink* is rolled back, after recording in
  the ledger that its run may never decide its batch (so a live driver that is about to
  decide cannot race the roll-back: the ledger serializes the two).

:func:`reconcile_prepared` runs on the first batch of every driver run (state
RECONCILING); :func:`sweep_prepared` runs before and after every batch, because losing
retries, speculative attempts and zombie tasks can prepare at any time.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any

from connectors.core.naming import TransactionId
from connectors.core.protocol import BatchState
from connectors.core.retry import call_with_retry

if TYPE_CHECKING:
    from connectors.core.driver import DriverState
    from connectors.core.metrics import BatchMetrics
    from connectors.core.template import PreparedTransactionSink

__all__ = ["reconcile_prepared", "sweep_prepared"]

logger = logging.getLogger("connectors.core.recovery")


def reconcile_prepared(
    sink: PreparedTransactionSink[Any], state: DriverState, metrics: BatchMetrics
) -> None:
    """RECONCILING: finish every decided batch, then sweep undecided transactions."""
    from connectors.core.driver import finish_decided

    for entry in state.ledger.unfinished():
        logger.info(
            "sink %s: RECONCILING batch %d: committing %d decided transaction(s)",
            sink.sink_id, entry.batch_id, len(entry.commits),
        )
        finish_decided(sink, state.ledger, entry, metrics)
        metrics.reconciled += len(entry.commits)
    sweep_prepared(sink, state, metrics)


def sweep_prepared(
    sink: PreparedTransactionSink[Any], state: DriverState, metrics: BatchMetrics
) -> None:
    """Settle every prepared transaction of exactly this sink."""
    from connectors.core.driver import finish_decided

    ledger = state.ledger
    retry = partial(call_with_retry, policy=sink.retry, sink_id=sink.sink_id)
    prepared = call_with_retry(
        lambda: list(sink.recover()), policy=sink.retry, description="listing prepared "
        "transactions", sink_id=sink.sink_id,
    )
    for raw in prepared:
        tid = TransactionId.parse(raw)
        if tid is None or not tid.belongs_to(sink.sink_id):
            continue  # another sink's, or not ours at all: never touched
        entry = ledger.get(tid.batch_id)
        if entry is None:
            # No decision: forbid this run's decision first, then roll back.
            entry = ledger.abort(tid.batch_id, tid.run_id)
        if entry is not None and raw in {c.transaction_id for c in entry.commits}:
            if entry.state is BatchState.DECIDED:
                finish_decided(sink, ledger, entry, metrics)
            else:
                # Decided and recorded committed, yet still prepared: commit again
                # (idempotent); the decision is the truth.
                commit = next(c for c in entry.commits if c.transaction_id == raw)
                retry(partial(sink.commit, commit), description=f"commit of {raw}",
                      batch_id=tid.batch_id, transaction_id=raw)
            metrics.reconciled += 1
            continue
        logger.info(
            "sink %s: rolling back undecided transaction %s (batch %d, run %s)",
            sink.sink_id, raw, tid.batch_id, tid.run_id,
        )
        retry(partial(sink.abort, raw), description=f"roll-back of {raw}",
              batch_id=tid.batch_id, transaction_id=raw)
        metrics.aborted += 1
