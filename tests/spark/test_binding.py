"""Which query called the sink, classic and Spark Connect, with stand-ins for the session.

The stand-ins answer exactly what the real objects answer (``getLocalProperty``,
``streams.active``/``streams.get``, ``conf.get``); the real Connect path runs in
``integration/connect/test_connect.py``. What matters here: no call is silently taken for a batch
job, and every refusal names the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyspark
import pytest

from connectors import ConfigurationError
from connectors.core.batch import BatchInput
from connectors.core.engine import EngineCall, register_front_end
from connectors.spark import _binding
from connectors.spark._binding import (
    _master_cores,
    connect_barrier_refusal,
    connect_task_slots,
    last_metrics,
    publish_metrics,
    query_id_for,
)
from connectors.testing import InMemoryPreparedSink, InMemoryTarget


@dataclass
class Query:
    id: str
    name: str | None


@dataclass
class Streams:
    queries: list[Query]
    calls: int = 0

    @property
    def active(self) -> list[Query]:
        self.calls += 1
        return list(self.queries)

    def get(self, query_id: str) -> Query | None:
        return next((q for q in self.queries if q.id == query_id), None)


@dataclass
class Conf:
    values: dict[str, str] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value


class Context:
    def __init__(self, query_id: str | None) -> None:
        self.query_id = query_id

    def getLocalProperty(self, key: str) -> str | None:
        assert key == "sql.streaming.queryId"
        return self.query_id


@dataclass
class Session:
    streams: Streams
    conf: Conf = field(default_factory=Conf)
    session_id: str = "s-1"
    local_query_id: str | None = None

    @property
    def sparkContext(self) -> Context:
        return Context(self.local_query_id)


class ClassicFrame:
    def __init__(self, session: Session) -> None:
        self.sparkSession = session


class ConnectFrame(ClassicFrame):
    pass


ConnectFrame.__module__ = "pyspark.sql.connect.dataframe"


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    _binding._connect_ids.clear()
    # the Connect binding as on Spark 4, whatever pyspark runs the tests (3.5 refuses it)
    monkeypatch.setattr(pyspark, "__version__", "4.2.0")


def call(name: str | None = None, *, batch_job: bool = False) -> EngineCall:
    return EngineCall("orders", query_name=name, batch_job=batch_job)


# ------------------------------------------------------------------------ Spark Connect


def test_connect_without_a_query_name_is_refused_with_the_fix() -> None:
    df = ConnectFrame(Session(Streams([Query("q-1", "orders")])))
    with pytest.raises(ConfigurationError) as err:
        query_id_for(df, call())  # type: ignore[arg-type]
    message = str(err.value)
    assert "Spark Connect" in message and "queryName('orders')" in message
    assert "query_name='orders'" in message and "sink.run_batch(df, run_id)" in message


def test_connect_binds_to_the_active_query_of_that_name_once_per_process() -> None:
    streams = Streams([Query("q-other", "other"), Query("q-1", "orders"), Query("q-2", None)])
    df = ConnectFrame(Session(streams))
    assert query_id_for(df, call("orders")) == "q-1"  # type: ignore[arg-type]
    assert query_id_for(df, call("orders")) == "q-1"  # type: ignore[arg-type]
    assert streams.calls == 1  # one worker process serves one run of one query


def test_connect_with_a_name_no_active_query_bears_is_refused() -> None:
    df = ConnectFrame(Session(Streams([Query("q-1", "orders-v2")])))
    with pytest.raises(ConfigurationError, match=r"no active streaming query .* that name"):
        query_id_for(df, call("orders"))  # type: ignore[arg-type]


def test_connect_batch_job_said_explicitly_binds_to_no_query() -> None:
    df = ConnectFrame(Session(Streams([])))
    assert query_id_for(df, call(batch_job=True)) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("batch_job", [False, True])
def test_connect_on_spark_35_is_refused_naming_the_version_and_the_way_out(
    monkeypatch: pytest.MonkeyPatch, batch_job: bool
) -> None:
    monkeypatch.setattr(pyspark, "__version__", "3.5.3")
    df = ConnectFrame(Session(Streams([Query("q-1", "orders")])))
    with pytest.raises(ConfigurationError) as err:
        query_id_for(df, call("orders", batch_job=batch_job))  # type: ignore[arg-type]
    message = str(err.value)
    assert "Spark 4.0 or newer under Spark Connect" in message and "pyspark 3.5.3" in message
    assert "classic PySpark" in message
    session = Session(Streams([Query("q-1", None)]), local_query_id="q-1")
    assert query_id_for(ClassicFrame(session), call()) == "q-1"  # type: ignore[arg-type]


def test_a_spark_35_connect_frame_is_a_spark_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    """pyspark 3.5's Connect DataFrame is no pyspark.sql.DataFrame: the front end still
    takes it (and then refuses Connect on 3.5, above) instead of calling it no DataFrame."""
    import sys
    import types

    module = types.ModuleType("pyspark.sql.connect.dataframe")

    class DataFrame:
        pass

    module.DataFrame = DataFrame  # type: ignore[attr-defined]
    assert not _binding.is_spark_frame(DataFrame())
    monkeypatch.setitem(sys.modules, "pyspark.sql.connect.dataframe", module)
    assert _binding.is_spark_frame(DataFrame())
    assert not _binding.is_spark_frame(object())


# ----------------------------------------------------------------------------- classic


def test_classic_reads_the_local_property() -> None:
    session = Session(Streams([Query("q-1", None)]), local_query_id="q-1")
    assert query_id_for(ClassicFrame(session), call()) == "q-1"  # type: ignore[arg-type]
    session.local_query_id = None
    assert query_id_for(ClassicFrame(session), call()) is None  # type: ignore[arg-type]


def test_classic_binds_by_the_id_spark_tells_whatever_the_name() -> None:
    # foreachBatch gets the query's cloned session, whose streams do not list the query:
    # the id comes from the local property alone, a query_name is not needed there.
    session = Session(Streams([]), local_query_id="q-1")
    assert query_id_for(ClassicFrame(session), call("orders")) == "q-1"  # type: ignore[arg-type]
    session.local_query_id = None
    assert query_id_for(ClassicFrame(session), call("orders")) is None  # type: ignore[arg-type]


# ----------------------------------------------------------- a Connect session's facts


@pytest.mark.parametrize(("master", "cores"), [
    ("local", 1), ("local[3]", 3), ("local[2,4]", 2), ("local[*]", None),
    ("local-cluster[2,3,1024]", 6), ("spark://host:7077", None), ("yarn", None), ("", None),
])
def test_master_cores(master: str, cores: int | None) -> None:
    import os

    expected = (os.cpu_count() or 1) if master == "local[*]" else cores
    assert _master_cores(master) == expected


def test_connect_task_slots_prefer_the_configured_parallelism() -> None:
    conf = Conf({"spark.default.parallelism": "12", "spark.master": "local[2]"})
    assert connect_task_slots(Session(Streams([]), conf)) == 12  # type: ignore[arg-type]
    conf.values.pop("spark.default.parallelism")
    assert connect_task_slots(Session(Streams([]), conf)) == 2  # type: ignore[arg-type]


def test_connect_barrier_refusal_reads_dynamic_allocation() -> None:
    session = Session(Streams([]), Conf({"spark.dynamicAllocation.enabled": "true"}))
    assert "dynamicAllocation" in (connect_barrier_refusal(session) or "")  # type: ignore[arg-type]
    session.conf.values["spark.dynamicAllocation.enabled"] = "false"
    assert connect_barrier_refusal(session) is None  # type: ignore[arg-type]


# ---------------------------------------------------------------- the sink's entry points


class Recorded:
    """A data object only the test's front end knows: it records each call."""

    calls: ClassVar[list[EngineCall]] = []


