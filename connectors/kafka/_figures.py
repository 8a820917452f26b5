"""KafkaSink's own figures: each slot's, returned by its task beside its commit
(:func:`slot_task_figures`), and the batch's, summarised from them on the driver
(:func:`slot_figures`): the produce paths' rows, the longest slot transaction and barrier
wait, and a warning when a slot's transaction came near ``transaction.timeout.ms``."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from connectors.core.metrics import BatchMetrics
from connectors.kafka._config import TIMEOUT_WARN_RATIO
from connectors.kafka._produce import PRODUCE_PATHS

if TYPE_CHECKING:
    from connectors.kafka._task_slot import Slot

__all__ = ["slot_figures", "slot_task_figures"]

logger = logging.getLogger(__name__)


def _produced(path: str) -> str:
    """The figure (and batch metric) of the rows a produce path enqueued."""
    return f"produce_{path}_rows"


def slot_task_figures(handle: Slot, txn_ms: float) -> dict[str, float]:
    """Task, after a slot committed: its figures (``TaskOutcome.figures``). ``txn_ms``: the
    transaction's life, its barrier wait ``wait_ms`` among it; ``rows`` the slot wrote;
    ``reused`` (1: the producer was kept from an earlier task), ``by_other`` (1: another
    attempt had committed the slot); ``produce_<path>_rows`` per produce path that ran."""
    figures = {
        "txn_ms": round(txn_ms, 1),
        "wait_ms": round(handle.wait_ms, 1),
        "rows": float(handle.rows),
        "reused": float(handle.reused),
        "by_other": float(handle.committed_by_other),
    }
    figures.update({_produced(path): float(rows) for path, rows in handle.paths.items()})
    return figures


def slot_figures(tasks: Sequence[Mapping[str, float]], metrics: BatchMetrics,
                 limit_ms: int) -> None:
    """Add the batch's slot figures (``tasks``: what its slots returned,
    :attr:`BatchMetrics.task_figures <connectors.core.metrics.BatchMetrics.task_figures>`;
    none when no slot ran on this driver, a replay or a recovered batch: every figure is
    then 0) to ``metrics``; warn when a slot's transaction reached 80% of
    ``transaction.timeout.ms`` (``limit_ms``)."""
    longest, waited = 0.0, 0.0
    # Rows per produce path: produce_native_rows / produce_batch_rows / produce_record_rows.
    produced = dict.fromkeys(PRODUCE_PATHS, 0)
    for figures in tasks:
        longest = max(longest, float(figures.get("txn_ms", 0)))
        waited = max(waited, float(figures.get("wait_ms", 0)))
        for path in PRODUCE_PATHS:
            produced[path] += int(figures.get(_produced(path), 0))
    for path, rows in produced.items():
        metrics.extra[_produced(path)] = rows
    if any(produced.values()):  # the path that produced the most rows
        metrics.path = max(produced, key=lambda path: produced[path])
    metrics.extra["txn_ms"] = round(longest, 1)
    metrics.extra["barrier_wait_ms"] = round(waited, 1)
    if longest >= TIMEOUT_WARN_RATIO * limit_ms:
        logger.warning(
            "sink %s batch %d: a slot's transaction took %.0f ms (barrier wait %.0f ms), "
            "%.0f%% of transaction.timeout.ms=%d: raise transaction.timeout.ms (at most "
            "the broker's transaction.max.timeout.ms), use more slots or smaller batches",
            metrics.sink_id, metrics.batch_id, longest, waited, 100 * longest / limit_ms,
            limit_ms)
