"""DeltaSink and DeltaSinks options, reprs, pickling, error translation and the ledger
(no Spark JVM: nothing here starts a session)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from connectors.core.errors import (
    BadInputError,
    ConfigurationError,
    TransientError,
)
from connectors.delta import DeltaLedger, DeltaSink, DeltaSinks
from connectors.delta._errors import translate
from connectors.delta._sink import _local_path


def test_path_sink_defaults() -> None:
    sink = DeltaSink("/data/events", sink_id="events-delta")
    assert sink.path == "/data/events" and sink.table is None
    assert sink.merge_on == () and sink.mode == "append" and not sink.create_table
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
    sink._versions = {"s": 3}
    clone = pickle.loads(pickle.dumps(sink))
    assert clone.merge_on == ("k",) and clone._versions == {} and clone._ledger is None


def test_sinks_refuse_repeated_sink_ids_so_delta_never_skips_a_write() -> None:
    with pytest.raises(ConfigurationError, match=r"sink id.*repeat"):
        DeltaSinks([DeltaSink("/a", sink_id="x"), DeltaSink("/b", sink_id="x")])
    with pytest.raises(ConfigurationError, match="non-empty list"):
        DeltaSinks([])
    two = DeltaSinks([DeltaSink("/a", sink_id="x"), DeltaSink("/a", sink_id="y")])
    assert [s.sink_id for s in two.sinks] == ["x", "y"]


def test_local_path() -> None:
    assert _local_path("/data/t") == Path("/data/t")
    assert _local_path("file:/data/t") == Path("/data/t")
    assert _local_path("file:///data/t") == Path("/data/t")
    assert _local_path("s3a://bucket/t") is None


@pytest.mark.parametrize(
    ("text", "cls", "needle"),
    [
        ("[DELTA_NOT_NULL_CONSTRAINT_VIOLATED] NOT NULL constraint violated for column: id.",
         BadInputError, "NOT NULL column"),
        ("[DELTA_FAILED_TO_MERGE_FIELDS] Failed to merge fields 'id' and 'id'",
         BadInputError, "merge_schema=True"),
        ("io.delta.exceptions.ConcurrentAppendException: Files were added",
         TransientError, "another writer"),
        ("[DELTA_MISSING_DELTA_TABLE] /x is not a Delta table.", BadInputError,
         "create_table=True"),
    ],
)
def test_delta_errors_are_translated_in_one_table(text: str, cls: type, needle: str) -> None:
    exc = RuntimeError(text)
    err = translate(exc, doing="writing batch 3", sink_id="s", batch_id=3)
    assert isinstance(err, cls) and needle in str(err) and err.__cause__ is exc
    assert err.batch_id == 3 and "writing batch 3" in str(err)


def test_unknown_errors_pass_through_unchanged() -> None:
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
