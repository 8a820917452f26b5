"""KafkaSink's own figures of a batch, from its ledger entry: the produce paths' rows,
the longest slot transaction and barrier wait, and a warning when a slot's transaction
came near ``transaction.timeout.ms``."""

from __future__ import annotations

import json
import logging

from connectors.core.ledgers.ledger import LedgerEntry
from connectors.core.metrics import BatchMetrics
from connectors.kafka._config import TIMEOUT_WARN_RATIO
from connectors.kafka._produce import PRODUCE_PATHS

__all__ = ["slot_figures"]

logger = logging.getLogger(__name__)


def slot_figures(entry: LedgerEntry | None, metrics: BatchMetrics, limit_ms: int) -> None:
    """Add the batch's slot figures (``entry``: its ledger entry) to ``metrics``; warn when
    a slot's transaction reached 80% of ``transaction.timeout.ms`` (``limit_ms``)."""
    if entry is None:
        return
    longest, waited = 0.0, 0.0
    # Rows per produce path: produce_native_rows / produce_batch_rows / produce_record_rows.
    produced = dict.fromkeys(PRODUCE_PATHS, 0)
    for commit in entry.commits:
        if commit.payload:
            info = json.loads(commit.payload)
            longest = max(longest, float(info.get("txn_ms", 0)))
            waited = max(waited, float(info.get("wait_ms", 0)))
            for path, rows in dict(info.get("produce_rows", {})).items():
                produced[path] = produced.get(path, 0) + int(rows)
    for path, rows in produced.items():
        metrics.extra[f"produce_{path}_rows"] = rows
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
