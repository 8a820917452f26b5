"""Metrics exporters (issue 40, item 1) on in-memory sinks: the core's registration point,
the figures each exporter shows (Prometheus: textfile and a scrape of the endpoint;
OpenTelemetry: the SDK's in-memory reader), that an exporter's failure never fails a
batch, and that exporters travel with a pickled sink (Spark Connect's worker)."""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client.parser import text_string_to_metric_families
from pyspark import cloudpickle

import connectors
from connectors.core.metrics import (
    BatchMetrics,
    register_exporter,
    registered_exporters,
    unregister_exporter,
)
from connectors.core.protocol import crash
from connectors.core.protocol.crash import SimulatedCrash
from connectors.core.states import CrashPoint
from connectors.testing import InMemoryPreparedSink, InMemoryTarget, batch_rows
from tests._batches import write

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_exporters() -> Iterator[None]:
    """Every test starts and ends with no exporter registered in the process."""
    for exporter in registered_exporters():
        exporter.close()
    yield
    for exporter in registered_exporters():
        exporter.close()
    crash.disarm_all()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text exposition: (name, sorted labels) -> value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def labels(**extra: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"sink_id": "events", "family": "prepare_in_task", **extra}.items()))


# ---- the registration point -------------------------------------------------------------

class Recorder:
    """A minimal exporter: what the core asks of one."""

    travels = False

    def __init__(self, key: str = "test:recorder", fail: bool = False) -> None:
        self.key, self.fail = key, fail
        self.seen: list[BatchMetrics] = []
        self.started = 0

    def start(self) -> None:
        self.started += 1

    def record(self, metrics: BatchMetrics) -> None:
        if self.fail:
            raise RuntimeError("exporter down: password=hunter2")
        self.seen.append(metrics)

    def close(self) -> None:
        unregister_exporter(self)


def test_registered_exporters_get_every_batch_and_a_second_registration_is_the_first() -> None:
    first = register_exporter(Recorder())
    again = register_exporter(Recorder())
    assert again is first and first.started == 1
    sink = InMemoryPreparedSink(InMemoryTarget(), sink_id="events")
    m0, m1 = write(sink, 0), write(sink, 1)
    assert first.seen == [m0, m1]
    first.close()
    write(sink, 2)
    assert len(first.seen) == 2 and registered_exporters() == ()


def test_a_failing_exporter_never_fails_a_batch_and_warns_once_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="connectors.core.metrics")
    register_exporter(Recorder("test:broken", fail=True))
    good = register_exporter(Recorder("test:good"))
    target = InMemoryTarget()
    sink = InMemoryPreparedSink(target, sink_id="events")
    assert [write(sink, b).outcome for b in (0, 1, 2)] == ["committed"] * 3
    assert len(good.seen) == 3  # the exporter after the broken one still gets every batch
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "metrics exporter test:broken" in warnings[0] and "RuntimeError" in warnings[0]
    assert "hunter2" not in warnings[0]  # the error's message could quote a secret
    assert len(target.committed_rows()) == sum(batch_rows(b).num_rows for b in (0, 1, 2))


def test_new_fields_go_at_the_end_of_the_log_line() -> None:
    m = BatchMetrics("events", 3, "commit_in_task", outcome="committed", rows=2,
                     extra={"total_ms": 5.0}, lingering=1, path="native")
    assert m.log_line() == (
        "sink_id=events batch_id=3 family=commit_in_task outcome=committed rows=2 bytes=0 "
        "tasks=0 prepare_ms=0.0 decide_ms=0.0 commit_ms=0.0 retries=0 reconciled=0 "
        "aborted=0 total_ms=5.0 lingering=1 path=native")


def test_lingering_counts_this_sinks_prepared_transactions_a_sweep_found() -> None:
    target = InMemoryTarget()
    sink = InMemoryPreparedSink(target, sink_id="events")
    crash.arm(CrashPoint.BEFORE_DECISION)
    with pytest.raises(SimulatedCrash):
        write(sink, 0)
    restarted = InMemoryPreparedSink(target, sink_id="events")  # a new driver
    metrics = write(restarted, 0)
    assert (metrics.lingering, metrics.aborted, metrics.outcome) == (3, 3, "committed")
    assert write(restarted, 1).lingering == 0
    # Losing speculative attempts are found by the sweep after the commit.
    assert write(restarted, 2, speculate=[0, 2]).lingering == 2


