"""Which rows tasks hash themselves: flat schemas only, and only for sinks that ask."""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from connectors import KafkaSink, PostgresSink
from connectors.core.spark_batch import flat_schema


def _schema(*types: object) -> StructType:
    return StructType([StructField(f"c{i}", t) for i, t in enumerate(types)])  # type: ignore[arg-type]


def test_atomic_columns_make_a_flat_schema() -> None:
    assert flat_schema(_schema(
        LongType(), IntegerType(), BooleanType(), StringType(), BinaryType(), DoubleType(),
        DateType(), TimestampType(), TimestampNTZType(), DecimalType(30, 4), NullType(),
    ))
    assert flat_schema(_schema())


def test_any_nested_column_keeps_the_jvm_row_hashes() -> None:
    assert not flat_schema(_schema(LongType(), ArrayType(StringType())))
    assert not flat_schema(_schema(StructType([StructField("x", IntegerType())])))
    assert not flat_schema(_schema(MapType(StringType(), IntegerType())))


def test_postgres_tasks_hash_their_rows_and_kafka_tasks_sum_the_jvm_s() -> None:
    assert PostgresSink.hash_rows_in_tasks is True
    assert KafkaSink.hash_rows_in_tasks is False
