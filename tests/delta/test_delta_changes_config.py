"""DeltaSink's change-stream and overwrite options: the checks that name their fix, and the
MERGE the condition form builds (no Spark JVM: nothing here starts a session)."""

from __future__ import annotations

import pickle

import pytest

from connectors.core.errors import BadInputError, ConfigurationError
from connectors.delta import DeltaSink
from connectors.delta._errors import ErrorFacts, translate
from connectors.lake.changes import ChangeSpec, clauses, merge_sql


def merge_fn(target: object, source: object) -> object:
    return target


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"sequence_column": "seq"}, r"sequence_column need\(s\) merge_on"),
        ({"delete_when": "s.op = 'd'"}, r"delete_when need\(s\) merge_on"),
        ({"merge_on": ["id"], "update_when": " "}, "update_when must be a non-empty string"),
        ({"merge_on": ["id"], "sequence_column": "id"}, "is a merge_on key"),
        ({"merge": merge_fn, "delete_when": "s.op = 'd'"}, "write the conditions into"),
        ({"merge": "MERGE INTO"}, "merge must be a function"),
        ({"merge": merge_fn, "mode": "overwrite"}, "cannot be combined with mode='overwrite'"),
        ({"exclude_columns": ["op"]}, "exclude_columns applies to a MERGE"),
        ({"merge_on": ["id"], "exclude_columns": ["ID"]}, "the table must store its keys"),
        ({"merge_on": ["id"], "exclude_columns": ["op", "OP"]}, "exclude_columns repeats"),
        ({"merge_on": ["id"], "exclude_columns": [""]}, "exclude_columns must be a list"),
        ({"replace_where": "d > 1"}, "replace_where applies to mode='overwrite'"),
        ({"partition_overwrite_mode": "dynamic"}, "applies to mode='overwrite'"),
        ({"mode": "overwrite", "partition_overwrite_mode": "DYNAMIC"}, "'static' or 'dynamic'"),
        ({"mode": "overwrite", "partition_overwrite_mode": "dynamic"}, "pass partition_by"),
        ({"mode": "overwrite", "partition_overwrite_mode": "dynamic", "partition_by": ["d"],
          "replace_where": "d > 1"}, "cannot be combined"),
        ({"mode": "overwrite", "replace_where": ""}, "replace_where must be a non-empty"),
    ],
)
def test_bad_change_options_name_the_fix(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigurationError, match=needle):
        DeltaSink("/d", sink_id="s", **kwargs)  # type: ignore[arg-type]


def test_good_change_options() -> None:
    sink = DeltaSink("/d", sink_id="cdc", merge_on=["id"], sequence_column="seq",
                     delete_when="s.op = 'd'", update_when="s.seq > t.seq",
                     exclude_columns="op")
    assert sink.changes == ChangeSpec(("id",), "seq", "s.op = 'd'", "s.seq > t.seq", None,
                                      ("op",), None)
    assert pickle.loads(pickle.dumps(sink)).changes == sink.changes
    fn = DeltaSink("/d", sink_id="fn", merge=merge_fn)
    assert fn.changes.merges and fn.merge_on == ()
    assert repr(fn) == "DeltaSink('/d', sink_id='fn', merge=<function>)"
    rw = DeltaSink("/d", sink_id="rw", mode="overwrite", replace_where="d >= '2026-01-01'")
    assert rw.replace_where == "d >= '2026-01-01'" and not rw.changes.merges
    dyn = DeltaSink("/d", sink_id="dyn", mode="overwrite", partition_by=["d"],
                    partition_overwrite_mode="dynamic")
    assert dyn.partition_overwrite_mode == "dynamic"


def test_the_condition_forms_clauses_and_sql() -> None:
    spec = ChangeSpec(("id",), "seq", "s.op = 'd'", "s.seq > t.seq", "s.seq > 0", ("op",))
    parts = clauses(spec, ["id", "op", "seq", "v"])
    assert [(c.kind, c.condition, c.columns) for c in parts] == [
        ("delete", "s.op = 'd'", None),
        ("update", "s.seq > t.seq", ("id", "seq", "v")),
        ("insert", "NOT coalesce((s.op = 'd'), false) AND (s.seq > 0)", ("id", "seq", "v")),
    ]
    sql = merge_sql("delta.`/d`", "view", "t.`id` <=> s.`id`", parts, schema_evolution=False)
    assert sql == (
        "MERGE INTO delta.`/d` t USING `view` s ON t.`id` <=> s.`id` "
        "WHEN MATCHED AND (s.op = 'd') THEN DELETE "
        "WHEN MATCHED AND (s.seq > t.seq) THEN UPDATE SET `id` = s.`id`, `seq` = s.`seq`, "
        "`v` = s.`v` "
        "WHEN NOT MATCHED AND (NOT coalesce((s.op = 'd'), false) AND (s.seq > 0)) THEN "
        "INSERT (`id`, `seq`, `v`) VALUES (s.`id`, s.`seq`, s.`v`)")
    plain = clauses(ChangeSpec(("id",)), ["id", "v"])
    assert merge_sql("x", "w", "on", plain, schema_evolution=True) == (
        "MERGE WITH SCHEMA EVOLUTION INTO x t USING `w` s ON on "
        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")


def test_replace_where_mismatch_is_bad_input_naming_the_option(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    facts = ErrorFacts(conditions=["DELTA_REPLACE_WHERE_MISMATCH",
                                   "DELTA_VIOLATE_CONSTRAINT_WITH_VALUES"],
                       params={"DELTA_REPLACE_WHERE_MISMATCH": {
                           "replaceWhere": "b < 3", "message": "row with values: - b : 5"}})
    monkeypatch.setattr("connectors.delta._errors.error_facts", lambda exc: facts)
    err = translate(RuntimeError("x"), doing="writing", sink_id="s")
    assert isinstance(err, BadInputError)
    assert "replace_where" in str(err) and "replaceWhere=b < 3" in str(err)
    assert "b : 5" not in str(err)
