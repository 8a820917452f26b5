"""Fingerprints on real Spark: what the tasks sum from the row-hash column (or hash themselves)
equals :meth:`SparkBatch.fingerprint` (one aggregation job) and Delta's observed
fingerprint, whatever the partitioning and order, and one changed value changes it.
"""

from __future__ import annotations

import datetime as dt
import decimal
import gc
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from connectors.core.batch import TaskInfo, TaskOutcome
from connectors.core.errors import BadInputError
from connectors.core.fingerprint import ROW_HASH_COLUMN, Fingerprint, split_row_hash
from connectors.core.ledgers.ledger import TaskCommit
from connectors.spark.frames import SparkBatch
from connectors.spark.toolkit import observe

pytestmark = pytest.mark.integration

SCHEMA = (
    "id long, name string, amount double, ts timestamp, price decimal(12,2), raw binary, "
    "tags array<string>, point struct<x: int, y: int>, attrs map<string, int>"
)


def _rows() -> list[tuple[Any, ...]]:
    base = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    return [
        (i, f"name-{i}" if i % 7 else None, i * 0.5, base + dt.timedelta(seconds=i),
         decimal.Decimal(i) / 4, bytes([i % 256]) * (i % 5), [f"t{i}", "x"] if i % 3 else None,
         (i, -i) if i % 4 else None, {"k": i} if i % 2 else None)
        for i in range(500)
    ]


def _df(spark: SparkSession, partitions: int = 2) -> DataFrame:
    return spark.createDataFrame(_rows(), SCHEMA).repartition(partitions)


def _task_sum(batch: SparkBatch) -> Fingerprint:
    """What the protocol's tasks compute: the sum of the row-hash column, per task."""
    def task(info: TaskInfo, batches: Iterator[pa.RecordBatch]) -> TaskOutcome:
        fp, columns = Fingerprint(), None
        for b in batches:
            part, data = split_row_hash(b)
            fp, columns = fp + part, data.schema.names
        assert columns is None or ROW_HASH_COLUMN not in columns  # the sink never sees it
        return TaskOutcome(commit=TaskCommit("t", info.partition, info.task_attempt_id, fp))

    outcomes = batch.run_tasks(task)
    assert all(o.error is None and o.commit is not None for o in outcomes), outcomes
    return sum((o.commit.fingerprint for o in outcomes if o.commit), Fingerprint())


def test_task_sums_equal_the_aggregation_job_and_delta_s_observation(
    spark: SparkSession, tmp_path: Any
) -> None:
    df = _df(spark)
    job = SparkBatch(df).fingerprint()
    assert job.rows == 500 and job.digest != 0
    assert _task_sum(SparkBatch(df)) == job
    # Other partitioning, other order: the same rows, the same fingerprint.
    assert _task_sum(SparkBatch(_df(spark, 5).orderBy(F.desc("id")))) == job
    assert _task_sum(SparkBatch(df).slotted(3)) == job
    # Delta's MERGE observes the same aggregation inside its job.
    observed = observe(df, "fp_test")
    observed.df.write.format("delta").save(str(tmp_path / "t"))
    assert observed.result() == job


def test_one_changed_value_or_one_duplicate_changes_it(spark: SparkSession) -> None:
    df = _df(spark)
    job = SparkBatch(df).fingerprint()
    changed = df.withColumn("amount", F.when(F.col("id") == 17, F.lit(-1.0))
                            .otherwise(F.col("amount")))
    assert SparkBatch(changed).fingerprint() != job
    assert _task_sum(SparkBatch(changed)) != job
    duplicated = df.unionByName(df.where("id = 3"))
    assert SparkBatch(duplicated).fingerprint().rows == 501
    assert SparkBatch(duplicated).fingerprint() != job


def test_the_row_hash_column_name_is_reserved(spark: SparkSession) -> None:
    df = spark.range(3).withColumnRenamed("id", ROW_HASH_COLUMN)
    with pytest.raises(BadInputError, match="reserved"):
        SparkBatch(df).fingerprint()


def test_two_columns_of_one_name_are_refused_with_the_fix(spark: SparkSession) -> None:
    df = spark.range(3).select("id", F.col("id").alias("ID"))
    with pytest.raises(BadInputError, match=r"several columns named ID, id.*own name"):
        SparkBatch(df).fingerprint()


# ---- tasks that hash their rows themselves (flat schemas, e.g. PostgresSink) ----

FLAT_SCHEMA = (
    "id long, small int, flag boolean, name string, amount double, ts timestamp, "
    "day date, price decimal(12,2), big decimal(30,4), raw binary, nothing void"
)


