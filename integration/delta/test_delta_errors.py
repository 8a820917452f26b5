"""DeltaSink on real Delta (the in-process session of ``conftest.spark``): bad input gives a
clear error and commits nothing, and after the fix the same batch is written exactly once;
replays are checked; expired or lost transaction ids are settled or refused; the ledger
survives VACUUM; several sinks share one table; the JVM and pure-Python log readers agree.

Every case is a batch-job call ``sink(df, batch_id)`` on its own table under ``tmp_path``.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from connectors.core.errors import (
    BadInputError,
    ConfigurationError,
    ConnectorError,
    NonDeterministicReplayError,
)
from connectors.delta import DeltaSink, DeltaSinks, LocalDeltaLog
from connectors.delta._log import jvm_log_state
from connectors.delta._writer import CONF_TXN_APP_ID, CONF_TXN_VERSION, CONF_USER_METADATA
from integration.support._delta import (
    ledger_batches,
    ledger_fingerprint,
    table_rows,
    tagged_commits,
)

pytestmark = pytest.mark.integration

ROWS = 200


def events(spark: SparkSession, start: int = 0, n: int = ROWS) -> DataFrame:
    """``id, name, amount`` with ids ``start..start+n-1`` in 2 partitions."""
    return spark.range(start, start + n, 1, 2).select(
        F.col("id"),
        F.concat(F.lit("name-"), F.col("id").cast("string")).alias("name"),
        (F.col("id") * F.lit(0.25)).alias("amount"),
    )


def expected(start: int, n: int) -> list[tuple[Any, ...]]:
    return [(i, f"name-{i}", i * 0.25) for i in range(start, start + n)]


def fails(call: Callable[[], object], error: type[ConnectorError], *needles: str) -> str:
    with pytest.raises(error) as info:
        call()
    text = str(info.value)
    for needle in needles:
        assert needle.lower() in text.lower(), f"{needle!r} not in {text!r}"
    return text


def versions(path: Path) -> int:
    state = LocalDeltaLog(path).read()
    return state.table_version if state.exists else -1


# ------------------------------------------------------------------------- bad input


def test_schema_mismatch_names_the_columns_then_merge_schema_writes_exactly_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "t"
    events(spark, 0, 10).write.format("delta").save(str(path))
    wider = events(spark, 100).withColumn("region", F.lit("eu"))
    sink = DeltaSink(str(path), sink_id="schema")
    fails(lambda: sink(wider, 0), BadInputError, "column(s) region are not in the table",
          "merge_schema=True")
    # A type mismatch names the column and both types.
    cast = events(spark, 100).withColumn("amount", F.col("amount").cast("string"))
    fails(lambda: sink(cast, 0), BadInputError, "column amount is string in the batch but "
          "double in the table")
    # Nothing was committed: one version (the table's creation), no ledger entry, no txn.
    assert versions(path) == 0 and not ledger_batches(path, "schema")
    sink.close()

    fixed = DeltaSink(str(path), sink_id="schema", merge_schema=True)
    fixed(wider, 0)
    fixed(wider, 0)  # a replay: nothing new
    rows = table_rows(spark, path, ["id", "name", "amount", "region"])
    assert rows == sorted([(*r, None) for r in expected(0, 10)]
                          + [(*r, "eu") for r in expected(100, ROWS)])
    assert tagged_commits(path, "schema") == {0: [1]}
    assert fixed.last_metrics is not None and fixed.last_metrics.outcome == "replayed"
    fixed.close()


def test_missing_table_is_an_error_then_create_table_creates_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "missing"
    sink = DeltaSink(str(path), sink_id="missing")
    fails(lambda: sink(events(spark), 0), BadInputError, "there is no delta table",
          "create_table=True")
    assert not (path / "_delta_log").exists()
    sink.close()
    creating = DeltaSink(str(path), sink_id="missing", create_table=True)
    creating(events(spark), 0)
    assert table_rows(spark, path, ["id", "name", "amount"]) == expected(0, ROWS)
    assert tagged_commits(path, "missing") == {0: [0]}
    creating.close()


def test_missing_catalog_table_then_create_table(spark: SparkSession, tmp_path: Path) -> None:
    name = f"default.eos_delta_{int(time.time() * 1000) % 10**9}"
    try:
        sink = DeltaSink(table=name, sink_id="catalog")
        fails(lambda: sink(events(spark), 0), BadInputError, f"table {name} does not exist",
              "create_table=True")
        creating = DeltaSink(table=name, sink_id="catalog", create_table=True)
        creating(events(spark), 0)
        creating(events(spark, ROWS), 1)
        creating(events(spark, ROWS), 1)
        got = sorted(tuple(r) for r in spark.table(name).select("id", "name", "amount").collect())
        assert got == expected(0, 2 * ROWS)
        location = Path(creating.location())
        assert sorted(tagged_commits(location, "catalog")) == [0, 1]
        assert (location / "_connectors" / "catalog" / "binding.json").exists()
        creating.close()
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")


def test_not_null_violation_commits_nothing_then_the_fix_is_exact(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "nn"
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT NOT NULL, name STRING, amount DOUBLE) "
              "USING delta")
    with_null = events(spark).withColumn(
        "id", F.when(F.col("id") == 7, F.lit(None)).otherwise(F.col("id")))
    sink = DeltaSink(str(path), sink_id="nn")
    fails(lambda: sink(with_null, 0), BadInputError, "NOT NULL column", "filter or fill")
    assert versions(path) == 0 and not ledger_batches(path, "nn")
    # A batch without the NOT NULL column is refused before anything runs.
    fails(lambda: sink(events(spark).drop("id"), 0), BadInputError,
          "NOT NULL column(s) id of the table are missing")
    sink(with_null.where(F.col("id").isNotNull()), 0)
    assert table_rows(spark, path, ["id", "name", "amount"]) == [
        r for r in expected(0, ROWS) if r[0] != 7]
    assert tagged_commits(path, "nn") == {0: [1]}
    sink.close()


SECRET = "bad-secret-4711"


@pytest.mark.parametrize("merge", [False, True], ids=["append", "merge"])
def test_check_violation_quotes_no_row_value_unless_values_in_errors(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture, merge: bool
) -> None:
    """A real CHECK constraint violation: Delta's own message quotes the row
    (DELTA_VIOLATE_CONSTRAINT_WITH_VALUES: "violated by row with values: - name : ...").
    The raised error, its whole traceback (causes included) and the library's log lines
    hold none of the row's values by default; with values_in_errors=True they may."""
    import traceback

    caplog.set_level(logging.DEBUG, logger="connectors")
    path = tmp_path / "chk"
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT, name STRING, amount DOUBLE) "
              "USING delta")
    spark.sql(f"ALTER TABLE delta.`{path}` ADD CONSTRAINT no_bad CHECK (name NOT LIKE 'bad%')")
    rows = events(spark).withColumn(
        "name", F.when(F.col("id") == 7, F.lit(SECRET)).otherwise(F.col("name")))
    keys = ["id"] if merge else None
    for values_in_errors in (False, True):
        caplog.clear()
        sink = DeltaSink(str(path), sink_id="chk", values_in_errors=values_in_errors,
                         merge_on=keys)
        with pytest.raises(BadInputError) as info:
            sink(rows, 0)
        sink.close()
        err = info.value
        text = "".join(traceback.format_exception(err))
        assert "DELTA_VIOLATE_CONSTRAINT_WITH_VALUES" in str(err)
        assert "constraintName=no_bad" in str(err) or "no_bad" in str(err)
        logs = caplog.text
        if values_in_errors:
            assert SECRET in str(err) and SECRET in text
        else:
            assert SECRET not in text, text
            assert SECRET not in logs, logs
            assert err.__cause__ is None and err.__suppress_context__
            assert "values_in_errors=True" in str(err)
    # Nothing was committed; the fixed batch is written exactly once.
    assert not ledger_batches(path, "chk") and not tagged_commits(path, "chk")
    sink = DeltaSink(str(path), sink_id="chk", merge_on=keys)
    sink(rows.where(F.col("id") != 7), 0)
    sink.close()
    assert table_rows(spark, path, ["id", "name", "amount"]) == [
        r for r in expected(0, ROWS) if r[0] != 7]
    assert sorted(tagged_commits(path, "chk")) == [0]


