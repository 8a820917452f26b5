"""Per-batch metrics: one structured log line per batch, kept on the sink, and handed to
the process's metrics exporters.

The exporters themselves (Prometheus, OpenTelemetry) live in :mod:`connectors.observe`,
outside the core, which imports no optional library: the core only keeps the registration
point below. :meth:`BatchMetrics.emit` hands every batch's figures to each registered
exporter; an exporter that raises never fails the batch (a WARNING names it, once).

Example::

    >>> class Seen:
    ...     key, travels, got = "example:seen", False, []
    ...     def start(self): pass
    ...     def record(self, metrics): self.got.append(metrics.outcome)
    ...     def close(self): pass
    >>> seen = register_exporter(Seen())
    >>> BatchMetrics("events", 0, "prepare_in_task", outcome="committed").emit()
    >>> seen.got
    ['committed']
    >>> unregister_exporter(seen)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Protocol, TypeVar

__all__ = ["BatchMetrics", "MetricsExporter", "adopt_exporters", "register_exporter",
           "registered_exporters", "unregister_exporter"]

logger = logging.getLogger("connectors.metrics")  # the channel of the per-batch lines
_log = logging.getLogger(__name__)  # this module's own warnings

#: Fields added after the first release of the log line: printed at its end, after the
#: sink's ``extra`` figures, so that the line's earlier fields keep their places.
_TAIL = ("lingering", "path")


@dataclass
class BatchMetrics:
    """What one batch did. The last batch's metrics are on ``sink.last_metrics``.

    ``outcome`` is ``committed`` (new rows written), ``replayed`` (the batch was already
    committed: nothing written) or ``failed``. Times are milliseconds: ``prepare_ms``
    (the tasks), ``decide_ms`` (recording the decision), ``commit_ms`` (commits and the
    ledger's commit record); ``extra["total_ms"]`` is the whole batch. ``retries`` counts
    retried transient failures, ``reconciled`` transactions finished (or batches recorded)
    from an earlier run, ``aborted`` transactions rolled back. ``lingering`` is the most of
    this sink's prepared transactions a sweep of the batch found (before settling them:
    what an earlier run or a losing attempt left). ``path`` names the write path the batch
    took where the sink has several (Kafka: ``native``, ``batch``, ``record``; Delta:
    ``tag``, ``txn_seed``, ``txn``), empty otherwise.

    ``task_figures``: the figures each task of the batch returned
    (:attr:`TaskOutcome.figures <connectors.core.batch.TaskOutcome.figures>`, e.g. a Kafka
    slot's transaction time), one mapping per task that returned any, in partition order,
    for the sink's ``report_metrics`` to summarise into ``extra`` (the last run of the
    batch's tasks on this driver: a restarted batch's replace an earlier attempt's). Empty
    when none ran here (a replay the ledger had, a batch recovered from an earlier run).
    Not emitted as-is: :meth:`as_dict`, the log line and the exporters leave it out.
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
    lingering: int = 0
    path: str = ""
    task_figures: list[Mapping[str, float]] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        """The batch's figures, flat (``extra``'s keys among them); without
        ``task_figures`` (a sink's ``report_metrics`` summarises them)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "task_figures"}
        tail = {key: data.pop(key) for key in _TAIL}
        data.update(data.pop("extra"))
        data.update(tail)
        return data

    def log_line(self) -> str:
        """``key=value`` pairs, one line, stable order."""
        parts = []
        for key, value in self.as_dict().items():
            text = f"{value:.1f}" if isinstance(value, float) else str(value)
            parts.append(f"{key}={text}")
        return " ".join(parts)

    def emit(self) -> None:
        """Log the batch's line, then hand the figures to every registered exporter."""
        logger.info("batch %s", self.log_line())
        for exporter in registered_exporters():
            try:
                exporter.record(self)
            except Exception as exc:  # an exporter never fails a batch
                _warn_once(exporter.key, "recording a batch", exc)


class MetricsExporter(Protocol):
    """What the core asks of a metrics exporter (see :mod:`connectors.observe`).

    ``key`` names it (one exporter per key in a process, e.g. ``prometheus:9464``).
    ``travels``: whether a sink pickled for another driver process (Spark Connect's
    foreachBatch worker) carries it there, to be started on that process's first batch.
    """

    @property
    def key(self) -> str: ...

    @property
    def travels(self) -> bool: ...

    def start(self) -> None: ...

    def record(self, metrics: BatchMetrics) -> None: ...

    def close(self) -> None: ...


E = TypeVar("E", bound=MetricsExporter)
_exporters: dict[str, MetricsExporter] = {}
_warned: set[str] = set()
_lock = threading.Lock()


def register_exporter(exporter: E) -> E:
    """Start ``exporter`` and hand it every batch's metrics from now on, process-wide.

    An exporter of the same key already registered is kept and returned instead (calling
    this twice, as a re-run notebook cell does, starts nothing twice)."""
    with _lock:
        found = _exporters.get(exporter.key)
        if found is not None:
            return found  # type: ignore[return-value]
        exporter.start()
        _exporters[exporter.key] = exporter
        _warned.discard(exporter.key)
        return exporter


def unregister_exporter(exporter: MetricsExporter) -> None:
    """Stop handing metrics to ``exporter`` (its ``close`` is the caller's)."""
    with _lock:
        if _exporters.get(exporter.key) is exporter:
            del _exporters[exporter.key]


def registered_exporters() -> tuple[MetricsExporter, ...]:
    """The exporters registered in this process, in registration order."""
    with _lock:
        return tuple(_exporters.values())


def adopt_exporters(exporters: Iterable[MetricsExporter]) -> None:
    """Register the exporters a sink carried from the process that pickled it and that
    this process lacks (Spark Connect's foreachBatch worker). A failure to start one is a
    WARNING, once, never the batch's failure."""
    for exporter in exporters:
        try:
            register_exporter(exporter)
        except Exception as exc:
            _warn_once(exporter.key, "starting", exc)


def _warn_once(key: str, doing: str, exc: BaseException) -> None:
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    # The error's type (and an OSError's reason), never its message: that could quote an
    # endpoint's credentials.
    reason = f": {exc.strerror}" if isinstance(exc, OSError) and exc.strerror else ""
    _log.warning("metrics exporter %s: %s failed (%s%s); batches go on, its figures may "
                 "be incomplete (this warning is not repeated)", key, doing,
                 type(exc).__name__, reason)
