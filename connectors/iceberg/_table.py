"""Where an IcebergSink's table is, its schema, and the checks before a write (driver side).

The table is a catalog table (``<catalog>.<namespace>.<name>``) of an Iceberg catalog the
session configures (``spark.sql.catalog.<catalog>``: Hadoop, JDBC, REST, Hive, Glue, ...).
Its location comes from the catalog (``DESCRIBE TABLE EXTENDED``), once per driver run; the
sink's ledger is kept beside it (:mod:`connectors.lake`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from connectors.core.errors import BadInputError, ConfigurationError
from connectors.lake.store import local_path

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["TableSchema", "check_columns", "check_required_values", "check_spark",
           "resolve_table", "table_schema"]

logger = logging.getLogger(__name__)


def check_spark(sink_id: str) -> None:
    """The running pyspark has an Iceberg runtime (the resolver's table): else a
    :class:`ConfigurationError` naming the Spark versions that have one."""
    import pyspark

    from connectors.spark.toolkit import iceberg_runtime

    try:
        iceberg_runtime(pyspark.__version__)
    except ConfigurationError as exc:
        raise ConfigurationError(str(exc.args[0]) if exc.args else str(exc),
                                 sink_id=sink_id) from None


def resolve_table(df: DataFrame, table: str, *, create_table: bool,
                  partition_by: tuple[str, ...], sink_id: str) -> str:
    """The location of Iceberg table ``table`` (local ones as resolved paths), created
    empty with ``df``'s schema when missing and ``create_table`` allows it."""
    session = df.sparkSession
    if not session.catalog.tableExists(table):
        if not create_table:
            raise BadInputError(
                f"the Iceberg table {table} does not exist: create it (CREATE TABLE ... USING "
                "iceberg), or pass create_table=True", sink_id=sink_id)
        writer = session.createDataFrame([], df.schema).writeTo(table).using("iceberg")
        if partition_by:
            from pyspark.sql import functions as F  # noqa: N812

            writer = writer.partitionedBy(*[F.col(c) for c in partition_by])
        try:
            writer.create()
            logger.info("sink %s: created the Iceberg table %s", sink_id, table)
        except Exception:
            if not session.catalog.tableExists(table):  # not created meanwhile
                raise
    return _location(session, table, sink_id)


def _location(session: SparkSession, table: str, sink_id: str) -> str:
    rows = {str(r[0]).strip(): str(r[1]) for r in
            session.sql(f"DESCRIBE TABLE EXTENDED {table}").collect()}
    if rows.get("Provider", "").lower() != "iceberg":
        raise BadInputError(
            f"table {table} is not an Iceberg table (provider {rows.get('Provider')!r}): "
            "IcebergSink writes tables of an Iceberg catalog (spark.sql.catalog.<name> = "
            "org.apache.iceberg.spark.SparkCatalog)", sink_id=sink_id)
    location = rows.get("Location", "")
    if not location:
        raise ConfigurationError(f"the catalog gives no location for {table}",
                                 sink_id=sink_id)
    local = local_path(location)
    return str(local) if local is not None else location


def table_schema(session: SparkSession, table: str) -> StructType:
    """The table's current schema (no Spark job)."""
    return session.table(table).schema


class TableSchema:
    """The table's schema as this driver run last read it: the pre-checks of a batch
    against it cost no catalog read in the steady state (~3 ms a batch: a Spark analysis
    of the catalog table and a py4j round trip).

    A refusal never rests on it: a batch the kept schema refuses is checked again against
    a fresh read, and only that refusal stands. A schema another writer changed since
    (columns dropped or renamed) can let a batch through the pre-check that Iceberg's
    writer then refuses while committing: nothing is committed either way, and the writer
    turns the refusal into a :class:`BadInputError` (:func:`~connectors.iceberg._writer.
    translate`), after which :meth:`forget` makes the next batch read it again."""

    def __init__(self, session: SparkSession, table: str) -> None:
        self.session = session
        self.table = table
        self._schema: StructType | None = None

    def read(self) -> StructType:
        """A fresh read of the table's schema, kept for the next batches."""
        self._schema = table_schema(self.session, self.table)
        return self._schema

    def kept(self) -> StructType:
        """The schema last read (read now if none is kept)."""
        return self._schema if self._schema is not None else self.read()

    def forget(self) -> None:
        """The next batch reads the schema again (after the table refused a write)."""
        self._schema = None

    def check(self, check: Callable[[StructType], None]) -> StructType:
        """Run ``check`` against the kept schema; when it refuses (``BadInputError``) and
        the schema was not read just now, against a fresh read, whose refusal stands."""
        fresh = self._schema is None
        schema = self.kept()
        try:
            check(schema)
        except BadInputError:
            if fresh:
                raise
            schema = self.read()
            check(schema)
        return schema


def check_columns(batch: StructType, table: StructType, name: str, *,
                  merge_on: tuple[str, ...] = (), sink_id: str) -> None:
    """Before the intent: every batch column is one of the table's (by name, as Iceberg's
    writer matches them), every required column of the table is in the batch, and so is
    every ``merge_on`` key."""
    have = {f.name.lower() for f in table.fields}
    extra = [f.name for f in batch.fields if f.name.lower() not in have]
    if extra:
        raise BadInputError(
            f"the batch has column(s) {', '.join(extra)} that the Iceberg table {name} does "
            f"not (its columns: {', '.join(table.fieldNames())}): nothing was committed. "
            f"Drop them in the query, or add them to the table (ALTER TABLE {name} ADD "
            "COLUMN ...)", sink_id=sink_id)
    given = {f.name.lower() for f in batch.fields}
    missing = [f.name for f in table.fields if not f.nullable and f.name.lower() not in given]
    if missing:
        raise BadInputError(
            f"the Iceberg table {name} requires column(s) {', '.join(missing)} (NOT NULL) and "
            "the batch lacks them: nothing was committed. Select them in the query",
            sink_id=sink_id)
    absent = [k for k in merge_on if k.lower() not in given]
    if absent:
        raise BadInputError(
            f"merge_on column(s) {', '.join(absent)} are not in the batch (its columns: "
            f"{', '.join(batch.fieldNames())}): nothing was committed. Select them in the "
            "query, or change merge_on", sink_id=sink_id)


def check_required_values(df: DataFrame, table: StructType, name: str, *, sink_id: str,
                          batch_id: int) -> None:
    """A fan-out, before its decision: no row ``df`` writes holds a NULL in a column the
    table requires (Iceberg's writer refuses it only while committing, after the other
    targets committed). One Spark job, none when the batch can leave no required column
    NULL; :class:`BadInputError` naming the column and the count, never a row."""
    required = {f.name.lower() for f in table.fields if not f.nullable}
    columns = [f.name for f in df.schema.fields if f.nullable and f.name.lower() in required]
    if not columns:
        return
    from pyspark.sql import functions as F  # noqa: N812

    from connectors.spark.toolkit import quoted

    row = df.agg(*[F.sum(F.when(F.col(quoted(c)).isNull(), 1).otherwise(0)).alias(f"c{i}")
                   for i, c in enumerate(columns)]).first()
    broken = [(c, int(row[i] or 0)) for i, c in enumerate(columns)
              if row is not None and (row[i] or 0) > 0]
    if broken:
        column, rows = broken[0]
        raise BadInputError(
            f"{rows} row(s) of the batch hold NULL in column {column!r}, which the Iceberg "
            f"table {name} requires (NOT NULL): Iceberg's writer would refuse them after the "
            f"fan-out's other targets committed, so nothing was decided. Filter or fill "
            f"those rows in the query (e.g. .where('{column} IS NOT NULL')), or make the "
            f"column optional (ALTER TABLE {name} ALTER COLUMN {column} DROP NOT NULL)",
            sink_id=sink_id, batch_id=batch_id)