def test_merge_key_missing_from_the_batch_is_named(spark: SparkSession, tmp_path: Path) -> None:
    sink = DeltaSink(str(tmp_path / "m"), sink_id="mk", merge_on=["user_id"],
                     create_table=True)
    fails(lambda: sink(events(spark), 0), BadInputError, "merge_on column(s) user_id",
          "select them")
    sink.close()


# --------------------------------------------------------------------------- replays


def test_non_deterministic_replay_is_detected_by_the_fingerprint(
    spark: SparkSession, tmp_path: Path
) -> None:
    """An append hashes nothing while it writes; its replay is compared with the rows of
    the files its commit added, read back."""
    path = tmp_path / "nd"
    sink = DeltaSink(str(path), sink_id="nd", create_table=True)
    sink(events(spark), 0)
    assert ledger_fingerprint(path, "nd", 0) is None
    sink(events(spark).repartition(3), 0)  # the same rows (other order is fine): a replay
    assert sink.last_metrics is not None and sink.last_metrics.outcome == "replayed"
    # Same count, one value changed: only the digest can tell.
    changed = events(spark).withColumn(
        "name", F.when(F.col("id") == 3, F.lit("x")).otherwise(F.col("name")))
    fails(lambda: sink(changed, 0), NonDeterministicReplayError, "replayed batch differs",
          f"committed {ROWS} rows")
    warn = DeltaSink(str(path), sink_id="nd", on_replay_mismatch="warn")
    warn(changed, 0)  # keeps the committed rows
    assert table_rows(spark, path, ["id", "name", "amount"]) == expected(0, ROWS)
    assert tagged_commits(path, "nd") == {0: [0]}
    sink.close()
    warn.close()


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "not-recorded"])
def test_partitioned_append_replay_is_compared_with_its_commits_files(
    spark: SparkSession, tmp_path: Path, recorded: bool
) -> None:
    """Partition values come from the commit's ``partitionValues``, not the files; the
    batch's column order and types are the replay's. Recorded: the ledger has the batch;
    not recorded: a crash at after_decision (made by deleting the ledger's record)."""
    path = tmp_path / "pa"
    part = F.col("id") % 3

    def batch(df: DataFrame) -> DataFrame:
        return df.select(part.cast("int").alias("bucket"), "id", "name", "amount")

    sink = DeltaSink(str(path), sink_id="pa", create_table=True, partition_by=["bucket"])
    sink(batch(events(spark)), 0)
    sink.close()
    if not recorded:
        for p in (path / "_connectors" / "pa" / "decisions").glob(f"{0:020d}.*"):
            p.unlink()
    changed = batch(events(spark)).withColumn(
        "amount", F.when(F.col("id") == 5, F.lit(-1.0)).otherwise(F.col("amount")))
    again = DeltaSink(str(path), sink_id="pa")
    fails(lambda: again(changed, 0), NonDeterministicReplayError, "replayed batch differs")
    again.close()
    same = DeltaSink(str(path), sink_id="pa")
    same(batch(events(spark)).repartition(1), 0)
    assert same.last_metrics is not None and same.last_metrics.outcome == "replayed"
    same.close()
    got = table_rows(spark, path, ["bucket", "id", "name", "amount"])
    assert got == sorted((i % 3, *row) for i, row in enumerate(expected(0, ROWS)))
    assert tagged_commits(path, "pa") == {0: [0]}


