"""IcebergSink's rules without Spark jobs: its tag, the rule that settles a crashed batch from
the table's snapshots (every case of docs/design/iceberg.md), and its refusals."""

from __future__ import annotations

import pyspark
import pytest

from connectors.core.errors import ConfigurationError, DataLossError
from connectors.iceberg import IcebergSink, SnapshotTag
from connectors.iceberg._snapshots import Snapshot, TableSnapshots
from connectors.spark.toolkit import iceberg_runtime

APP = "events"


def has_runtime() -> bool:
    try:
        iceberg_runtime(pyspark.__version__)
    except ConfigurationError:
        return False
    return True


def tag(batch: int, app: str = APP) -> SnapshotTag:
    return SnapshotTag("events", app, batch, "q", "r")


def table(*snaps: tuple[int, int | None, SnapshotTag | None], current: int | None = None
          ) -> TableSnapshots:
    by_id = {sid: Snapshot(sid, parent, "append", t) for sid, parent, t in snaps}
    return TableSnapshots("lake.db.t", current if current is not None else snaps[-1][0], by_id)


def settle(t: TableSnapshots, batch: int) -> bool:
    return t.settle(APP, batch, sink_id="events", intent="/x/intents/1.json")


def test_tag_round_trips_through_the_summary_and_ignores_other_writers() -> None:
    t = tag(7)
    props = t.properties()
    assert props == {"connectors.sink": "events", "connectors.app": APP,
                     "connectors.batch": "7", "connectors.query": "q", "connectors.run": "r"}
    assert t.write_options()["snapshot-property.connectors.batch"] == "7"
    assert SnapshotTag.parse({**props, "added-records": "5"}) == t
    assert SnapshotTag.parse({"spark.app.id": "x"}) is None
    assert SnapshotTag.parse({"connectors.app": APP, "connectors.batch": "x"}) is None
    assert SnapshotTag.parse(None) is None


def test_the_batch_on_the_chain_is_committed_past_other_writers_and_compactions() -> None:
    t = table((1, None, tag(0)), (2, 1, tag(1)), (3, 2, None), (4, 3, None))
    assert settle(t, 1)


def test_an_earlier_batch_of_ours_first_on_the_chain_means_not_committed() -> None:
    t = table((1, None, tag(0)), (2, 1, tag(1)), (3, 2, None))
    assert not settle(t, 2)


def test_another_app_id_of_the_same_sink_does_not_count() -> None:
    t = table((1, None, tag(5, app="events.g1")), (2, 1, None))
    assert not settle(t, 5)


def test_the_whole_chain_without_a_tag_means_not_committed() -> None:
    assert not settle(table((1, None, None), (2, 1, None)), 0)


def test_an_expired_parent_before_any_tag_is_searched_then_refused() -> None:
    # snapshot 2 (ours, batch 3) survived expiry off the chain's end: committed.
    kept = table((2, 99, tag(3)), (5, 2, None))
    assert settle(kept, 3)
    # nothing of ours left and the chain broken: the sink cannot prove it, and says how.
    gone = table((5, 4, None))
    with pytest.raises(DataLossError, match="cannot be proved") as err:
        settle(gone, 3)
    assert "expire_snapshots" in str(err.value)
    assert "/x/intents/1.json" in str(err.value)


def test_a_table_without_snapshots_holds_nothing() -> None:
    empty = TableSnapshots("lake.db.t", None, {})
    assert not settle(empty, 0)
    assert empty.last_batch(APP) is None
    assert table((1, None, tag(0)), (2, 1, tag(4))).last_batch(APP) == 4


def test_a_spark_without_an_iceberg_runtime_is_refused_by_name() -> None:
    if has_runtime():
        sink = IcebergSink("lake.db.t", sink_id="events")
        assert repr(sink) == "IcebergSink('lake.db.t', sink_id='events', mode='append')"
        return
    with pytest.raises(ConfigurationError, match="publishes no Spark runtime for Spark"):
        IcebergSink("lake.db.t", sink_id="events")


@pytest.mark.parametrize("version", ["4.2.0", "4.3.1"])
def test_the_runtime_table_has_no_runtime_for_spark_4_2_and_4_3(version: str) -> None:
    with pytest.raises(ConfigurationError, match=r"no Spark runtime for Spark 4\.[23]"):
        iceberg_runtime(version)
    assert iceberg_runtime("4.1.4") == "1.12.0"
    assert iceberg_runtime("4.0.5") == "1.11.0"
    assert iceberg_runtime("3.5.3") == "1.12.0"


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"mode": "upsert"}, "mode must be"),
    ({"mode": "overwrite", "merge_on": ["id"]}, "cannot be combined with mode='overwrite'"),
    ({"sequence_column": "seq"}, r"need\(s\) merge_on"),
    ({"merge_on": ["id"], "sequence_column": "id"}, "is a merge_on key"),
    ({"merge_on": ["id", "id"]}, "repeats a column"),
    ({"merge_on": ["id"], "exclude_columns": ["id"]}, "the table must store its keys"),
    ({"exclude_columns": ["op"]}, "applies to a MERGE"),
    ({"merge_on": ["id"], "delete_when": " "}, "must be a non-empty string"),
    ({"replace_where": "d = 1"}, "go with mode='overwrite'"),
    ({"mode": "overwrite", "partition_overwrite_mode": "dynamic", "replace_where": "d = 1"},
     "not both"),
    ({"mode": "overwrite", "partition_overwrite_mode": "sometimes"},
     "partition_overwrite_mode must be"),
])
def test_options_that_do_not_fit_together_are_refused(kwargs: dict[str, str],
                                                      match: str) -> None:
    # Checked before the Spark check: on every Spark, with or without an Iceberg runtime.
    with pytest.raises(ConfigurationError, match=match):
        IcebergSink("lake.db.t", sink_id="events", **kwargs)  # type: ignore[arg-type]


def test_a_merge_is_one_sql_statement_tagged_by_session_confs() -> None:
    from connectors.lake.changes import change_spec, clauses, merge_sql, on_keys

    spec = change_spec("events", merge_on=("id",), sequence_column="seq",
                       delete_when="s.op = 'd'", update_when="s.seq > t.seq", insert_when=None,
                       exclude_columns=["op"])
    sql = merge_sql("lake.db.t", "v", on_keys(spec.merge_on),
                    clauses(spec, ["id", "op", "seq", "name"]), schema_evolution=False)
    assert sql == (
        "MERGE INTO lake.db.t t USING `v` s ON t.`id` <=> s.`id` "
        "WHEN MATCHED AND (s.op = 'd') THEN DELETE "
        "WHEN MATCHED AND (s.seq > t.seq) THEN UPDATE SET `id` = s.`id`, `seq` = s.`seq`, "
        "`name` = s.`name` "
        "WHEN NOT MATCHED AND (NOT coalesce((s.op = 'd'), false)) THEN INSERT (`id`, `seq`, "
        "`name`) VALUES (s.`id`, s.`seq`, s.`name`)")
    confs = tag(3).session_confs()
    assert confs["spark.sql.iceberg.snapshot-property.connectors.batch"] == "3"
    assert set(confs) == {f"spark.sql.iceberg.{k}" for k in tag(3).write_options()}