# ---- Prometheus -------------------------------------------------------------------------

def test_prometheus_textfile_and_endpoint_show_the_batches(tmp_path: Path) -> None:
    textfile = tmp_path / "connectors.prom"
    exporter = connectors.export_metrics(
        connectors.PrometheusMetrics(port=0, addr="127.0.0.1", textfile=str(textfile)))
    assert textfile.exists()  # written at the start, before any batch
    target = InMemoryTarget()
    sink = InMemoryPreparedSink(target, sink_id="events")
    m0, m1 = write(sink, 0), write(sink, 1)
    replay = write(InMemoryPreparedSink(target, sink_id="events"), 1)  # a restart's replay
    assert replay.outcome == "replayed"
    rows = m0.rows + m1.rows
    assert rows == len(target.committed_rows())
    url = f"http://127.0.0.1:{exporter.port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        scraped = samples(response.read().decode())
    for got in (scraped, samples(textfile.read_text())):
        assert got[("connectors_rows_total", labels())] == rows
        assert got[("connectors_batches_total",
                    labels(outcome="committed", path="default"))] == 2
        assert got[("connectors_batches_total",
                    labels(outcome="replayed", path="default"))] == 1
        assert got[("connectors_tasks_total", labels())] == m0.tasks + m1.tasks
        assert got[("connectors_last_committed_batch_id", labels())] == 1
        assert got[("connectors_batch_duration_seconds_count", labels(phase="total"))] == 3
        assert got[("connectors_batch_duration_seconds_sum", labels(phase="prepare"))] == (
            pytest.approx((m0.prepare_ms + m1.prepare_ms + replay.prepare_ms) / 1000))
    exporter.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=5)


def test_the_lag_gauge_is_0_after_a_commit_and_counts_the_batches_since_after_a_failure(
) -> None:
    """Both exporters: 0 after a committed or replayed batch; after batch 3 fails with 1
    the last committed, 2 (batches 2 and 3 are in Spark's offset log, not in the sink);
    then 0 again once batch 3 commits."""
    reader = InMemoryMetricReader()
    otel = connectors.export_metrics(
        connectors.OpenTelemetryMetrics(MeterProvider(metric_readers=[reader])))
    prom = connectors.export_metrics(connectors.PrometheusMetrics(port=0, addr="127.0.0.1"))

    def lags() -> tuple[float, float]:
        (point,) = otel_points(reader)["connectors.batch.lag"]
        with urllib.request.urlopen(f"http://127.0.0.1:{prom.port}/metrics",
                                    timeout=10) as response:
            scraped = samples(response.read().decode())
        return point.value, scraped[("connectors_lag_batches", labels())]

    target = InMemoryTarget()
    sink = InMemoryPreparedSink(target, sink_id="events")
    write(sink, 0), write(sink, 1)
    assert lags() == (0, 0)
    crash.arm(CrashPoint.BEFORE_DECISION, batch_id=3)
    with pytest.raises(SimulatedCrash):
        write(sink, 3)
    assert sink.last_metrics.outcome == "failed"
    assert lags() == (2, 2)
    write(InMemoryPreparedSink(target, sink_id="events"), 3)  # the next run
    assert lags() == (0, 0)
    otel.close()
    prom.close()


def test_prometheus_needs_somewhere_to_export_and_a_valid_port() -> None:
    with pytest.raises(connectors.ConfigurationError):
        connectors.PrometheusMetrics(port=None)
    with pytest.raises(connectors.ConfigurationError):
        connectors.PrometheusMetrics(port=70000)


def test_a_port_taken_fails_at_export_metrics_not_in_a_batch() -> None:
    first = connectors.export_metrics(connectors.PrometheusMetrics(port=0, addr="127.0.0.1"))
    with pytest.raises(OSError):
        connectors.export_metrics(
            connectors.PrometheusMetrics(port=first.port, addr="127.0.0.1"))
    assert registered_exporters() == (first,)


# ---- OpenTelemetry ----------------------------------------------------------------------

def otel_points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    return {m.name: list(m.data.data_points) for rm in data.resource_metrics
            for sm in rm.scope_metrics for m in sm.metrics}


