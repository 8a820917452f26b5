"""The JVM-computed fingerprint on real Spark: what the tasks sum from the row-hash column
equals :meth:`SparkBatch.fingerprint` (one aggregation job) and Delta's observed
fingerprint, whatever the partitioning and order, and one changed value changes it.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from connectors.core.batch import TaskInfo, TaskOutcome
from connectors.core.errors import BadInputError
from connectors.core.fingerprint import ROW_HASH_COLUMN, Fingerprint, split_row_hash
from connectors.core.ledger import TaskCommit
from connectors.core.spark_batch import SparkBatch
from connectors.delta._fingerprint import observe

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
