"""DeltaSink's change streams and overwrite variants on real Delta, in process (batch-job calls
``sink(df, batch_id)``): the condition form and the function form applied to changes of
``integration.delta._delta_cdc`` compared row by row with a plain application of the input;
replays holding other changes refused; bad conditions and rows outside ``replace_where``
fail the batch with a clear error, commit nothing, and after the fix the batch is exact.
The streaming SIGKILL test of the same sinks (and the function form's exactness over a
stream) is ``test_delta_changes_kill.py``; the other form/recording pairs of the replay
check run with ``EOS_WIDE_MATRIX=1``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from connectors.core.errors import BadInputError, ConfigurationError, NonDeterministicReplayError
from connectors.delta import DeltaSink
from integration.delta._delta_cdc import (
    COLUMNS,
    apply_changes,
    change,
    changes,
    expected_dynamic,
    expected_merge,
)
from integration.delta.test_delta_errors import fails, versions
from integration.support._delta import ledger_batches, operations, table_rows, tagged_commits

pytestmark = pytest.mark.integration

R = 60  # rows per batch


def batch(spark: SparkSession, b: int, rows: int = R) -> DataFrame:
    """Batch ``b`` of the change stream (values ``b*R .. b*R+rows-1``), 2 partitions."""
    return changes(spark.range(b * R, b * R + rows, 1, 2).withColumnRenamed("id", "value"), R)


def cond_sink(path: Path, **kwargs: Any) -> DeltaSink:
    options: dict[str, Any] = {
        "sink_id": "cond", "merge_on": ["id"], "sequence_column": "seq",
        "delete_when": "s.op = 'd'", "update_when": "s.seq > t.seq",
        "exclude_columns": ["op"], "create_table": True}
    options.update(kwargs)
    return DeltaSink(str(path), **options)


def test_condition_form_applies_a_change_stream_exactly(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Three batches (deletes, delete then re-insert, deletes of unknown keys, several
    changes per key), batch 1 shuffled, batch 2 written twice (a replay): the table is the
    plain application of every change, without the excluded ``op`` column."""
    path = tmp_path / "cond"
    sink = cond_sink(path)
    for b in range(3):
        df = batch(spark, b)
        sink(df.orderBy(F.rand(7)) if b == 1 else df, b)
    sink(batch(spark, 2).repartition(3), 2)  # the same changes again: a replay, skipped
    assert sink.last_metrics is not None and sink.last_metrics.outcome == "replayed"
    sink.close()
    cols = [c for c in COLUMNS if c != "op"]
    assert spark.read.format("delta").load(str(path)).columns == cols  # op is not stored
    want = sorted(tuple(v for c, v in zip(COLUMNS, r, strict=True) if c != "op")
                  for r in expected_merge(range(3 * R), R).values())
    assert table_rows(spark, path, cols) == want
    assert tagged_commits(path, "cond") == {0: [1], 1: [2], 2: [3]}
    assert operations(path) == ["WRITE", "MERGE", "MERGE", "MERGE"]
    assert ledger_batches(path, "cond") == {0: True, 1: True, 2: True}


