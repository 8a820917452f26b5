"""The metric names (connectors/observe/names.py): each standard's conventions, the table
in docs/metrics.md, and that the exporters emit exactly these names and labels."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import connectors
from connectors.core.metrics import registered_exporters
from connectors.observe.names import LABELS, METRICS, OUTCOMES, PHASES, MetricName
from connectors.testing import InMemoryPreparedSink, InMemoryTarget, LocalBatch, batch_rows

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
ROW = re.compile(r"^\| `(connectors_\w+)` \| `([\w.]+)` \| (\w+) \| `([^`]+)` \|([^|]*)\|")


@pytest.fixture(autouse=True)
def no_exporters() -> Iterator[None]:
    for exporter in registered_exporters():
        exporter.close()
    yield
    for exporter in registered_exporters():
        exporter.close()


def one_batch_of_each_outcome() -> None:
    target = InMemoryTarget()
    sink = InMemoryPreparedSink(target, sink_id="events")
    sink.write_batch(LocalBatch(batch_rows(0)), 0, query_id="q")
    sink.write_batch(LocalBatch(batch_rows(0)), 0, query_id="q")  # replayed


@pytest.mark.parametrize("metric", METRICS, ids=lambda m: m.prometheus)
def test_prometheus_conventions(metric: MetricName) -> None:
    assert re.fullmatch(r"connectors_[a-z_]+", metric.prometheus)
    assert metric.prometheus.endswith("_total") == (metric.kind == "counter")
    if metric.unit == "s":
        assert metric.prometheus.endswith("_seconds")
    if metric.unit == "By":
        assert metric.prometheus.endswith("_bytes_total")


@pytest.mark.parametrize("metric", METRICS, ids=lambda m: m.otel)
def test_opentelemetry_conventions(metric: MetricName) -> None:
    assert re.fullmatch(r"connectors(\.[a-z_]+)+", metric.otel)
    assert metric.unit in ("s", "By") or re.fullmatch(r"\{[a-z]+\}", metric.unit)
    # Labels from small fixed sets only: never a row value, a record or a secret.
    assert set(metric.all_labels) <= {*LABELS, "outcome", "phase", "path"}


def test_names_are_unique() -> None:
    assert len({m.prometheus for m in METRICS}) == len({m.otel for m in METRICS}) == len(METRICS)


def test_the_table_in_docs_metrics_md_is_the_names_module() -> None:
    rows = [ROW.match(line) for line in DOC.read_text().splitlines()
            if line.startswith("| `connectors_")]
    assert all(rows), "a row of the table does not parse"
    documented = [(m[1], m[2], m[3], m[4], tuple(re.findall(r"`(\w+)`", m[5])))
                  for m in rows if m is not None]
    assert documented == [(m.prometheus, m.otel, m.kind, m.unit, m.labels) for m in METRICS]
    text = DOC.read_text()
    for value in (*OUTCOMES, *PHASES):
        assert f"`{value}`" in text


def test_prometheus_emits_exactly_the_names_and_labels() -> None:
    registry = CollectorRegistry()
    connectors.export_metrics(connectors.PrometheusMetrics(port=None, registry=registry))
    one_batch_of_each_outcome()
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue  # prometheus_client's creation time of each series
            name = re.sub(r"_(bucket|sum|count)$", "", sample.name)
            labels.setdefault(name, set()).update(set(sample.labels) - {"le"})
    assert labels == {m.prometheus: set(m.all_labels) for m in METRICS}


def test_opentelemetry_emits_exactly_the_names_units_and_attributes() -> None:
    reader = InMemoryMetricReader()
    connectors.export_metrics(
        connectors.OpenTelemetryMetrics(MeterProvider(metric_readers=[reader])))
    one_batch_of_each_outcome()
    data = reader.get_metrics_data()
    assert data is not None
    seen = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            assert sm.scope.name == "connectors"
            for m in sm.metrics:
                attributes = set().union(*(set(p.attributes) for p in m.data.data_points))
                seen[m.name] = (m.unit, attributes)
    assert seen == {m.otel: (m.unit, set(m.all_labels)) for m in METRICS}