def test_opentelemetry_in_memory_reader_sees_the_batches() -> None:
    reader = InMemoryMetricReader()
    exporter = connectors.export_metrics(
        connectors.OpenTelemetryMetrics(MeterProvider(metric_readers=[reader])))
    target = InMemoryTarget()
    sink = InMemoryPreparedSink(target, sink_id="events")
    m0, m1 = write(sink, 0), write(sink, 1)
    write(InMemoryPreparedSink(target, sink_id="events"), 1)  # replayed
    points = otel_points(reader)
    (rows,) = points["connectors.rows"]
    assert rows.value == m0.rows + m1.rows == len(target.committed_rows())
    assert dict(rows.attributes) == {"sink_id": "events", "family": "prepare_in_task"}
    batches = {p.attributes["outcome"]: p.value for p in points["connectors.batches"]}
    assert batches == {"committed": 2, "replayed": 1}
    (last,) = points["connectors.batch.last_committed"]
    assert last.value == 1
    durations = {p.attributes["phase"]: p.count for p in points["connectors.batch.duration"]}
    assert durations == {"prepare": 3, "decide": 3, "commit": 3, "total": 3}
    exporter.close()


_TARGETS: dict[str, InMemoryTarget] = {}


class NamedTargetSink(InMemoryPreparedSink):
    """Holds its target by name, as a real sink holds a DSN: its configuration pickles."""

    def __init__(self, target_name: str, **kwargs: Any) -> None:
        super().__init__(_TARGETS[target_name], **kwargs)
        self.target_name = target_name

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        del state["target"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.target = _TARGETS[self.target_name]


def test_exporters_travel_with_a_pickled_sink_and_start_on_its_first_batch(
    tmp_path: Path,
) -> None:
    """What Spark Connect's foreachBatch worker does: it unpickles the sink (in a process
    where nothing was registered) and runs its batches there."""
    textfile = tmp_path / "worker.prom"
    exporter = connectors.export_metrics(
        connectors.PrometheusMetrics(port=None, textfile=str(textfile)))
    _TARGETS["travel"] = InMemoryTarget()
    sink = NamedTargetSink("travel", sink_id="events")
    carried = pickle.loads(cloudpickle.dumps(sink))  # as Spark Connect ships foreachBatch
    exporter.close()  # "another process": no exporter registered
    textfile.unlink()
    assert registered_exporters() == ()
    write(carried, 0)
    (adopted,) = registered_exporters()
    assert isinstance(adopted, connectors.PrometheusMetrics) and adopted is not exporter
    assert samples(textfile.read_text())[("connectors_batches_total",
                                          labels(outcome="committed", path="default"))] == 1


def test_a_missing_extra_is_named() -> None:
    code = (
        "import sys\n"
        "for name in ('prometheus_client', 'opentelemetry', 'opentelemetry.metrics'):\n"
        "    sys.modules[name] = None  # not installed: importing it raises ImportError\n"
        "import connectors\n"
        "for make in (lambda: connectors.PrometheusMetrics(port=0),\n"
        "             lambda: connectors.OpenTelemetryMetrics()):\n"
        "    try:\n"
        "        connectors.export_metrics(make())\n"
        "    except connectors.DependencyError as e:\n"
        "        print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout
    assert "spark-exactly-once[prometheus]" in out and "PrometheusMetrics" in out
    assert "spark-exactly-once[otel]" in out and "OpenTelemetryMetrics" in out


def test_importing_connectors_imports_no_exporter_library() -> None:
    code = ("import sys, connectors\n"
            "print(sorted(m for m in sys.modules\n"
            "             if m.split('.')[0] in ('prometheus_client', 'opentelemetry')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout
    assert out.strip() == "[]"


def test_what_travels_to_another_driver_process() -> None:
    from prometheus_client import CollectorRegistry

    assert connectors.PrometheusMetrics(port=9464).travels
    assert connectors.PrometheusMetrics(port=None, textfile="/tmp/x.prom").travels
    # The application's own registry, or provider, stays in the application's process.
    assert not connectors.PrometheusMetrics(port=None, registry=CollectorRegistry()).travels
    assert connectors.OpenTelemetryMetrics().travels
    assert not connectors.OpenTelemetryMetrics(MeterProvider()).travels
    stays = connectors.export_metrics(
        connectors.PrometheusMetrics(port=None, registry=CollectorRegistry()))
    goes = connectors.export_metrics(connectors.OpenTelemetryMetrics())
    state = InMemoryPreparedSink(InMemoryTarget(), sink_id="events").__getstate__()
    assert state["_exporters"] == (goes,) and stays in registered_exporters()
