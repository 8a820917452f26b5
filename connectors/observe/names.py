"""Every metric the exporters emit, in one place: its Prometheus name, its OpenTelemetry
name, kind, unit and labels. ``docs/metrics.md`` has the same table (a test checks), and a
dashboard names exactly these.

Example::

    >>> from connectors.observe.names import METRICS, by_prometheus
    >>> by_prometheus("connectors_rows_total").otel
    'connectors.rows'
    >>> sorted({m.kind for m in METRICS})
    ['counter', 'gauge', 'histogram']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["DEFAULT_PATH", "DURATION_BUCKETS", "LABELS", "METRICS", "OUTCOMES", "PHASES",
           "MetricName", "by_prometheus"]

#: The labels (Prometheus) and attributes (OpenTelemetry) of every metric.
LABELS = ("sink_id", "family")
#: Values of the ``outcome`` label: a batch that wrote its rows, one already committed
#: (replayed by Spark after a restart: skipped), one that failed.
OUTCOMES = ("committed", "replayed", "failed")
#: Values of the ``phase`` label of the batch duration: the tasks (prepare or write),
#: recording the decision, the commits, and the whole batch.
PHASES = ("prepare", "decide", "commit", "total")
#: The ``path`` label of a sink with one write path. The others: Kafka ``native`` (the
#: accelerator: ctypes batch produce), ``batch``, ``record``; Delta ``txn_seed`` (the
#: accelerator: reflection), ``txn``, ``tag``.
DEFAULT_PATH = "default"
#: Histogram buckets of the batch duration, in seconds (both standards).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0, 120.0, 300.0)

Kind = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True)
class MetricName:
    """One metric: ``prometheus`` as scraped (a histogram adds ``_bucket``, ``_sum`` and
    ``_count``), ``otel`` the instrument's name, ``unit`` its UCUM unit, ``labels`` its
    labels beyond :data:`LABELS`."""

    prometheus: str
    otel: str
    kind: Kind
    unit: str
    labels: tuple[str, ...]
    description: str

    @property
    def all_labels(self) -> tuple[str, ...]:
        return LABELS + self.labels


METRICS = (
    MetricName("connectors_batches_total", "connectors.batches", "counter", "{batch}",
               ("outcome", "path"),
               "Batches handled, by outcome (committed, replayed: already committed, "
               "skipped; failed) and write path"),
    MetricName("connectors_rows_total", "connectors.rows", "counter", "{row}", (),
               "Rows the sink's batches committed (rows an earlier run's decision held, "
               "committed at a restart, count as reconciled transactions)"),
    MetricName("connectors_bytes_total", "connectors.bytes", "counter", "By", (),
               "Bytes the sink's batches committed, as the sink counts them"),
    MetricName("connectors_tasks_total", "connectors.tasks", "counter", "{task}", (),
               "Tasks (or slots) that wrote a batch's rows"),
    MetricName("connectors_retries_total", "connectors.retries", "counter", "{retry}", (),
               "Retried transient failures of the driver's steps"),
    MetricName("connectors_reconciled_transactions_total", "connectors.transactions.reconciled",
               "counter", "{transaction}", (),
               "Transactions of an earlier run finished (or batches found in the target)"),
    MetricName("connectors_aborted_transactions_total", "connectors.transactions.aborted",
               "counter", "{transaction}", (),
               "Undecided transactions rolled back (presumed abort)"),
    MetricName("connectors_batch_duration_seconds", "connectors.batch.duration", "histogram",
               "s", ("phase",),
               "Time of a batch's phase: prepare (tasks), decide, commit, total"),
    MetricName("connectors_lingering_transactions", "connectors.transactions.lingering",
               "gauge", "{transaction}", (),
               "This sink's prepared transactions the last batch's sweep found, before "
               "settling them"),
    MetricName("connectors_last_committed_batch_id", "connectors.batch.last_committed",
               "gauge", "{batch}", (),
               "Id of the last batch known committed (committed or replayed)"),
    MetricName("connectors_lag_batches", "connectors.batch.lag", "gauge", "{batch}", (),
               "Batches of Spark's offset log the sink has not committed, as the driver "
               "saw at its last batch (0 after a committed one)"),
    MetricName("connectors_last_batch_timestamp_seconds", "connectors.batch.last_time",
               "gauge", "s", ("outcome",),
               "Unix time at which the sink's last batch of this outcome ended"),
)


def by_prometheus(name: str) -> MetricName:
    """The metric named ``name`` in Prometheus (KeyError if none)."""
    for metric in METRICS:
        if metric.prometheus == name:
            return metric
    raise KeyError(name)
