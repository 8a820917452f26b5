"""The watcher's Prometheus gauges: what only an outside observer can see.

A driver SIGKILLed after its tasks prepared cannot report what it left behind; the watcher
(``connectors status --watch --prometheus-port PORT`` or ``--prometheus-textfile PATH``)
reads it from the targets and exports it. The names are in :data:`GAUGES` (the one place:
docs/operations.md lists them, the tests import them). Labels: ``sink_id`` and ``target``
(the kind: ``postgres``, ``kafka``, ``delta``), never a connection string or a secret.

While a target is unreachable, ``connectors_watch_target_up`` is 0 and its sinks' gauges
keep the values of the last refresh that reached it. A sink no longer found loses its series.
The ``watch`` in the names keeps them apart from the figures a driver exports about its own
batches.

Needs ``prometheus_client`` (``pip install 'spark-exactly-once[prometheus]'``).

Example::

    >>> LINGERING, GAUGES[LINGERING][0]
    ('connectors_watch_lingering_transactions', ('sink_id', 'target'))
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from connectors._deps import require
from connectors.cli._watch import Snapshot

__all__ = ["GAUGES", "LINGERING", "OLDEST_LINGERING", "TARGET_UP", "PrometheusGauges"]

logger = logging.getLogger(__name__)

LINGERING = "connectors_watch_lingering_transactions"
OLDEST_LINGERING = "connectors_watch_lingering_oldest_age_seconds"
UNFINISHED = "connectors_watch_unfinished_batches"
LAST_COMMITTED = "connectors_watch_last_committed_batch_id"
LAG = "connectors_watch_lag_batches"
TARGET_UP = "connectors_watch_target_up"
REFRESHED = "connectors_watch_last_refresh_timestamp_seconds"

#: Every gauge the watcher exports: name -> (labels, help).
GAUGES: dict[str, tuple[tuple[str, ...], str]] = {
    LINGERING: (("sink_id", "target"),
                "Transactions of the sink open or prepared on the target"),
    OLDEST_LINGERING: (("sink_id", "target"),
                       "Age of the sink's oldest lingering transaction (0: none; Kafka "
                       "gives no age)"),
    UNFINISHED: (("sink_id", "target"), "Batches decided in the ledger but not committed"),
    LAST_COMMITTED: (("sink_id", "target"), "The sink's last committed batch id (-1: none)"),
    LAG: (("sink_id", "target"),
          "Batches in Spark's offset log past the last committed one (only with a "
          "--checkpoint of the sink's query)"),
    TARGET_UP: (("target",), "1 if the target was reachable at the last refresh, else 0"),
    REFRESHED: ((), "When the watcher last refreshed (seconds since the epoch)"),
}


class PrometheusGauges:
    """The gauges in a registry of their own, set from each refresh's :class:`Snapshot`,
    served over HTTP and/or written to a textfile (node_exporter's textfile collector)."""

    def __init__(self) -> None:
        prometheus = require("prometheus_client", extra="prometheus",
                             feature="status --prometheus-port/--prometheus-textfile")
        self._prometheus: Any = prometheus
        self.registry: Any = prometheus.CollectorRegistry()
        self._gauges: dict[str, Any] = {
            name: prometheus.Gauge(name, text, list(labels), registry=self.registry)
            for name, (labels, text) in GAUGES.items()}
        self._series: set[tuple[str, str]] = set()
        self._server: Any = None

    def serve(self, port: int, addr: str = "") -> None:
        """Answer scrapes on ``http://addr:port/metrics`` (a daemon thread)."""
        started = self._prometheus.start_http_server(port, addr=addr or "0.0.0.0",  # noqa: S104
                                                     registry=self.registry)
        self._server = started[0] if isinstance(started, tuple) else None

    def update(self, snapshot: Snapshot) -> None:
        """Set every gauge from one refresh."""
        g = self._gauges
        up: dict[str, bool] = {}
        seen: set[tuple[str, str]] = set()
        for row in snapshot.rows:
            up[row.target] = up.get(row.target, True) and row.reachable
            if row.sink_id == "-":
                continue
            seen.add((row.sink_id, row.target))
            if not row.reachable:
                continue
            labels = (row.sink_id, row.target)
            g[LINGERING].labels(*labels).set(row.lingering)
            g[OLDEST_LINGERING].labels(*labels).set(row.oldest_lingering_s or 0.0)
            g[UNFINISHED].labels(*labels).set(len(row.unfinished))
            g[LAST_COMMITTED].labels(*labels).set(
                -1 if row.last_committed is None else row.last_committed)
            if row.lag is not None:
                g[LAG].labels(*labels).set(row.lag)
        for kind, ok in up.items():
            g[TARGET_UP].labels(kind).set(1 if ok else 0)
        for gone in self._series - seen:
            for name, (names, _) in GAUGES.items():
                if names == ("sink_id", "target"):
                    with contextlib.suppress(KeyError):
                        g[name].remove(*gone)
        self._series = seen
        g[REFRESHED].set(snapshot.time)

    def write_textfile(self, path: str) -> None:
        """Write every gauge to ``path`` atomically (a temporary file renamed)."""
        self._prometheus.write_to_textfile(path, self.registry)

    def exposition(self) -> str:
        """The gauges in Prometheus' text format (what a scrape returns)."""
        return str(self._prometheus.generate_latest(self.registry).decode())

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None
