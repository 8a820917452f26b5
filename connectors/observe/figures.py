"""A batch's metrics as the exporters count them: one function both exporters share, so
that Prometheus and OpenTelemetry always show the same figures.

Example::

    >>> from connectors.core.metrics import BatchMetrics
    >>> m = BatchMetrics("events", 7, "prepare_in_task", outcome="committed", rows=3,
    ...                  prepare_ms=250.0, extra={"total_ms": 400.0})
    >>> f = figures_of(m)
    >>> f.counts["connectors_rows_total"], f.durations["total"], f.last_committed
    (3, 0.4, 7)
    >>> failed = figures_of(BatchMetrics("events", 9, "prepare_in_task", outcome="failed"))
    >>> lag_after(f, None), lag_after(failed, 7), lag_after(failed, None)
    (0, 2, 1)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from connectors.core.metrics import BatchMetrics
from connectors.observe.names import DEFAULT_PATH

__all__ = ["BatchFigures", "figures_of", "lag_after"]


@dataclass(frozen=True)
class BatchFigures:
    """What one batch adds: ``labels`` (``sink_id``, ``family``), ``counts`` (counter
    name -> increment), ``durations`` (phase -> seconds), the gauges' new values."""

    labels: dict[str, str]
    batch_id: int
    outcome: str
    path: str
    counts: dict[str, int]
    durations: dict[str, float]
    lingering: int
    last_committed: int | None
    ended: float


def figures_of(metrics: BatchMetrics) -> BatchFigures:
    """The figures of ``metrics``. Rows and bytes count whatever the outcome: the
    coordinator sets them only once the batch's rows are committed, so a batch that fails
    after its commit (Spark replays it, and the replay writes nothing) still counts them."""
    return BatchFigures(
        labels={"sink_id": metrics.sink_id, "family": metrics.family},
        batch_id=metrics.batch_id,
        outcome=metrics.outcome,
        path=metrics.path or DEFAULT_PATH,
        counts={
            "connectors_rows_total": metrics.rows,
            "connectors_bytes_total": metrics.bytes,
            "connectors_tasks_total": metrics.tasks,
            "connectors_retries_total": metrics.retries,
            "connectors_reconciled_transactions_total": metrics.reconciled,
            "connectors_aborted_transactions_total": metrics.aborted,
        },
        durations={
            "prepare": metrics.prepare_ms / 1000,
            "decide": metrics.decide_ms / 1000,
            "commit": metrics.commit_ms / 1000,
            "total": float(metrics.extra.get("total_ms", 0.0)) / 1000,
        },
        lingering=metrics.lingering,
        last_committed=metrics.batch_id if metrics.outcome in ("committed", "replayed")
        else None,
        ended=time.time(),
    )


def lag_after(figures: BatchFigures, last_committed: int | None) -> int:
    """The sink's lag behind Spark's offset log once this batch ended, in batches.

    Spark writes batch N to its offset log before it hands N to the sink, and plans N + 1
    only once N is in its commit log: the batch in hand is the log's head. So the lag is 0
    after a committed (or replayed) batch, and after a failed batch N it is N minus the
    last batch this process saw committed (``last_committed``), or 1 (at least the batch in
    hand) when it saw none. A driver that is stuck or dead records nothing: ``connectors
    status --watch`` measures the lag from outside (offset log against ledger)."""
    if figures.last_committed is not None:
        return 0
    if last_committed is not None and last_committed < figures.batch_id:
        return figures.batch_id - last_committed
    return 1