def test_sequence_column_decides_and_ties_break_by_value(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Per key the greatest seq wins, whatever the order; equal seqs: the greatest row."""
    path = tmp_path / "ties"
    rows = [(1, "u", 5, "a"), (1, "d", 4, "b"), (2, "u", 1, "x"), (2, "u", 1, "y"),
            (3, "u", 1, "p"), (3, "d", 2, "q"), (4, "d", 9, "never-seen")]
    df = spark.createDataFrame(rows, "id LONG, op STRING, seq LONG, name STRING")
    sink = DeltaSink(str(path), sink_id="ties", merge_on=["id"], sequence_column="seq",
                     delete_when="s.op = 'd'", create_table=True)
    sink(df, 0)
    sink.close()
    assert table_rows(spark, path, ["id", "op", "seq", "name"]) == [
        (1, "u", 5, "a"), (2, "u", 1, "y")]


def test_a_column_named_like_the_sinks_rank_column_is_kept(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The per-key ranking adds a column of its own; a batch column of that name (any
    case) is neither overwritten nor dropped."""
    path = tmp_path / "rank"
    rows = [(1, 5, 50), (1, 7, 70), (2, 1, 10)]
    df = spark.createDataFrame(rows, "id LONG, seq LONG, __Connectors_Rank LONG")
    sink = DeltaSink(str(path), sink_id="rank", merge_on=["id"], sequence_column="seq",
                     create_table=True)
    sink(df, 0)
    sink.close()
    assert table_rows(spark, path, ["id", "seq", "__Connectors_Rank"]) == [(1, 7, 70),
                                                                           (2, 1, 10)]


def test_a_merge_function_that_returns_no_builder_is_refused_and_commits_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "nob"
    sink = DeltaSink(str(path), sink_id="nob", merge_on=["id"], create_table=True,
                     merge=lambda t, s: None)
    fails(lambda: sink(batch(spark, 0), 0), ConfigurationError, "DeltaMergeBuilder",
          "did it call .execute()")
    sink.close()
    assert tagged_commits(path, "nob") == {}


def test_a_merge_function_that_executes_itself_is_refused_and_not_applied_twice(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The common slip: the function ends in ``.execute()``. The batch fails naming it;
    the MERGE it ran carries the batch's tag, so after the fix the same batch is found
    committed and not applied again (one tagged commit, the table as one application)."""
    path = tmp_path / "self"
    options: dict[str, Any] = {"sink_id": "self", "merge_on": ["id"],
                               "sequence_column": "seq", "create_table": True}
    wrong = DeltaSink(str(path), merge=lambda t, s: apply_changes(t, s).execute(), **options)
    fails(lambda: wrong(batch(spark, 0), 0), ConfigurationError, "did it call .execute()")
    wrong.close()
    fixed = DeltaSink(str(path), merge=apply_changes, **options)
    for b in range(2):
        fixed(batch(spark, b), b)
    fixed.close()
    commits = tagged_commits(path, "self")
    assert sorted(commits) == [0, 1] and all(len(v) == 1 for v in commits.values()), commits
    assert table_rows(spark, path, COLUMNS) == sorted(expected_merge(range(2 * R), R).values())


def test_the_function_form_is_refused_under_spark_connect(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(Spark Connect made to answer true: the refusal comes before anything is written.)"""
    monkeypatch.setattr("connectors.delta._changes.is_connect", lambda session: True)
    path = tmp_path / "connect"
    sink = DeltaSink(str(path), sink_id="fnc", merge_on=["id"], merge=apply_changes,
                     create_table=True)
    fails(lambda: sink(batch(spark, 0), 0), ConfigurationError, "needs classic PySpark",
          "condition form")
    assert not path.exists() or tagged_commits(path, "fnc") == {}


@pytest.mark.parametrize(("form", "recorded"), [
    ("cond", True), ("fn", False),
    *([("cond", False), ("fn", True)] if os.environ.get("EOS_WIDE_MATRIX") == "1" else [])])
def test_a_replay_holding_other_changes_is_refused(
    spark: SparkSession, tmp_path: Path, recorded: bool, form: str
) -> None:
    """Recorded: the observed fingerprint differs (one change's op flipped, same count);
    not recorded (a crash at after_decision, made by deleting the ledger's record): the
    deduplicated source's row count differs from the commit's numSourceRows."""
    path = tmp_path / form

    def make(**kw: Any) -> DeltaSink:
        if form == "cond":
            return cond_sink(path, **kw)
        return DeltaSink(str(path), sink_id="cond", merge_on=["id"], sequence_column="seq",
                         merge=apply_changes, create_table=True, **kw)

    sink = make()
    sink(batch(spark, 0), 0)
    sink.close()
    if recorded:
        other = batch(spark, 0).withColumn(
            "op", F.when(F.col("seq") == 3, F.lit("u")).otherwise(F.col("op")))
        needle = "replayed batch differs"
    else:
        for p in (path / "_connectors" / "cond" / "decisions").glob(f"{0:020d}.*"):
            p.unlink()
        other = batch(spark, 0, R - 10)  # fewer keys
        needle = "row(s) (Delta commit"
    again = make()
    fails(lambda: again(other, 0), NonDeterministicReplayError, needle)
    again.close()
    warn = make(on_replay_mismatch="warn")
    warn(other, 0)  # the operator's override keeps the committed rows
    warn.close()
    assert tagged_commits(path, "cond") == {0: [1]}
    assert len(table_rows(spark, path, ["id"])) == len(expected_merge(range(R), R))


def test_a_condition_naming_a_missing_column_commits_nothing_then_the_fix_is_exact(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "bad"
    good = cond_sink(path)
    good(batch(spark, 0), 0)
    good.close()
    before = versions(path)
    bad = cond_sink(path, delete_when="s.kind = 'd'")
    fails(lambda: bad(batch(spark, 1), 1), BadInputError, "delete_when", "kind",
          "exclude_columns")
    bad.close()
    wrong_scope = cond_sink(path, insert_when="t.seq IS NULL")
    fails(lambda: wrong_scope(batch(spark, 1), 1), BadInputError, "insert_when",
          "the source s only")
    wrong_scope.close()
    fn = DeltaSink(str(path), sink_id="cond", merge_on=["id"], exclude_columns=["op"],
                   merge=lambda t, s: (
        t.alias("t").merge(s.alias("s"), "t.id = s.id").whenMatchedDelete("s.kind = 'd'")))
    fails(lambda: fn(batch(spark, 1), 1), BadInputError, "DELTA_MERGE_UNRESOLVED_EXPRESSION")
    fn.close()
    assert versions(path) == before, "a failed batch committed"
    fixed = cond_sink(path)
    fixed(batch(spark, 1), 1)
    fixed.close()
    cols = [c for c in COLUMNS if c != "op"]
    want = sorted(tuple(v for c, v in zip(COLUMNS, r, strict=True) if c != "op")
                  for r in expected_merge(range(2 * R), R).values())
    assert table_rows(spark, path, cols) == want
    assert tagged_commits(path, "cond") == {0: [1], 1: [2]}


def test_replace_where_and_dynamic_overwrite_are_exact_and_idempotent(
    spark: SparkSession, tmp_path: Path
) -> None:
    """replace_where keeps the rows outside it; a row of the batch outside it is a
    BadInputError naming the option, committing nothing; dynamic overwrite replaces the
    partitions a batch holds. Each batch written twice: one commit each."""
    rp, dp = tmp_path / "replace", tmp_path / "dynamic"
    seed = spark.createDataFrame([(-1, "u", -1, "seed", 0.0, -1)], ", ".join(
        f"{c} {t}" for c, t in zip(COLUMNS, ["LONG", "STRING", "LONG", "STRING", "DOUBLE",
                                             "LONG"], strict=True)))
    seed.write.format("delta").save(str(rp))
    replace = DeltaSink(str(rp), sink_id="rw", mode="overwrite", replace_where="bucket >= 0")
    dynamic = DeltaSink(str(dp), sink_id="dyn", mode="overwrite", create_table=True,
                        partition_overwrite_mode="dynamic", partition_by=["bucket"])
    for b in range(2):
        for sink in (replace, dynamic, replace, dynamic):
            sink(batch(spark, b), b)
    outside = batch(spark, 2).withColumn("bucket", F.col("bucket") - 1)  # bucket -1 rows
    fails(lambda: replace(outside, 2), BadInputError, "replace_where", "bucket >= 0")
    assert sorted(tagged_commits(rp, "rw")) == [0, 1]
    replace(batch(spark, 2), 2)  # the fix: the batch's rows all inside
    replace.close()
    dynamic.close()
    last = sorted(change(v, R) for v in range(2 * R, 3 * R))
    assert table_rows(spark, rp, COLUMNS) == sorted([(-1, "u", -1, "seed", 0.0, -1), *last])
    assert table_rows(spark, dp, COLUMNS) == expected_dynamic(2, R)
    assert {b: len(v) for b, v in tagged_commits(rp, "rw").items()} == {0: 1, 1: 1, 2: 1}
    assert {b: len(v) for b, v in tagged_commits(dp, "dyn").items()} == {0: 1, 1: 1}