def test_batch_committed_but_not_recorded_is_reconciled_and_its_row_count_checked(
    spark: SparkSession, tmp_path: Path
) -> None:
    """What a crash at after_decision leaves (Delta has it, the ledger not) — made by
    deleting the ledger's record; the kill tests make it with a real SIGKILL."""
    path = tmp_path / "rc"
    sink = DeltaSink(str(path), sink_id="rc", merge_on=["id"], create_table=True)
    sink(events(spark), 0)
    sink(events(spark, ROWS), 1)
    sink.close()
    decisions = path / "_connectors" / "rc" / "decisions"
    for p in decisions.glob(f"{1:020d}.*"):
        p.unlink()
    fewer = DeltaSink(str(path), sink_id="rc", merge_on=["id"])
    fails(lambda: fewer(events(spark, ROWS, ROWS - 1), 1), NonDeterministicReplayError,
          f"has {ROWS - 1} row(s)", f"committed {ROWS} row(s)")
    fewer.close()
    again = DeltaSink(str(path), sink_id="rc", merge_on=["id"])
    again(events(spark, ROWS), 1)
    assert again.last_metrics is not None and again.last_metrics.reconciled == 1
    assert table_rows(spark, path, ["id", "name", "amount"]) == expected(0, 2 * ROWS)
    assert tagged_commits(path, "rc") == {0: [1], 1: [2]}
    assert ledger_batches(path, "rc") == {0: True, 1: True}
    again.close()


