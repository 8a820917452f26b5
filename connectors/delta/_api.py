"""Delta's table API as the sink uses it, on both Spark front ends.

Classic PySpark: the public ``delta.tables.DeltaTable`` API. Spark Connect: Delta's SQL
(``DESCRIBE DETAIL``/``DESCRIBE HISTORY``/``MERGE INTO delta.`path```), because
``DeltaTable`` over Connect needs Delta Connect's server plugins and their
``delta-connect-server`` jar, which Maven Central does not publish for Delta 4.4 on Spark
4.2 (checked 2026-11-25), while the SQL needs only the Delta extension that any server
writing Delta has. Both read the same Delta log and commit the same way; the SQL is the
documented surface of the same commands.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

from connectors.core.errors import DependencyError
from connectors.spark.toolkit import delta_python_from_jars, is_connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from connectors.lake.changes import ChangeSpec

__all__ = ["delta_tables", "history", "is_delta_table", "merge", "properties", "table_schema"]

#: Delta's error classes for "no Delta table at that path" (any other error propagates:
#: taking a failed read for "no table" could write a batch twice).
_NOT_A_TABLE = ("DELTA_MISSING_DELTA_TABLE", "DELTA_TABLE_ONLY_OPERATION",
                "DELTA_TABLE_NOT_FOUND", "PATH_NOT_FOUND")


def _path_table(location: str) -> str:
    """``delta.`location``` with the path's backticks escaped."""
    return "delta.`" + location.replace("`", "``") + "`"


def _not_a_table(exc: Exception) -> bool:
    condition = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
    found = str(condition() or "") if callable(condition) else ""
    return found in _NOT_A_TABLE or any(c in str(exc).split("\n", 1)[0] for c in _NOT_A_TABLE)


def delta_tables(session: SparkSession) -> ModuleType:
    """``delta.tables`` for a classic session: from an installed delta-spark or the
    platform's own, else from Delta's jar among the session's ``spark.jars`` (Delta ships
    its Python API in the jar; the ``delta`` extra installs no delta-spark, whose pyspark
    requirement would override the user's); else a :class:`DependencyError` saying how to
    get it."""
    try:
        return importlib.import_module("delta.tables")
    except ImportError:
        pass
    listed = session.sparkContext.getConf().get("spark.jars") or ""
    jars = [j.removeprefix("file:") for j in listed.split(",") if j.strip()]
    if delta_python_from_jars(jars) is not None:
        return importlib.import_module("delta.tables")
    raise DependencyError(
        "DeltaSink needs Delta Lake's Python API (the module 'delta'), and none is importable "
        "here nor in a Delta jar of this session's spark.jars. Start the session with "
        "connectors.spark.get_session(components=['delta', ...]) or "
        "connectors.spark.configure(builder, ['delta']); or spark-submit with the --packages "
        "that `connectors submit-args --components delta` prints; or pip install the "
        "delta-spark release built for your Spark."
    )


def is_delta_table(session: SparkSession, location: str) -> bool:
    """Whether a Delta table exists at ``location``."""
    if not is_connect(session):
        tables = delta_tables(session)
        return bool(tables.DeltaTable.isDeltaTable(session, location))
    try:
        session.sql(f"DESCRIBE DETAIL {_path_table(location)}").select("format").first()
    except Exception as exc:
        if _not_a_table(exc):
            return False
        raise
    return True


def history(session: SparkSession, location: str, limit: int | None) -> DataFrame:
    """The table's newest ``limit`` commits (all with ``None``), newest first."""
    if not is_connect(session):
        tables = delta_tables(session)
        table = tables.DeltaTable.forPath(session, location)
        found: DataFrame = table.history(limit) if limit is not None else table.history()
        return found
    sql = f"DESCRIBE HISTORY {_path_table(location)}"
    return session.sql(sql if limit is None else f"{sql} LIMIT {int(limit)}")


def properties(session: SparkSession, location: str) -> dict[str, str]:
    """The table's properties (``DESCRIBE DETAIL``)."""
    if not is_connect(session):
        tables = delta_tables(session)
        row = tables.DeltaTable.forPath(session, location).detail().select("properties").first()
    else:
        row = session.sql(f"DESCRIBE DETAIL {_path_table(location)}").select(
            "properties").first()
    return dict(row["properties"] or {}) if row is not None else {}


def table_schema(session: SparkSession, location: str) -> StructType:
    """The table's schema as of its latest commit."""
    if not is_connect(session):
        tables = delta_tables(session)
        schema: StructType = tables.DeltaTable.forPath(session, location).toDF().schema
        return schema
    return session.read.format("delta").load(location).schema


#: Temporary views of MERGE sources under Connect, one per call (a name per process and
#: call: two sinks of one session never share one).
_views = iter(range(1 << 62))


def merge(session: SparkSession, location: str, source: DataFrame, spec: ChangeSpec, *,
          schema_evolution: bool) -> None:
    """``MERGE`` ``source`` into the table on ``spec.merge_on`` (null-safe equality) with
    the condition form's clauses (:func:`~connectors.lake.changes.clauses`: without
    conditions, update every column of a matched row and insert the others). The commit's
    session settings (its tag, the txn id) are the caller's."""
    from connectors.delta._changes import apply_clauses
    from connectors.lake.changes import clauses, merge_sql, on_keys

    condition = on_keys(spec.merge_on)
    parts = clauses(spec, source.columns)
    if not is_connect(session):
        tables = delta_tables(session)
        builder = apply_clauses(tables.DeltaTable.forPath(session, location).alias("t")
                                .merge(source.alias("s"), condition), parts)
        if schema_evolution:
            builder = builder.withSchemaEvolution()
        builder.execute()
        return
    import os

    view = f"connectors_merge_{os.getpid()}_{next(_views)}"
    source.createOrReplaceTempView(view)
    try:
        session.sql(merge_sql(_path_table(location), view, condition, parts,
                              schema_evolution=schema_evolution)).collect()
    finally:
        session.catalog.dropTempView(view)
