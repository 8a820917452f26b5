"""The slot job without adaptive query execution when the input needs no exchange.

With AQE on (Spark's default, in ``foreachBatch`` too), the slot job runs the sink's
shuffle's map stage as a job of its own and re-plans before the slots run; a 100-record
KafkaSink batch took 169 ms with it and 119 ms without. The sink's exchange has a fixed
partition count, so AQE changes nothing in it: an input that needs no exchange itself runs
its slot job with AQE off, for that job only. An input with a join, an aggregation, a sort
or a repartitioning keeps AQE.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf
from pyspark.sql.window import Window

from connectors.core.batch import TaskInfo, TaskOutcome
from connectors.spark._plan import ADAPTIVE, narrow_plan
from connectors.spark.frames import SparkBatch

pytestmark = [pytest.mark.integration]


def _frame(spark: SparkSession) -> DataFrame:
    return spark.range(0, 1000, 1, 3).select(
        sf.col("id").cast("string").alias("key"), sf.col("id").alias("n"))


def test_inputs_without_an_exchange_of_their_own_are_narrow(
    spark: SparkSession, tmp_path: Path
) -> None:
    df = _frame(spark)
    path = str(tmp_path / "p")
    df.write.parquet(path)
    view = f"v_{uuid.uuid4().hex[:8]}"
    spark.createDataFrame([(1, "a")], "id int, v string").createOrReplaceTempView(view)
    keep = sf.udf(lambda n: n % 2 == 0, "boolean")
    narrow = {
        "range, projection": df,
        "cached": df.cache(),
        "local rows (a foreachBatch batch is a LogicalRDD too)":
            spark.createDataFrame([(1, "a")], "id int, v string"),
        "parquet with a filter": spark.read.parquet(path).where("n > 5"),
        "temp view": spark.sql(f"SELECT * FROM {view}"),
        "python udf filter": df.where(keep("n")),
        "union": df.union(df),
    }
    for name, frame in narrow.items():
        assert narrow_plan(frame), name
    wide = {
        "join": df.join(df, "key"),
        "aggregation": df.groupBy("key").count(),
        "distinct": df.distinct(),
        "sort": df.orderBy("n"),
        "repartition": df.repartition(4),
        "limit": df.limit(10),
        "window": df.withColumn("r", sf.row_number().over(Window.orderBy("n"))),
    }
    for name, frame in wide.items():
        assert not narrow_plan(frame), name
    df.unpersist()


def _count_rows(_info: TaskInfo, batches: Iterator[pa.RecordBatch]) -> TaskOutcome:
    for _ in batches:
        pass
    return TaskOutcome()


def _slot_job_jobs(spark: SparkSession, batch: SparkBatch) -> int:
    """Runs the slot job; how many Spark jobs it took."""
    sc: Any = spark.sparkContext
    group = f"plan-{uuid.uuid4().hex[:8]}"
    sc.setJobGroup(group, "slot job")
    try:
        outcomes = batch.run_tasks(_count_rows)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert len(outcomes) == 2
    return len(sc.statusTracker().getJobIdsForGroup(group))


def test_the_slot_job_of_a_narrow_input_runs_without_aqe_and_the_setting_is_restored(
    spark: SparkSession,
) -> None:
    before = spark.conf.get(ADAPTIVE)
    assert before == "true"  # Spark's default, as in foreachBatch
    narrow = SparkBatch(_frame(spark)).slotted(2)
    assert narrow.static_plan
    # One job: the map stage and the slots, planned once. With AQE the map stage is a job
    # of its own.
    assert _slot_job_jobs(spark, narrow) == 1
    assert spark.conf.get(ADAPTIVE) == before

    wide = SparkBatch(_frame(spark).groupBy("key").agg(sf.sum("n").alias("n"))).slotted(2)
    assert not wide.static_plan
    assert _slot_job_jobs(spark, wide) >= 2  # AQE kept: the user's aggregation's stage too
    assert spark.conf.get(ADAPTIVE) == before


def test_the_session_s_own_setting_comes_back_after_a_failed_slot_job(
    spark: SparkSession,
) -> None:
    def fail(_info: TaskInfo, batches: Iterator[pa.RecordBatch]) -> TaskOutcome:
        raise RuntimeError("task failed")

    spark.conf.set(ADAPTIVE, "true")
    batch = SparkBatch(_frame(spark)).slotted(2)
    with pytest.raises(Exception, match="task failed"):
        batch.run_tasks(fail)
    assert spark.conf.get(ADAPTIVE) == "true"
