"""OpenTelemetry: the sinks' metrics as instruments of the ``opentelemetry-api`` package
(the ``otel`` extra). The application's SDK and exporter (OTLP, Prometheus, console...)
decide where they go; without an SDK the API records nothing. Names:
:mod:`connectors.observe.names`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from connectors._deps import require
from connectors.core.metrics import BatchMetrics, unregister_exporter
from connectors.observe.figures import figures_of, lag_after
from connectors.observe.names import DURATION_BUCKETS, METRICS, MetricName

__all__ = ["METER_NAME", "OpenTelemetryMetrics"]

#: The instrumentation scope of every instrument.
METER_NAME = "connectors"
Attributes = tuple[tuple[str, str], ...]


class OpenTelemetryMetrics:
    """Export every sink's batch metrics through OpenTelemetry (give it to
    :func:`connectors.export_metrics`).

    Args:
        meter_provider: the ``MeterProvider`` to record with; default the global one
            (``opentelemetry.metrics.set_meter_provider``, or the auto-instrumentation's).

    Example::

        >>> import connectors
        >>> from opentelemetry.sdk.metrics import MeterProvider
        >>> from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        >>> reader = InMemoryMetricReader()
        >>> exporter = connectors.export_metrics(
        ...     connectors.OpenTelemetryMetrics(MeterProvider(metric_readers=[reader])))
        >>> exporter.close()
    """

    def __init__(self, meter_provider: Any = None) -> None:
        self._provider = meter_provider
        self._lock = threading.Lock()
        self._instruments: dict[str, Any] | None = None
        #: The gauges' last values: metric -> attributes -> value (read by callbacks).
        self._gauges: dict[str, dict[Attributes, float]] = {}

    def __repr__(self) -> str:
        given = "given" if self._provider is not None else "global"
        return f"OpenTelemetryMetrics(meter_provider={given})"

    def __getstate__(self) -> dict[str, Any]:
        return {}  # a provider stays in its process; the other one records with its global

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    @property
    def travels(self) -> bool:
        """Carried by a sink to Spark Connect's foreachBatch worker when it records with
        the global provider (a given provider object stays in its process)."""
        return self._provider is None

    @property
    def key(self) -> str:
        return "otel:global" if self._provider is None else f"otel:{id(self._provider)}"

    def start(self) -> None:
        api = require("opentelemetry.metrics", extra="otel", feature="OpenTelemetryMetrics")
        provider = self._provider if self._provider is not None else api.get_meter_provider()
        meter = provider.get_meter(METER_NAME)
        instruments: dict[str, Any] = {}
        for m in METRICS:
            if m.kind == "counter":
                instruments[m.prometheus] = meter.create_counter(
                    m.otel, unit=m.unit, description=m.description)
            elif m.kind == "histogram":
                instruments[m.prometheus] = meter.create_histogram(
                    m.otel, unit=m.unit, description=m.description,
                    explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
            else:
                self._gauges[m.prometheus] = {}
                instruments[m.prometheus] = meter.create_observable_gauge(
                    m.otel, callbacks=[self._callback(api, m)], unit=m.unit,
                    description=m.description)
        with self._lock:
            self._instruments = instruments

    def _callback(self, api: Any, metric: MetricName) -> Any:
        def observe(_options: Any) -> Iterator[Any]:
            with self._lock:
                values = list(self._gauges.get(metric.prometheus, {}).items())
            for attributes, value in values:
                yield api.Observation(value, dict(attributes))

        return observe

    def record(self, metrics: BatchMetrics) -> None:
        instruments = self._instruments
        if instruments is None:
            return
        f = figures_of(metrics)
        base = tuple(f.labels.items())
        instruments["connectors_batches_total"].add(
            1, {**f.labels, "outcome": f.outcome, "path": f.path})
        for name, value in f.counts.items():
            instruments[name].add(value, f.labels)
        for phase, seconds in f.durations.items():
            instruments["connectors_batch_duration_seconds"].record(
                seconds, {**f.labels, "phase": phase})
        with self._lock:
            self._gauges["connectors_lingering_transactions"][base] = f.lingering
            last = self._gauges["connectors_last_committed_batch_id"].get(base)
            self._gauges["connectors_lag_batches"][base] = lag_after(
                f, None if last is None else int(last))
            if f.last_committed is not None:
                self._gauges["connectors_last_committed_batch_id"][base] = f.last_committed
            labels = (*base, ("outcome", f.outcome))  # not inside [...]: Python 3.10
            self._gauges["connectors_last_batch_timestamp_seconds"][labels] = f.ended

    def close(self) -> None:
        """Stop exporting (the provider, and its readers, are the application's)."""
        unregister_exporter(self)
        with self._lock:
            self._instruments = None
            for values in self._gauges.values():
                values.clear()