@pytest.mark.parametrize("torn", [b"", b'{"v": 1, "sink_id": "to'], ids=["empty", "cut"])
def test_a_decision_torn_by_an_os_crash_is_settled_from_the_table(
    spark: SparkSession, tmp_path: Path, torn: bytes
) -> None:
    """DeltaLedger does not fsync its decisions (the Delta commit before each one is the
    durable record): an operating-system crash may leave one empty or cut. It then reads as
    absent, the replay is checked against the commit's files and the decision rewritten."""
    path = tmp_path / "torn"
    sink = DeltaSink(str(path), sink_id="torn", create_table=True)
    sink(events(spark), 0)
    sink(events(spark, ROWS), 1)
    sink.close()
    (path / "_connectors" / "torn" / "decisions" / f"{1:020d}.json").write_bytes(torn)
    other = DeltaSink(str(path), sink_id="torn")
    fails(lambda: other(events(spark, ROWS + 1), 1), NonDeterministicReplayError,
          "differs from what was committed")
    other.close()
    again = DeltaSink(str(path), sink_id="torn")
    again(events(spark, ROWS), 1)
    assert again.last_metrics is not None and again.last_metrics.reconciled == 1
    again(events(spark, 2 * ROWS), 2)
    assert table_rows(spark, path, ["id", "name", "amount"]) == expected(0, 3 * ROWS)
    assert tagged_commits(path, "torn") == {0: [0], 1: [1], 2: [2]}  # one commit per batch
    assert ledger_batches(path, "torn") == {0: True, 1: True, 2: True}
    again.close()


# ---------------------------------------------------------------- txn ids Delta forgot


def test_expired_transaction_id_is_settled_from_history_or_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "exp"
    # Txn ids exist on the delta_txn_id path only (the default tag path writes none).
    sink = DeltaSink(str(path), sink_id="exp", create_table=True, delta_txn_id=True)
    sink(events(spark, 0), 0)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
              "('delta.setTransactionRetentionDuration' = 'interval 1 seconds')")
    sink(events(spark, ROWS), 1)
    sink(events(spark, 2 * ROWS), 2)
    sink.close()
    # Batch 2 committed, its record lost (a crash at after_decision), and the id expired.
    for p in (path / "_connectors" / "exp" / "decisions").glob(f"{2:020d}.*"):
        p.unlink()
    time.sleep(2.5)
    assert jvm_log_state(spark, str(path), ["exp"]).version("exp") is None, "did not expire"
    assert LocalDeltaLog(path).read().version("exp") is None
    # The history still holds batch 1's commit and every later one: batch 2 is found there.
    resumed = DeltaSink(str(path), sink_id="exp", delta_txn_id=True)
    resumed(events(spark, 2 * ROWS), 2)
    assert resumed.last_metrics is not None and resumed.last_metrics.outcome == "replayed"
    resumed(events(spark, 3 * ROWS), 3)  # a new batch is written (and its id recorded again)
    resumed.close()
    assert table_rows(spark, path, ["id", "name", "amount"]) == expected(0, 4 * ROWS)
    assert sorted(tagged_commits(path, "exp")) == [0, 1, 2, 3]

    # The table recreated under the ledger: nothing in the log or history proves batch 4.
    shutil.rmtree(path / "_delta_log")
    for f in path.glob("*.parquet"):
        f.unlink()
    events(spark, 0, 5).write.format("delta").mode("append").save(str(path))
    refused = DeltaSink(str(path), sink_id="exp", delta_txn_id=True)
    fails(lambda: refused(events(spark, 4 * ROWS), 4), ConfigurationError,
          "no longer records the sink's transaction id", "recreated or replaced",
          "refuses to write it again", "setTransactionRetentionDuration")
    assert table_rows(spark, path, ["id"]) == [(i,) for i in range(5)]
    refused.close()


