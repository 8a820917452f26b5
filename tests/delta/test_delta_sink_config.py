"""DeltaSink and DeltaSinks options, reprs, pickling, error translation and the ledger
(no Spark JVM: nothing here starts a session)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from connectors.core.errors import (
    BadInputError,
    ConfigurationError,
    ConnectorError,
    FencedError,
    TransientError,
)
from connectors.delta import DeltaLedger, DeltaSink, DeltaSinks
from connectors.delta._errors import translate
from connectors.delta._table import local_path


def test_path_sink_defaults() -> None:
    sink = DeltaSink("/data/events", sink_id="events-delta")
    assert sink.path == "/data/events" and sink.table is None
    assert sink.merge_on == () and sink.mode == "append" and not sink.create_table
    # The default commit path writes no Delta txn id (no txn lookup, no private classes).
    assert sink.delta_txn_id is False and sink.txn_seed is None
    assert not sink.values_in_errors
    assert repr(sink) == "DeltaSink('/data/events', sink_id='events-delta')"


def test_table_and_merge_sink() -> None:
    sink = DeltaSink(table="lake.users", sink_id="users", merge_on=["user_id"])
    assert sink.merge_on == ("user_id",)
    assert repr(sink) == "DeltaSink(table='lake.users', sink_id='users', merge_on=['user_id'])"
    assert DeltaSink("/d", sink_id="u", merge_on="user_id").merge_on == ("user_id",)


@pytest.mark.parametrize(
    ("args", "kwargs", "needle"),
    [
        ((), {}, "exactly one of path"),
        (("/d",), {"table": "t"}, "exactly one of path"),
        (("",), {}, "path must be a non-empty string"),
        (("/d",), {"merge_on": []}, "merge_on must be a non-empty list"),
        (("/d",), {"merge_on": ["a", "a"]}, "merge_on repeats"),
        (("/d",), {"mode": "upsert"}, "mode must be 'append' or 'overwrite'"),
        (("/d",), {"merge_on": ["k"], "mode": "overwrite"}, "cannot be combined"),
        (("/d",), {"ledger_path": " "}, "ledger_path must be a non-empty string"),
        (("/d",), {"txn_seed": True}, "only delta_txn_id=True"),
        (("/d",), {"delta_txn_id": True, "txn_seed": "yes"}, "txn_seed must be None"),
    ],
)
def test_bad_options_name_the_fix(args: tuple[str, ...], kwargs: dict[str, object],
                                  needle: str) -> None:
    with pytest.raises(ConfigurationError, match=needle):
        DeltaSink(*args, sink_id="s", **kwargs)  # type: ignore[arg-type]


def test_sink_id_is_required_and_validated() -> None:
    with pytest.raises(ConfigurationError, match="sink_id"):
        DeltaSink("/d", sink_id="bad|id")


def test_sink_pickles_without_driver_state() -> None:
    sink = DeltaSink("/d", sink_id="s", merge_on=["k"])
    sink._commits.versions = {"s": 3}
    clone = pickle.loads(pickle.dumps(sink))
    assert clone.merge_on == ("k",) and clone._commits.versions == {}
    assert clone._commits.ledger is None and sink._commits.versions == {"s": 3}


def test_sinks_refuse_repeated_sink_ids_so_delta_never_skips_a_write() -> None:
    with pytest.raises(ConfigurationError, match=r"sink id.*repeat"):
        DeltaSinks([DeltaSink("/a", sink_id="x"), DeltaSink("/b", sink_id="x")])
    with pytest.raises(ConfigurationError, match="non-empty list"):
        DeltaSinks([])
    two = DeltaSinks([DeltaSink("/a", sink_id="x"), DeltaSink("/a", sink_id="y")])
    assert [s.sink_id for s in two.sinks] == ["x", "y"]


def testlocal_path() -> None:
    assert local_path("/data/t") == Path("/data/t")
    assert local_path("file:/data/t") == Path("/data/t")
    assert local_path("file:///data/t") == Path("/data/t")
    assert local_path("s3a://bucket/t") is None


class _JClass:
    """A stand-in for a py4j ``java.lang.Class`` (name and superclass)."""

    def __init__(self, name: str, parent: _JClass | None = None) -> None:
        self.name, self.parent = name, parent

    def getName(self) -> str:
        return self.name

    def getSuperclass(self) -> _JClass | None:
        return self.parent


class _JThrowable:
    """A stand-in for a py4j Java throwable: class, condition, parameters, cause."""

    def __init__(self, cls: _JClass, condition: str | None = None,
                 params: dict[str, str] | None = None, message: str = "",
                 cause: _JThrowable | None = None) -> None:
        self.cls, self.condition, self.params = cls, condition, params or {}
        self.message, self.cause = message, cause

    def getClass(self) -> _JClass:
        return self.cls

    def getCondition(self) -> str | None:
        return self.condition

    def getMessageParameters(self) -> dict[str, str]:
        return self.params

    def getMessage(self) -> str:
        return self.message

    def getCause(self) -> _JThrowable | None:
        return self.cause


class FakePy4JError(Exception):
    """Like ``py4j.protocol.Py4JJavaError``: the Java throwable in ``java_exception``."""

    def __init__(self, text: str, java: _JThrowable) -> None:
        super().__init__(text)
        self.java_exception = java


_THROWABLE = _JClass("java.lang.Throwable")
_RUNTIME = _JClass("java.lang.RuntimeException", _JClass("java.lang.Exception", _THROWABLE))
_SPARK = _JClass("org.apache.spark.SparkException", _JClass("java.lang.Exception", _THROWABLE))
_INVARIANT = _JClass("org.apache.spark.sql.delta.schema.DeltaInvariantViolationException",
                     _RUNTIME)
_CME = _JClass("java.util.ConcurrentModificationException", _RUNTIME)
_DELTA_CME = _JClass("io.delta.exceptions.DeltaConcurrentModificationException", _CME)
_APPEND = _JClass("io.delta.exceptions.ConcurrentAppendException", _DELTA_CME)


def job_failure(inner: _JThrowable) -> FakePy4JError:
    """A failed write as the driver sees it: the job's SparkException over the task's."""
    outer = _JThrowable(_SPARK, "TASK_WRITE_FAILED", {"path": "/t"},
                        f"Job aborted: {inner.message}", cause=inner)
    return FakePy4JError(f"An error occurred: {outer.message}", outer)


CHECK = _JThrowable(
    _INVARIANT, "DELTA_VIOLATE_CONSTRAINT_WITH_VALUES",
    {"constraintName": "positive", "expression": "(amount > 0)", "values": " - amount : -417"},
    "[DELTA_VIOLATE_CONSTRAINT_WITH_VALUES] CHECK constraint positive (amount > 0) violated "
    "by row with values:\n - amount : -417")


@pytest.mark.parametrize(
    ("exc", "cls", "needles"),
    [
        (job_failure(_JThrowable(_INVARIANT, "DELTA_NOT_NULL_CONSTRAINT_VIOLATED",
                                 {"columnName": "id"}, "NOT NULL constraint violated")),
         BadInputError, ["NOT NULL column", "DELTA_NOT_NULL_CONSTRAINT_VIOLATED", "columnName=id"]),
        (job_failure(CHECK), BadInputError,
         ["CHECK constraint", "constraintName=positive", "expression=(amount > 0)"]),
        (FakePy4JError("x", _JThrowable(_JClass("org.apache.spark.sql.AnalysisException"),
                                        "DELTA_FAILED_TO_MERGE_FIELDS",
                                        {"currentField": "id", "updateField": "id"})),
         BadInputError, ["merge_schema=True", "currentField=id"]),
        # A sub-condition matches its parent condition's rule.
        (FakePy4JError("x", _JThrowable(_APPEND, "DELTA_CONCURRENT_APPEND.WITHOUT_HINT",
                                        {"tableName": "t"})),
         TransientError, ["another writer", "DELTA_CONCURRENT_APPEND"]),
        # By exception class alone (a superclass of the thrown one): no condition at all.
        (FakePy4JError("x", _JThrowable(_APPEND)), TransientError, ["another writer"]),
        (FakePy4JError("x", _JThrowable(_JClass("org.apache.spark.sql.AnalysisException"),
                                        "DELTA_MISSING_DELTA_TABLE", {"tableName": "`/x`"})),
         BadInputError, ["create_table=True"]),
    ],
)
def test_delta_errors_are_classified_by_condition_and_class(
    exc: FakePy4JError, cls: type, needles: list[str]
) -> None:
    err = translate(exc, doing="writing batch 3", sink_id="s", batch_id=3)
    assert isinstance(err, cls) and isinstance(err, ConnectorError), err
    for needle in needles:
        assert needle in str(err), (needle, str(err))
    assert err.batch_id == 3 and "writing batch 3" in str(err)
    # By default the original (whose text may quote rows) is not chained.
    assert err.__cause__ is None


def test_message_text_classifies_nothing() -> None:
    """A message that merely mentions a condition or class name is not that error."""
    for text in ("[DELTA_NOT_NULL_CONSTRAINT_VIOLATED] NOT NULL constraint violated",
                 "io.delta.exceptions.ConcurrentAppendException: Files were added"):
        exc = RuntimeError(text)
        assert translate(exc, doing="x", sink_id="s") is exc
    java = FakePy4JError("DELTA_CONCURRENT_APPEND ConcurrentAppendException",
                         _JThrowable(_RUNTIME, None, {}, "ConcurrentAppendException"))
    err = translate(java, doing="x", sink_id="s")
    assert type(err) is ConnectorError, err


def test_row_values_only_with_values_in_errors() -> None:
    exc = job_failure(CHECK)
    hidden = translate(exc, doing="writing batch 1", sink_id="s", batch_id=1)
    assert "-417" not in str(hidden) and hidden.__cause__ is None
    assert "values_in_errors=True" in str(hidden)
    shown = translate(exc, doing="writing batch 1", sink_id="s", batch_id=1,
                      values_in_errors=True)
    assert isinstance(shown, BadInputError) and "amount : -417" in str(shown)
    assert shown.__cause__ is exc


def test_unknown_spark_errors_name_condition_and_classes_only() -> None:
    inner = _JThrowable(_JClass("java.lang.NumberFormatException", _RUNTIME), None, {},
                        "For input string: \"secret-417\"")
    exc = FakePy4JError("boom secret-417", _JThrowable(_SPARK, "TASK_WRITE_FAILED",
                                                       {"path": "/t"}, "x", cause=inner))
    err = translate(exc, doing="writing batch 2", sink_id="s", batch_id=2)
    assert type(err) is ConnectorError and "secret-417" not in str(err)
    assert "TASK_WRITE_FAILED" in str(err) and "java.lang.NumberFormatException" in str(err)
    assert translate(exc, doing="x", sink_id="s", values_in_errors=True) is exc


def test_unknown_python_errors_pass_through_unchanged() -> None:
    exc = RuntimeError("something else")
    assert translate(exc, doing="x", sink_id="s") is exc


def test_an_empty_ledger_is_refused_when_the_table_knows_the_sink(tmp_path: Path) -> None:
    seen: list[str] = []

    def probe(app_id: str) -> int | None:
        seen.append(app_id)
        return 7

    ledger = DeltaLedger(tmp_path / "l", sink_id="s", probe=probe)
    with pytest.raises(ConfigurationError, match=r"records batch 7.*Restore the ledger"):
        ledger.bind_query("q")
    assert seen == ["s"] and ledger.bound_query() is None
    fresh = DeltaLedger(tmp_path / "m", sink_id="s", probe=lambda app: None)
    assert fresh.bind_query("q") == 0
    # Once bound, the probe is not consulted again.
    assert DeltaLedger(tmp_path / "m", sink_id="s", probe=probe).bind_query("q") == 0
    assert seen == ["s"]


def test_intents_are_per_app_id_and_pruned_once_recorded(tmp_path: Path) -> None:
    from connectors.core.ledgers.ledger import LedgerEntry
    from connectors.core.states import BatchState

    ledger = DeltaLedger(tmp_path / "l", sink_id="s")
    assert ledger.intent(0, "s") is None
    ledger.intend(0, "s", "run1")
    first = ledger.intent(0, "s")
    assert first is not None and first["run_id"] == "run1" and first["at"] > 0
    ledger.intend(0, "s", "run2")  # a retry keeps the first attempt's record
    assert ledger.intent(0, "s") == first
    # An intent of an earlier binding generation is not this app id's.
    assert ledger.intent(0, "s.g1") is None
    ledger.intend(1, "s", "run1")
    ledger.decide(LedgerEntry("s", 0, "run1", BatchState.COMMITTED))
    ledger.prune(100)
    assert ledger.intent(0, "s") is None and ledger.intent(1, "s") is not None
    # A torn intent (operating-system crash) still counts as an attempt.
    (tmp_path / "l" / "intents" / f"{1:020d}.json").write_text("{")
    torn = ledger.intent(1, "s")
    assert torn is not None and torn["at"] == 0.0


def test_lease_keeps_a_second_driver_out_until_the_first_is_gone(tmp_path: Path) -> None:
    import subprocess
    import sys

    from connectors.lake import ledger as _ledger

    root = tmp_path / "l"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import importlib.util, sys, time, types\n"
         # The ledger needs no delta-spark; a lane without it (newest) still runs this.
         "if importlib.util.find_spec('delta') is None:\n"
         "    sys.modules['delta'] = types.ModuleType('delta')\n"
         "from connectors.delta import DeltaLedger\n"
         f"DeltaLedger({str(root)!r}, sink_id='s').open_run('other')\n"
         "print('held', flush=True)\n"
         "time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        ledger = DeltaLedger(root, sink_id="s")
        saved = _ledger.LEASE_WAIT_S
        _ledger.LEASE_WAIT_S = 0.5
        try:
            with pytest.raises(FencedError, match=r"another driver holds the lease.*other"):
                ledger.open_run("mine")
        finally:
            _ledger.LEASE_WAIT_S = saved
        holder.kill()  # SIGKILL: the kernel drops the lock with the process
        holder.wait()
        ledger.open_run("mine")
        # Sink objects of one process share the lease; it goes with the last close.
        again = DeltaLedger(root, sink_id="s")
        again.open_run("mine-too")
        again.close()
        ledger.close()
        assert not _ledger._LEASES
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
