"""The values DeltaSink checks before a fan-out's decision (``connectors.delta._constraints``):
which NOT NULL columns and CHECK constraints become checks, and the SQL each runs."""

from __future__ import annotations

from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

from connectors.delta._constraints import value_checks

TABLE = StructType([StructField("id", LongType(), False), StructField("Name", StringType(), False),
                    StructField("amount", DoubleType(), True)])


def test_a_not_null_column_the_batch_may_leave_null_is_checked() -> None:
    batch = StructType([StructField("id", LongType(), False),
                        StructField("name", StringType(), True),  # case-insensitive match
                        StructField("amount", DoubleType(), True)])
    assert value_checks(batch, TABLE, {}) == [
        ("NOT NULL column 'name'", "`name` IS NULL")]


def test_nothing_to_check_without_nullable_required_columns_or_constraints() -> None:
    batch = StructType([StructField("id", LongType(), False),
                        StructField("Name", StringType(), False),
                        StructField("amount", DoubleType(), True)])
    assert value_checks(batch, TABLE, {"delta.appendOnly": "true"}) == []


def test_check_constraints_count_a_null_result_as_a_violation_as_delta_does() -> None:
    batch = StructType([StructField("amount", DoubleType(), True),
                        StructField("we`ird", StringType(), True)])
    table = StructType([*TABLE.fields, StructField("we`ird", StringType(), False)])
    props = {"delta.constraints.positive": "amount >= 0", "delta.constraints.b": "id > 0"}
    assert value_checks(batch, table, props) == [
        ("NOT NULL column 'we`ird'", "`we``ird` IS NULL"),
        ("CHECK constraint b (id > 0)", "NOT coalesce((id > 0), false)"),
        ("CHECK constraint positive (amount >= 0)", "NOT coalesce((amount >= 0), false)"),
    ]