def test_lost_ledger_is_refused_when_the_table_knows_the_sink(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "lost"
    sink = DeltaSink(str(path), sink_id="lost", create_table=True)
    sink(events(spark), 0)
    sink.close()
    shutil.rmtree(path / "_connectors")
    again = DeltaSink(str(path), sink_id="lost")
    fails(lambda: again(events(spark, ROWS), 1), ConfigurationError, "ledger",
          "records batch 0", "new sink_id")
    assert tagged_commits(path, "lost") == {0: [0]}
    again.close()


# ------------------------------------------------------------------ table maintenance


def test_vacuum_leaves_the_ledger_alone(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "vac"
    sink = DeltaSink(str(path), sink_id="vac", mode="overwrite", create_table=True)
    sink(events(spark, 0), 0)
    sink(events(spark, ROWS), 1)  # overwrite: the files of batch 0 become garbage
    ledger_files = sorted(p for p in (path / "_connectors").rglob("*") if p.is_file())
    check = "spark.databricks.delta.retentionDurationCheck.enabled"
    spark.conf.set(check, "false")
    try:
        spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS")
    finally:
        spark.conf.unset(check)
    assert sorted(p for p in (path / "_connectors").rglob("*") if p.is_file()) == ledger_files
    sink(events(spark, ROWS), 1)  # still a replay after VACUUM
    assert sink.last_metrics is not None and sink.last_metrics.outcome == "replayed"
    assert table_rows(spark, path, ["id", "name", "amount"]) == expected(ROWS, ROWS)
    sink.close()


# ---------------------------------------------------------------- several sinks, MERGE


def test_two_sinks_write_one_table_in_one_batch_with_distinct_app_ids(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "two"
    both = DeltaSinks([DeltaSink(str(path), sink_id="first", create_table=True),
                       DeltaSink(str(path), sink_id="second", create_table=True)])
    both(events(spark), 0)
    both(events(spark), 0)  # replay: neither writes again
    both(events(spark, ROWS), 1)
    both.close()
    rows = table_rows(spark, path, ["id", "name", "amount"])
    assert rows == sorted(expected(0, 2 * ROWS) * 2), "every row once per sink"
    assert sorted(tagged_commits(path, "first")) == [0, 1]
    assert sorted(tagged_commits(path, "second")) == [0, 1]
    # The default (tag) path writes no Delta txn ids; the tags tell the sinks apart.
    assert LocalDeltaLog(path).read().versions == {}


def test_merge_dedupes_by_key_and_leaves_no_session_conf_behind(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "upsert"
    sink = DeltaSink(str(path), sink_id="upsert", merge_on=["k"], create_table=True)
    batch = events(spark).withColumn("k", F.col("id") % 10)  # 20 rows per key
    sink(batch, 0)
    for key in (CONF_TXN_APP_ID, CONF_TXN_VERSION, CONF_USER_METADATA):
        assert spark.conf.get(key, None) is None, key
    later = events(spark, ROWS, 5).withColumn("k", F.col("id") % 10)  # keys 0..4 updated
    sink(later, 1)
    sink(later, 1)
    got = table_rows(spark, path, ["k", "id", "name"])
    best = {k: max(i for i in range(ROWS) if i % 10 == k) for k in range(10)}
    best.update({i % 10: i for i in range(ROWS, ROWS + 5)})
    assert got == sorted((k, i, f"name-{i}") for k, i in best.items())
    assert tagged_commits(path, "upsert") == {0: [1], 1: [2]}
    sink.close()


def test_jvm_and_pure_python_log_readers_agree_across_a_checkpoint(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "cp"
    events(spark, 0, 5).write.format("delta").save(str(path))
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.checkpointInterval' = '2')")
    sink = DeltaSink(str(path), sink_id="cp", delta_txn_id=True)
    other = DeltaSink(str(path), sink_id="cp-other", delta_txn_id=True)
    for b in range(4):
        sink(events(spark, 100 * b, 5), b)
    other(events(spark, 1000, 5), 0)
    sink.close()
    other.close()
    assert list((path / "_delta_log").glob("*.checkpoint*.parquet")), "no checkpoint written"
    jvm = jvm_log_state(spark, str(path), ["cp", "cp-other", "nobody"])
    local = LocalDeltaLog(path).read()
    assert jvm.versions == {"cp": 3, "cp-other": 0}
    assert {k: v for k, v in local.versions.items() if k in jvm.versions} == jvm.versions
    assert local.table_version == jvm.table_version
