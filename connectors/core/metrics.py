"""Per-batch metrics: one structured log line per batch, and kept on the sink."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

__all__ = ["BatchMetrics"]

logger = logging.getLogger("connectors.metrics")


@dataclass
class BatchMetrics:
    """What one batch did. The last batch's metrics are on ``sink.last_metrics``.

    ``outcome`` is ``committed`` (new rows written), ``replayed`` (the batch was already
    committed: nothing written) or ``failed``.
    """

    sink_id: str
    batch_id: int
    family: str
    outcome: str = "failed"
    rows: int = 0
    bytes: int = 0
    tasks: int = 0
    prepare_ms: float = 0.0
    decide_ms: float = 0.0
    commit_ms: float = 0.0
    retries: int = 0
    reconciled: int = 0
    aborted: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data.update(data.pop("extra"))
        return data

    def log_line(self) -> str:
        """``key=value`` pairs, one line, stable order."""
        parts = []
        for key, value in self.as_dict().items():
            text = f"{value:.1f}" if isinstance(value, float) else str(value)
            parts.append(f"{key}={text}")
        return " ".join(parts)

    def emit(self) -> None:
        logger.info("batch %s", self.log_line())
