"""Where a DeltaSink's table is and what its schema is: local paths, a catalog table's
location (created from the batch on demand), the schema read from the table or taken from
Delta's cached snapshot after a commit."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from connectors.core.errors import BadInputError
from connectors.delta._errors import translate
from connectors.lake.store import local_path

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["local_path", "read_schema", "resolve_table", "snapshot_schema"]

logger = logging.getLogger(__name__)


def resolve_table(
    df: DataFrame,
    table: str,
    *,
    create_table: bool,
    partition_by: tuple[str, ...],
    sink_id: str,
) -> str:
    """The location of catalog table ``table`` (local ones as resolved paths), created
    empty with ``df``'s schema when missing and ``create_table`` allows it."""
    session = df.sparkSession
    if not session.catalog.tableExists(table):
        if not create_table:
            raise BadInputError(
                f"table {table} does not exist: create it (CREATE TABLE ... USING "
                "delta), or pass create_table=True",
                sink_id=sink_id,
            )
        writer = df.limit(0).write.format("delta")
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        try:
            writer.saveAsTable(table)
            logger.info("sink %s: created table %s", sink_id, table)
        except Exception:
            if not session.catalog.tableExists(table):  # not created meanwhile
                raise
    rows = session.sql(f"DESCRIBE DETAIL {table}").select("format", "location").collect()
    if not rows or str(rows[0][0]).lower() != "delta":
        raise BadInputError(
            f"table {table} is not a Delta table: DeltaSink writes Delta tables only",
            sink_id=sink_id,
        )
    location = str(rows[0][1])
    local = local_path(location)
    return str(local) if local is not None else location


def read_schema(
    session: SparkSession, location: Callable[[], str], *, create_table: bool, sink_id: str
) -> StructType | None:
    """The table's schema, read (one job); ``None`` when there is no table yet and
    ``create_table`` lets the first batch create it (otherwise :class:`BadInputError`)."""
    from pyspark.errors import AnalysisException

    try:
        return session.read.format("delta").load(location()).schema
    except AnalysisException as exc:
        err = translate(exc, doing="reading the table's schema", sink_id=sink_id)
        if not isinstance(err, BadInputError):
            raise
        if not create_table:
            raise BadInputError(
                f"there is no Delta table at {location()}: create it, or pass "
                "create_table=True to create it from the first batch",
                sink_id=sink_id,
            ) from None
        return None


def snapshot_schema(session: SparkSession, location: str) -> StructType | None:
    """The table's schema as of its latest commit, through the public ``DeltaTable`` API
    (after a commit of this driver Delta's cached snapshot is that commit's: no job), or
    ``None`` on any error: then the sink reads the table when it next needs the schema."""
    try:
        import connectors.delta._api as delta_api

        return delta_api.table_schema(session, location)
    except Exception as exc:
        logger.debug("DeltaSink: no snapshot schema (%s); the table is read instead",
                     type(exc).__name__)
        return None