def _record(data: Any, call: EngineCall) -> tuple[BatchInput, str | None] | None:
    if not isinstance(data, Recorded):
        return None
    Recorded.calls.append(call)
    raise LookupError("recorded")  # the test needs the call, not a batch


register_front_end(_record)


def test_the_sink_tells_the_front_end_its_query_name_and_a_batch_job() -> None:
    sink = InMemoryPreparedSink(InMemoryTarget(), sink_id="orders", query_name="orders")
    Recorded.calls.clear()
    for entry in (lambda: sink(Recorded(), 3), lambda: sink.run_batch(Recorded(), 3)):
        with pytest.raises(LookupError):
            entry()
    assert [(c.sink_id, c.query_name, c.batch_job) for c in Recorded.calls] == [
        ("orders", "orders", False), ("orders", "orders", True)]


@pytest.mark.parametrize("bad", ["", 7])
def test_query_name_must_be_a_name(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="query_name must be"):
        InMemoryPreparedSink(InMemoryTarget(), sink_id="orders", query_name=bad)


def test_metrics_published_in_the_worker_are_read_on_the_client() -> None:
    from connectors import BatchMetrics

    session = Session(Streams([]))  # under Connect the worker's session is the client's
    assert last_metrics(session, "orders") is None  # type: ignore[arg-type]
    metrics = BatchMetrics("orders", 4, "prepare_in_task", outcome="committed", rows=12)
    publish_metrics(session, metrics.as_dict())  # type: ignore[arg-type]
    found = last_metrics(session, "orders")  # type: ignore[arg-type]
    assert found is not None and found["batch_id"] == 4 and found["rows"] == 12
    assert found["outcome"] == "committed" and last_metrics(session, "other") is None  # type: ignore[arg-type]
