"""The JVM check job of ``KafkaSink(barrier=False)`` agrees with the slots' Python checks.

A batch the driver's check passes must pass every slot's check (else a slot could fail
after another committed), and a record the slots would refuse must stop the batch before
any slot runs. Real Spark; no broker needed.
"""

from __future__ import annotations

from typing import Any

import pyarrow.compute as pc
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from connectors.core.errors import BadInputError
from connectors.kafka._records import RecordLimits, record_sizes, scan_batch
from connectors.kafka._scan import (
    DataFrameScan,
    bad_input_message,
    check_condition,
    row_bytes,
    scan_dataframe,
)
from connectors.spark._handover import ROW_BOUND_MARK
from connectors.spark._rows import with_row_hash

HEADER = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
SCHEMA = StructType([
    StructField("key", StringType()),
    StructField("value", BinaryType()),
    StructField("headers", ArrayType(HEADER)),
    StructField("partition", IntegerType()),
    StructField("topic", StringType()),
])
ROWS: list[tuple[Any, ...]] = [
    ("k", b"v" * 10, None, None, "a"),
    (None, b"x" * 300, [], 1, "a"),
    ("\u00e9t\u00e9-\u4e2d", None, [("h", b"12345"), ("\u00fc", None), None], 2, "b"),
    ("key-4", b"", [("only", b"")], None, "b"),
    ("big", b"y" * 120, [("h1", b"z" * 40), ("h2", b"w" * 41)], 0, "c"),
]


def _error(message: str) -> BadInputError:
    return BadInputError(message)


def _df(spark: SparkSession, rows: list[tuple[Any, ...]] = ROWS) -> DataFrame:
    return spark.createDataFrame(rows, SCHEMA).repartition(2)


def checked_dataframe(
    df: DataFrame, limits: RecordLimits, topic: str, partitions: int | None
) -> DataFrame:
    return df.where(check_condition(df.columns, limits, topic, partitions))


def _python_max(df: DataFrame) -> int:
    """The largest record as the slots compute it (Arrow, as mapInArrow hands it over)."""
    batch = df.toArrow().combine_chunks().to_batches()[0]
    return int(pc.max(record_sizes(batch)).as_py())


@pytest.mark.parametrize("fixed", [None, "out"])
def test_sizes_limits_and_topics_agree_with_the_slot_checks(
    spark: SparkSession, fixed: str | None
) -> None:
    df = _df(spark)
    largest = _python_max(df)
    # Exactly at the limit: both pass; one byte below: both refuse.
    found = scan_dataframe(df, RecordLimits(largest), fixed, _error).topics
    table = df.toArrow()
    for batch in table.to_batches():
        scan_batch(batch, RecordLimits(largest), fixed, _error)
    if fixed is None:
        assert found == {"a": 1, "b": 2, "c": 0}
    else:
        assert found == {"out": 2}
    with pytest.raises(BadInputError, match=f"about {largest} bytes, larger than the "
                                            f"{largest - 1} bytes"):
        scan_dataframe(df, RecordLimits(largest - 1), fixed, _error)
    with pytest.raises(BadInputError, match="larger than"):
        scan_batch(table.combine_chunks().to_batches()[0], RecordLimits(largest - 1), fixed,
                   _error)


def test_negative_partition_and_null_topic_are_refused(spark: SparkSession) -> None:
    negative = [*ROWS, ("n", b"v", None, -3, "a")]
    with pytest.raises(BadInputError, match="holds -3: partitions are >= 0"):
        scan_dataframe(_df(spark, negative), RecordLimits(10_000), None, _error)
    no_topic = [*ROWS, ("n", b"v", None, None, None)]
    with pytest.raises(BadInputError, match="'topic' column holds null"):
        scan_dataframe(_df(spark, no_topic), RecordLimits(10_000), None, _error)
    # A given topic wins over the column: a null there does not matter.
    assert scan_dataframe(_df(spark, no_topic), RecordLimits(10_000), "t", _error).topics == {
        "t": 2}


def test_value_and_key_only_and_an_empty_batch(spark: SparkSession) -> None:
    df = _df(spark).select("key", "value")
    assert scan_dataframe(df, RecordLimits(10_000), "t", _error).topics == {"t": -1}
    largest = _python_max(df)
    with pytest.raises(BadInputError):
        scan_dataframe(df, RecordLimits(largest - 1), "t", _error)
    assert scan_dataframe(df.limit(0), RecordLimits(1), "t", _error) == DataFrameScan({}, 0)


