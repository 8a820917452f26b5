"""The DataSource form's adapter without a JVM: which sinks have the form, the planning
and commit workers told apart, the tasks' messages checked, what is refused."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyspark
import pytest
from pyspark import cloudpickle
from pyspark.sql.types import LongType, MapType, StringType, StructField, StructType

from connectors import PostgresSink
from connectors.core.batch import TaskOutcome
from connectors.core.driver.planned import RunTicket
from connectors.core.errors import ConfigurationError, ProtocolStateError
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers.ledger import TaskCommit
from connectors.sdk import DriverCommitSink, TaskCommitSink
from connectors.spark import _source
from connectors.spark._source import Prepared, data_source_for, register
from examples.fs_sink import FileSystemSink

FLAT = StructType([StructField("id", LongType()), StructField("name", StringType())])
try:
    import pyspark.sql.datasource as datasource
except ImportError:  # pyspark 3.5: no Python data sources at all
    datasource = None  # type: ignore[assignment]
#: pyspark 3.5 and 4.0 have no DataSource form (refused: tested below, on every version).
needs_the_form = pytest.mark.skipif(
    not hasattr(datasource, "DataSourceStreamArrowWriter"),
    reason=f"pyspark {pyspark.__version__} < 4.1: the DataSource form is refused (tested below)")


class _Registry:
    def __init__(self) -> None:
        self.registered: list[type] = []

    def register(self, source: type) -> None:
        self.registered.append(source)


class _Session:
    def __init__(self) -> None:
        self.dataSource = _Registry()


@needs_the_form
def test_register_gives_postgres_its_name_and_an_author_sink_its_own() -> None:
    spark = _Session()
    assert register(spark) == ["connectors.postgres"]
    assert register(spark, FileSystemSink) == ["example.files"]
    assert register(spark, FileSystemSink, name="my.files") == ["my.files"]
    assert [s.name() for s in spark.dataSource.registered] == [
        "connectors.postgres", "example.files", "my.files"]


@pytest.mark.parametrize("cls", [TaskCommitSink, DriverCommitSink, dict])  # Kafka, Delta
def test_only_prepared_transaction_sinks_register(cls: type) -> None:
    with pytest.raises(ConfigurationError, match=r"has no DataSource form.*foreachBatch"):
        register(_Session(), cls)


def test_pyspark_without_arrow_stream_writers_is_refused(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """4.0 (no Arrow stream writer) and 3.5 (no data sources at all): refused, naming the
    version; register() goes through data_source_for."""
    if datasource is not None:
        monkeypatch.delattr(datasource, "DataSourceStreamArrowWriter", raising=False)
    with pytest.raises(ConfigurationError, match=r"needs pyspark >= 4\.1 .*, and this pyspark "
                       rf"is {pyspark.__version__}; with it use df\.writeStream\.foreachBatch"):
        data_source_for(PostgresSink, "connectors.postgres")
    with pytest.raises(ConfigurationError, match=r"needs pyspark >= 4\.1"):
        register(object())  # a 3.5 session has no dataSource: refused before it is asked


def _source_of(tmp_path: Path, **options: str) -> Any:
    cls = data_source_for(FileSystemSink, "example.files")
    return cls({"path": str(tmp_path / "out"), "sink_id": "files", **options})


@needs_the_form
def test_the_commit_workers_copy_is_told_from_the_planning_workers(tmp_path: Path) -> None:
    planning = _source_of(tmp_path)
    assert planning.__dict__.get("_planning") is True
    committing = pickle.loads(cloudpickle.dumps(planning))  # as Spark ships it
    assert "_planning" not in committing.__dict__
    writer = committing.streamWriter(FLAT, False)  # no run opened, nothing written
    assert writer.ticket is None and not (tmp_path / "out" / "_ledger").exists()
    opened = planning.streamWriter(FLAT, False)  # the planning step opens a run
    assert opened.ticket is not None


@needs_the_form
def test_overwrite_a_missing_run_id_nested_columns_and_unknown_options_are_refused(
    tmp_path: Path
) -> None:
    source = _source_of(tmp_path)
    with pytest.raises(ConfigurationError, match="appends"):
        source.streamWriter(FLAT, True)
    with pytest.raises(ConfigurationError, match=r'option\("run_id", N\)'):
        source.writer(FLAT, False)
    nested = StructType([StructField("m", MapType(StringType(), StringType()))])
    with pytest.raises(ConfigurationError, match="not structs or maps"):
        source.streamWriter(nested, False)
    with pytest.raises(ConfigurationError, match=r"unknown option\(s\) \['pathh'\]"):
        _source_of(tmp_path, pathh="x").streamWriter(FLAT, False)


def _message(batch: int | None, run: str = "r1", query: str | None = "q") -> Prepared:
    commit = TaskCommit(f"eos1|files|{run}|{batch}|7", 0, 7, Fingerprint(1, 5))
    return Prepared(TaskOutcome(commit=commit).to_bytes(), RunTicket(run, "3"), batch, query)


def test_the_tasks_messages_must_agree_on_run_and_batch() -> None:
    ticket, query, outcomes = _source._outcomes("files", [_message(4), _message(4)], 4)
    assert ticket == RunTicket("r1", "3") and query == "q" and len(outcomes) == 2
    with pytest.raises(ProtocolStateError, match="refusing to decide"):
        _source._outcomes("files", [_message(4), _message(4, run="r2")], 4)
    with pytest.raises(ProtocolStateError, match="refusing to decide"):
        _source._outcomes("files", [_message(3)], 4)
    assert _source._outcomes("files", [], 4) == (None, None, [])


def test_a_task_without_spark_s_batch_id_fails_the_batch_by_value(tmp_path: Path) -> None:
    sink = FileSystemSink(tmp_path, sink_id="files")
    message = _source._prepare(sink, RunTicket("r1"), pa.schema([("id", pa.int64())]),
                               None, "q", iter([]))
    outcome = TaskOutcome.from_bytes(message.outcome)
    assert isinstance(outcome.error, ConfigurationError)
    assert "streaming.sql.batchId" in str(outcome.error)
