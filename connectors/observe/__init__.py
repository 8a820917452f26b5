"""Metrics exporters: every sink's per-batch figures through Prometheus or OpenTelemetry.

Process-wide, one endpoint per driver: :func:`export_metrics` registers an exporter with
the core's registration point (:mod:`connectors.core.metrics`), and every sink of every
query on this driver hands it each batch's metrics from then on. Each exporter is
optional, off unless asked for, and needs its extra (``prometheus``, ``otel``). The names,
units and labels are in :mod:`connectors.observe.names` and ``docs/metrics.md``.

Example::

    >>> import connectors
    >>> exporter = connectors.export_metrics(
    ...     connectors.PrometheusMetrics(port=0, addr="127.0.0.1"))
    >>> exporter.port > 0
    True
    >>> exporter.close()
"""

from __future__ import annotations

from typing import TypeVar

from connectors.core.metrics import MetricsExporter, register_exporter
from connectors.observe.otel import OpenTelemetryMetrics
from connectors.observe.prometheus import PrometheusMetrics

__all__ = ["OpenTelemetryMetrics", "PrometheusMetrics", "export_metrics"]

E = TypeVar("E", bound=MetricsExporter)


def export_metrics(exporter: E) -> E:
    """Export the metrics of every sink's batches on this driver through ``exporter``
    (:class:`PrometheusMetrics`, :class:`OpenTelemetryMetrics`) from now on, until its
    ``close()``; returns it.

    Starts it now (an endpoint that cannot listen raises here, not in a batch). Calling
    it again with an equal exporter (same port, same provider) returns the first one. A
    failure while recording a batch never fails the batch: a WARNING names the exporter,
    once. Call it before starting the queries: under Spark Connect the sink carries the
    exporters registered when the query starts to the foreachBatch worker, which starts
    them there (see ``docs/metrics.md``).

    Example::

        >>> import connectors, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "connectors.prom")
        >>> exporter = connectors.export_metrics(
        ...     connectors.PrometheusMetrics(port=None, textfile=path))
        >>> os.path.exists(path)
        True
        >>> exporter.close()
    """
    return register_exporter(exporter)