def _flat_df(spark: SparkSession, partitions: int = 2) -> DataFrame:
    base = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    rows = [
        (i, i % 100 if i % 5 else None, bool(i % 2), f"name-{i}" * (i % 4) if i % 7 else None,
         i * 0.5, base + dt.timedelta(seconds=i), (base + dt.timedelta(days=i)).date(),
         decimal.Decimal(i) / 4, decimal.Decimal(i * 10**9) / 3 if i % 3 else None,
         bytes([i % 256]) * (i % 5), None)
        for i in range(500)
    ]
    return spark.createDataFrame(rows, FLAT_SCHEMA).repartition(partitions)


def test_tasks_that_hash_rows_agree_with_the_replay_job_whatever_the_partitioning(
    spark: SparkSession,
) -> None:
    df = _flat_df(spark)
    batch = SparkBatch(df, hash_in_tasks=True)
    assert batch.hashes_in_tasks
    job = batch.fingerprint()
    assert job.rows == 500 and job.digest != 0
    assert _task_sum(batch) == job
    assert _task_sum(SparkBatch(_flat_df(spark, 5).orderBy(F.desc("id")),
                                hash_in_tasks=True)) == job
    assert _task_sum(batch.slotted(3)) == job
    # One changed value, or one duplicated row, changes both sides alike.
    changed = df.withColumn("name", F.when(F.col("id") == 17, F.lit("x"))
                            .otherwise(F.col("name")))
    changed_fp = SparkBatch(changed, hash_in_tasks=True).fingerprint()
    assert changed_fp != job
    assert _task_sum(SparkBatch(changed, hash_in_tasks=True)) == changed_fp
    duplicated = SparkBatch(df.unionByName(df.where("id = 3")), hash_in_tasks=True)
    assert duplicated.fingerprint().rows == 501
    assert _task_sum(duplicated) == duplicated.fingerprint() != job


def test_nested_types_keep_the_jvm_row_hashes_even_when_tasks_would_hash(
    spark: SparkSession,
) -> None:
    df = _df(spark)  # arrays, structs and maps
    batch = SparkBatch(df, hash_in_tasks=True)
    assert not batch.hashes_in_tasks
    assert batch.fingerprint() == SparkBatch(df).fingerprint()
    assert _task_sum(batch) == batch.fingerprint()


def test_tasks_hash_arrays_of_atomic_types_and_agree_with_the_replay_job(
    spark: SparkSession,
) -> None:
    """Arrays of atomic types (PostgresSink's array columns) are hashed by the tasks with
    numpy; the replay job hashes them the same way, whatever the partitioning."""
    df = _flat_df(spark).select(
        "id", "name", F.array(F.col("small"), F.lit(None).cast("int"), F.col("id").cast("int"))
        .alias("nums"), F.when(F.col("id") % 3 == 0, F.array()).otherwise(
            F.array(F.col("name"), F.lit("x"))).cast("array<string>").alias("tags"))
    batch = SparkBatch(df, hash_in_tasks=True)
    assert batch.hashes_in_tasks
    job = batch.fingerprint()
    assert job.rows == 500 and _task_sum(batch) == job
    assert _task_sum(SparkBatch(df.repartition(5).orderBy(F.desc("id")),
                                hash_in_tasks=True)) == job
    moved = df.withColumn("nums", F.when(F.col("id") == 117, F.reverse("nums"))
                          .otherwise(F.col("nums")))
    assert SparkBatch(moved, hash_in_tasks=True).fingerprint() != job


def test_tasks_that_hash_refuse_reserved_and_ambiguous_column_names(
    spark: SparkSession,
) -> None:
    reserved = SparkBatch(spark.range(3).withColumnRenamed("id", ROW_HASH_COLUMN),
                          hash_in_tasks=True)
    with pytest.raises(BadInputError, match="reserved"):
        reserved.fingerprint()
    with pytest.raises(BadInputError, match="reserved"):
        _task_sum(reserved)
    twice = SparkBatch(spark.range(3).select("id", F.col("id").alias("ID")), hash_in_tasks=True)
    with pytest.raises(BadInputError, match="several columns named"):
        _task_sum(twice)


def test_tasks_freeze_their_worker_s_garbage_collector_once(spark: SparkSession) -> None:
    # PySpark runs gc.collect() after every task of a reused worker; frozen, it no longer
    # scans every module the worker imported (10-15 ms of CPU a task).
    def task(info: TaskInfo, batches: Iterator[pa.RecordBatch]) -> TaskOutcome:
        for _ in batches:
            pass
        frozen = str(gc.get_freeze_count())
        return TaskOutcome(commit=TaskCommit(frozen, info.partition, info.task_attempt_id,
                                             Fingerprint()))

    outcomes = SparkBatch(spark.range(10).repartition(2)).run_tasks(task)
    assert len(outcomes) == 2
    assert all(o.commit is not None and int(o.commit.transaction_id) > 0 for o in outcomes)
