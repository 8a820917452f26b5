"""Prometheus: the sinks' metrics on a scrape endpoint, in a textfile for the node
exporter's textfile collector, or in a registry the application already serves
(``prometheus_client``, the ``prometheus`` extra). Names: :mod:`connectors.observe.names`.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

from connectors._deps import require
from connectors.core.errors import ConfigurationError
from connectors.core.metrics import BatchMetrics, unregister_exporter
from connectors.observe.figures import figures_of, lag_after
from connectors.observe.names import DURATION_BUCKETS, METRICS

__all__ = ["PrometheusMetrics"]


class PrometheusMetrics:
    """Export every sink's batch metrics to Prometheus (give it to
    :func:`connectors.export_metrics`).

    Args:
        port: serve ``/metrics`` on this port (``0``: any free port, see :attr:`port`;
            ``None``: no endpoint). Prometheus's default for exporters is 9464 here.
        addr: the address the endpoint listens on (``0.0.0.0``, like ``prometheus_client``,
            so that a Prometheus on another host can scrape it).
        textfile: also write the metrics to this file after every batch (atomically), for
            the node exporter's textfile collector (a ``.prom`` file in its directory).
        registry: a ``prometheus_client`` ``CollectorRegistry`` to put the metrics in
            (the application's own, served by its own endpoint); default a new one.

    Example::

        >>> import connectors, urllib.request
        >>> exporter = connectors.export_metrics(
        ...     connectors.PrometheusMetrics(port=0, addr="127.0.0.1"))
        >>> url = f"http://127.0.0.1:{exporter.port}/metrics"
        >>> "connectors_batches_total" in urllib.request.urlopen(url).read().decode()
        True
        >>> exporter.close()
    """

    # All interfaces, as prometheus_client: a Prometheus scrapes the driver from its own host
    # (the figures hold no row value and no secret).
    def __init__(self, port: int | None = 9464, *, addr: str = "0.0.0.0",  # noqa: S104
                 textfile: str | None = None, registry: Any = None) -> None:
        if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                                 or not 0 <= port <= 65535):
            raise ConfigurationError(f"port must be an int in 0..65535 or None, not {port!r}")
        if port is None and textfile is None and registry is None:
            raise ConfigurationError("PrometheusMetrics needs a port, a textfile or a registry "
                                     "to export to")
        self._port, self._addr, self._textfile = port, addr, textfile
        self._registry = registry
        self._token = uuid.uuid4().hex[:12]  # tells port-0 exporters apart (pickled too)
        self._lock = threading.Lock()
        self._started: _Started | None = None

    def __repr__(self) -> str:
        return f"PrometheusMetrics(port={self._port!r}, textfile={self._textfile!r})"

    def __getstate__(self) -> dict[str, Any]:
        # The configuration only; the receiving process starts its own endpoint (a
        # registry object stays here: the other process gets a registry of its own).
        return {"port": self._port, "addr": self._addr, "textfile": self._textfile,
                "token": self._token}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._port, self._addr, self._textfile = state["port"], state["addr"], state["textfile"]
        self._token = state["token"]
        self._registry, self._lock, self._started = None, threading.Lock(), None

    @property
    def travels(self) -> bool:
        """Carried by a sink to Spark Connect's foreachBatch worker (and started there)
        when it has an endpoint or a textfile: an application's registry stays here."""
        return self._port is not None or self._textfile is not None

    @property
    def key(self) -> str:
        where = f"{self._addr}:{self._port}" if self._port is not None else "-"
        if self._port == 0:  # any free port: every such exporter is one of its own
            where += f"#{self._token}"
        registry = id(self._registry) if self._registry is not None else "-"
        return f"prometheus:{where}:{self._textfile or '-'}:{registry}"

    @property
    def port(self) -> int | None:
        """The port the endpoint listens on (the one chosen for ``port=0``) once started."""
        return self._started.port if self._started is not None else self._port

    @property
    def registry(self) -> Any:
        """The ``CollectorRegistry`` holding the metrics (once started)."""
        return self._started.registry if self._started is not None else self._registry

    def start(self) -> None:
        prom = require("prometheus_client", extra="prometheus", feature="PrometheusMetrics")
        with self._lock:
            if self._started is None:
                self._started = _Started(prom, self._registry, self._port, self._addr)
                if self._textfile:
                    self._started.write(self._textfile)

    def record(self, metrics: BatchMetrics) -> None:
        started = self._started
        if started is None:
            return
        started.record(metrics)
        if self._textfile:
            started.write(self._textfile)

    def close(self) -> None:
        """Stop exporting: unregister, and stop the endpoint."""
        unregister_exporter(self)
        with self._lock:
            started, self._started = self._started, None
        if started is not None:
            started.stop()


class _Started:
    """A started exporter's registry, instruments and endpoint."""

    def __init__(self, prom: Any, registry: Any, port: int | None, addr: str) -> None:
        self.prom = prom
        self.registry = registry if registry is not None else prom.CollectorRegistry()
        self.instruments: dict[str, Any] = {}
        for m in METRICS:
            if m.kind == "counter":
                # prometheus_client adds the ``_total`` suffix itself.
                self.instruments[m.prometheus] = prom.Counter(
                    m.prometheus.removesuffix("_total"), m.description, m.all_labels,
                    registry=self.registry)
            elif m.kind == "gauge":
                self.instruments[m.prometheus] = prom.Gauge(
                    m.prometheus, m.description, m.all_labels, registry=self.registry)
            else:
                self.instruments[m.prometheus] = prom.Histogram(
                    m.prometheus, m.description, m.all_labels, registry=self.registry,
                    buckets=DURATION_BUCKETS)
        self.last_committed: dict[tuple[str, str], int] = {}
        self.server: Any = None
        self.port = port
        if port is not None:
            self.server, _thread = prom.start_http_server(port, addr, registry=self.registry)
            self.port = int(self.server.server_port)

    def record(self, metrics: BatchMetrics) -> None:
        f = figures_of(metrics)
        sink, family = f.labels["sink_id"], f.labels["family"]
        i = self.instruments
        i["connectors_batches_total"].labels(sink, family, f.outcome, f.path).inc()
        for name, value in f.counts.items():
            i[name].labels(sink, family).inc(value)
        for phase, seconds in f.durations.items():
            i["connectors_batch_duration_seconds"].labels(sink, family, phase).observe(seconds)
        i["connectors_lingering_transactions"].labels(sink, family).set(f.lingering)
        i["connectors_lag_batches"].labels(sink, family).set(
            lag_after(f, self.last_committed.get((sink, family))))
        if f.last_committed is not None:
            self.last_committed[(sink, family)] = f.last_committed
            i["connectors_last_committed_batch_id"].labels(sink, family).set(f.last_committed)
        i["connectors_last_batch_timestamp_seconds"].labels(sink, family, f.outcome).set(
            f.ended)

    def write(self, path: str) -> None:
        self.prom.write_to_textfile(path, self.registry)

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