def test_the_filter_in_the_map_stage_raises_a_clear_message(spark: SparkSession) -> None:
    """``check_condition``: bad records fail the job that computes the batch (before the
    slotting shuffle's reduce side, where the slots write); good ones all pass through."""
    df = _df(spark).select("key", "value", "headers", "partition")
    largest = _python_max(df)
    def rows(d: DataFrame) -> list[str]:
        return sorted(repr(r) for r in d.collect())

    assert rows(checked_dataframe(df, RecordLimits(largest), "t", 3)) == rows(df)
    with pytest.raises(Exception) as info:
        checked_dataframe(df, RecordLimits(largest - 1), "t", 3).repartition(2).collect()
    assert bad_input_message(info.value) == (
        f"a record is about {largest} bytes, larger than the {largest - 1} bytes the "
        "producer/topic accept (message.max.bytes in the config, max.message.bytes of the "
        "topic): raise those limits or write smaller values")
    with pytest.raises(Exception) as info:
        checked_dataframe(df, RecordLimits(largest), "t", 2).collect()
    assert bad_input_message(info.value) == (
        "the 'partition' column holds 2, but topic 't' has 2 partitions")
    negative = _df(spark, [*ROWS, ("n", b"v", None, -1, "a")]).drop("topic")
    with pytest.raises(Exception) as info:
        checked_dataframe(negative, RecordLimits(largest), "t", None).collect()
    assert bad_input_message(info.value) == "the 'partition' column holds -1: partitions are >= 0"
    assert bad_input_message(RuntimeError("something else")) is None


def _sizes_and_bounds(df: DataFrame) -> list[tuple[int, int]]:
    """Every row's bytes in the Arrow batches the slot tasks receive (row hash included,
    each row taken into an Arrow table of its own), and its ``row_bytes``."""
    table = with_row_hash(df).withColumn("_bound", row_bytes(df.columns)).toArrow()
    rows = table.drop_columns(["_bound"])
    bounds = table.column("_bound").to_pylist()
    return [(rows.take([i]).nbytes, bounds[i]) for i in range(table.num_rows)]


@pytest.mark.parametrize("columns", [
    ["key", "value", "headers", "partition", "topic"],
    ["key", "value", "headers", "partition"],
    ["value"],
])
def test_row_bytes_bound_every_row_of_the_task_batches(
    spark: SparkSession, columns: list[str]
) -> None:
    """``row_bytes`` sizes the rows per Arrow batch once Spark's own size check is off: it
    must not be below what a row takes there. Many small headers: 12 bytes each."""
    many = [("m", b"v", [("", b"")] * 200 + [None] * 50, 1, "a-topic-name")]
    df = _df(spark, [*ROWS, *many]).select(*columns)
    found = _sizes_and_bounds(df)
    assert len(found) == len(ROWS) + 1
    for size, bound in found:
        assert size <= bound, (size, bound)
    if "topic" in columns:
        scan = scan_dataframe(df, RecordLimits(100_000), None, _error)
        assert scan.max_row_bytes == max(bound for _, bound in found)


def test_the_row_bound_guard_raises_its_own_mark_after_the_record_checks(
    spark: SparkSession
) -> None:
    df = _df(spark).select("key", "value", "headers", "partition")
    bounds = sorted(int(r[0]) for r in df.select(row_bytes(df.columns)).collect())
    largest = _python_max(df)

    def guarded(bound: int, limit: int = largest, rows: DataFrame = df) -> DataFrame:
        return rows.where(check_condition(df.columns, RecordLimits(limit), "t", 3, bound))

    assert guarded(bounds[-1]).count() == len(ROWS)  # exactly at the bound: passes
    with pytest.raises(Exception) as info:
        guarded(bounds[-1] - 1).repartition(2).collect()
    assert ROW_BOUND_MARK in str(info.value)
    assert bad_input_message(info.value) is None  # not bad input: the sink runs it again
    # A record the topic refuses is bad input, over the bound as well.
    with pytest.raises(Exception) as info:
        guarded(1, largest - 1, df.where(F.octet_length("value") == 300)).collect()
    assert bad_input_message(info.value) is not None
