"""IcebergSink's kept table schema (connectors.iceberg._table.TableSchema): read once per
driver run, and read again before any refusal, so that a refusal never rests on a stale
schema and a table that refused a write is read afresh."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from connectors.core.errors import BadInputError
from connectors.iceberg._table import TableSchema, check_columns

V1 = StructType([StructField("id", LongType(), False), StructField("name", StringType())])
V2 = StructType([*V1.fields, StructField("amount", LongType())])  # another writer added it


class Catalog:
    """A session whose table(...).schema is the catalog's current schema, reads counted."""

    def __init__(self, schema: StructType) -> None:
        self.schema = schema
        self.reads = 0

    def table(self, name: str) -> Any:
        assert name == "lake.db.t"
        self.reads += 1
        return type("Frame", (), {"schema": self.schema})()


def fits(batch: StructType) -> Any:
    def check(schema: StructType) -> None:
        check_columns(batch, schema, "lake.db.t", sink_id="s")
    return check


def test_the_schema_is_read_once_for_a_run_of_fitting_batches() -> None:
    session = Catalog(V1)
    kept = TableSchema(session, "lake.db.t")  # type: ignore[arg-type]
    for _ in range(5):
        assert kept.check(fits(V1)) == V1
    assert session.reads == 1


def test_a_batch_the_kept_schema_refuses_is_checked_against_a_fresh_read() -> None:
    session = Catalog(V1)
    kept = TableSchema(session, "lake.db.t")  # type: ignore[arg-type]
    kept.check(fits(V1))
    session.schema = V2  # ALTER TABLE ... ADD COLUMN amount, by another writer
    assert kept.check(fits(V2)) == V2  # passes on the fresh read, not refused
    assert session.reads == 2
    assert kept.check(fits(V2)) == V2 and session.reads == 2  # and kept from then on


def test_a_refusal_stands_only_on_a_fresh_read() -> None:
    session = Catalog(V1)
    kept = TableSchema(session, "lake.db.t")  # type: ignore[arg-type]
    kept.check(fits(V1))
    with pytest.raises(BadInputError, match="amount"):
        kept.check(fits(V2))
    assert session.reads == 2  # read again before refusing
    with pytest.raises(BadInputError, match="amount"):  # a first read refuses at once
        TableSchema(Catalog(V1), "lake.db.t").check(fits(V2))  # type: ignore[arg-type]


def test_forget_makes_the_next_batch_read_the_schema_again() -> None:
    session = Catalog(V1)
    kept = TableSchema(session, "lake.db.t")  # type: ignore[arg-type]
    kept.check(fits(V1))
    kept.forget()  # the table refused a write
    kept.check(fits(V1))
    assert session.reads == 2
    assert kept.read() == V1 and session.reads == 3  # a fan-out's check reads it fresh
