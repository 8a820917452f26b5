"""The Grafana dashboard (docker/grafana/dashboards/connectors.json) and the monitoring
services of docker/docker-compose.yml: every query names metrics the exporters emit (the
driver's, connectors/observe/names.py, and the watcher's, connectors/cli/_gauges.py) with
labels they carry; every panel has a query; the data source the dashboard names is the one
Grafana is provisioned with; Prometheus scrapes the ports the docs give; the monitoring
services stay out of the tests' compose run (a profile)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from connectors.cli._gauges import GAUGES
from connectors.observe.names import LABELS, METRICS

DOCKER = Path(__file__).resolve().parents[2] / "docker"
DASHBOARD = json.loads((DOCKER / "grafana" / "dashboards" / "connectors.json").read_text())
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
#: metric -> the labels it carries (Prometheus adds ``le`` to a histogram's buckets).
EMITTED: dict[str, set[str]] = {
    **{m.prometheus + suffix: set(m.all_labels) | ({"le"} if suffix == "_bucket" else set())
       for m in METRICS
       for suffix in (HISTOGRAM_SUFFIXES if m.kind == "histogram" else ("",))},
    **{name: set(labels) for name, (labels, _) in GAUGES.items()},
}
#: PromQL words that look like names but are functions or keywords.
PROMQL = {"sum", "max", "min", "avg", "count", "rate", "irate", "increase", "by", "without",
          "histogram_quantile", "time", "le", "on", "ignoring", "group_left", "offset",
          "label_values"}


def queries() -> list[tuple[str, str]]:
    found = [(p["title"], t["expr"]) for p in DASHBOARD["panels"] for t in p["targets"]]
    found += [("variable " + v["name"], v["query"]["query"])
              for v in DASHBOARD["templating"]["list"]]
    return found


def metric_names(expr: str) -> set[str]:
    words = set(re.findall(r"\b([a-zA-Z_][a-zA-Z0-9_]*)\s*(?=[{(\[,)]|$|\s)", expr))
    quoted = set(re.findall(r'"[^"]*"', expr))
    return {w for w in words if w.startswith("connectors_")
            and not any(w in q for q in quoted)} - PROMQL


def labels_used(expr: str) -> set[str]:
    used = set(re.findall(r"\b([a-z_]+)\s*(?:=~|!=|!~|=)\s*\"", expr))
    for group in re.findall(r"\bby\s*\(([^)]*)\)", expr):
        used |= {g.strip() for g in group.split(",") if g.strip()}
    return used


def test_the_dashboard_has_panels_each_with_a_query() -> None:
    assert len(DASHBOARD["panels"]) >= 10
    for panel in DASHBOARD["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]


@pytest.mark.parametrize(("where", "expr"), queries(), ids=lambda x: str(x)[:50])
def test_every_query_names_metrics_the_exporters_emit(where: str, expr: str) -> None:
    names = metric_names(expr)
    assert names, f"{where}: no connectors_* metric in {expr!r}"
    unknown = names - set(EMITTED)
    assert not unknown, f"{where}: {sorted(unknown)} is emitted by no exporter"
    carried = set.union(*(EMITTED[n] for n in names))
    missing = labels_used(expr) - carried - {"le"}
    assert not missing, f"{where}: labels {sorted(missing)} are on none of {sorted(names)}"
    assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr


def test_the_checks_see_a_wrong_name_and_a_wrong_label() -> None:
    assert metric_names('sum by (sink_id) (rate(connectors_rowz_total{sink_id=~"x"}[5m]))') \
        == {"connectors_rowz_total"}
    assert labels_used('max by (sink_id, topic) (connectors_rows_total{family="x"})') \
        == {"sink_id", "topic", "family"}
    assert "connectors_rows_total" in EMITTED and set(LABELS) <= EMITTED["connectors_rows_total"]


def test_the_most_important_figures_have_a_panel() -> None:
    every = " ".join(expr for _, expr in queries())
    for name in ("connectors_watch_lingering_transactions",
                 "connectors_watch_lingering_oldest_age_seconds",
                 "connectors_batches_total", "connectors_rows_total",
                 "connectors_batch_duration_seconds_bucket", "connectors_watch_lag_batches"):
        assert name in every, name


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def test_grafana_is_provisioned_with_the_dashboard_s_data_source() -> None:
    uids = {p["datasource"]["uid"] for p in DASHBOARD["panels"]}
    sources = _yaml(DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
    assert uids == {s["uid"] for s in sources["datasources"]}
    assert sources["datasources"][0]["url"] == "http://prometheus:9090"


def test_compose_runs_prometheus_and_grafana_under_a_profile_with_the_right_files() -> None:
    compose = _yaml(DOCKER / "docker-compose.yml")["services"]
    for name in ("prometheus", "grafana"):
        assert compose[name]["profiles"] == ["monitoring"], name  # the tests never start it
    for volume in compose["prometheus"]["volumes"] + compose["grafana"]["volumes"]:
        local = volume.split(":", 1)[0]
        assert (DOCKER / local).exists(), volume
    scrape = _yaml(DOCKER / "prometheus" / "prometheus.yml")["scrape_configs"]
    targets = {t for job in scrape for c in job["static_configs"] for t in c["targets"]}
    assert targets == {"host.docker.internal:9464", "host.docker.internal:9465"}
    assert {"postgres", "kafka"} <= set(compose)  # the tests' services unchanged
