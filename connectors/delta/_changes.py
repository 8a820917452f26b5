"""What only a DeltaSink's MERGE has: the user's ``merge`` function and Delta's builder.

The condition form (``merge_on``, ``sequence_column``, ``delete_when``, ``update_when``,
``insert_when``, ``exclude_columns``) is format-agnostic and lives in
:mod:`connectors.lake.changes` (IcebergSink runs it too). Here:

- :func:`apply_clauses`: the condition form's clauses on a ``DeltaMergeBuilder`` (classic
  PySpark; under Spark Connect the sink runs the same MERGE as SQL);
- :func:`user_merge`: the user's ``merge(target, source)``, which returns a
  ``DeltaMergeBuilder`` that the sink (never the function) executes;
- :func:`validate_changes`: the condition form's checks before the intent, and the refusal
  of a ``merge`` function under Spark Connect.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from connectors.core.errors import ConfigurationError
from connectors.lake.changes import ChangeSpec, Clause
from connectors.spark.toolkit import is_connect, quoted

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

__all__ = ["CONNECT_MERGE_FUNCTION", "MergeFunction", "apply_clauses", "user_merge",
           "validate_changes"]

#: ``merge=``: ``(target DeltaTable, source DataFrame) -> DeltaMergeBuilder``.
MergeFunction = Callable[[Any, "DataFrame"], Any]

CONNECT_MERGE_FUNCTION = (
    "merge= (a function building a DeltaMergeBuilder) needs classic PySpark: Delta's "
    "DeltaTable API over Spark Connect needs the delta-connect-server plugin, which Delta "
    "4.4 does not publish for Spark 4.2. Under Spark Connect use the condition form "
    "(merge_on with sequence_column, delete_when, update_when, insert_when, "
    "exclude_columns), which the sink runs as SQL MERGE")


def validate_changes(spec: ChangeSpec, df: DataFrame, table: StructType | None, *,
                     sink_id: str) -> None:
    """Driver, before a fresh write (before the intent): a ``merge`` function is not asked
    for under Spark Connect, and the condition form's checks
    (:meth:`~connectors.lake.changes.ChangeSpec.validate`) pass."""
    if spec.merge is not None and is_connect(df.sparkSession):
        raise ConfigurationError(CONNECT_MERGE_FUNCTION, sink_id=sink_id)
    spec.validate(df, table, sink_id=sink_id)


def apply_clauses(builder: Any, parts: Sequence[Clause]) -> Any:
    """``parts`` on a ``DeltaMergeBuilder`` (classic PySpark)."""
    for c in parts:
        if c.kind == "delete":
            builder = builder.whenMatchedDelete(condition=c.condition)
        elif c.kind == "update":
            builder = (builder.whenMatchedUpdateAll(condition=c.condition) if c.columns is None
                       else builder.whenMatchedUpdate(condition=c.condition, set={
                           quoted(n): f"s.{quoted(n)}" for n in c.columns}))
        else:
            builder = (builder.whenNotMatchedInsertAll(condition=c.condition)
                       if c.columns is None else builder.whenNotMatchedInsert(
                           condition=c.condition,
                           values={quoted(n): f"s.{quoted(n)}" for n in c.columns}))
    return builder


def user_merge(spec: ChangeSpec, target: Any, source: DataFrame, *, sink_id: str) -> Any:
    """Call the user's ``merge(target, source)``; return its ``DeltaMergeBuilder`` (not
    executed: the sink executes it inside its commit confs), or raise
    :class:`ConfigurationError` saying what it returned instead."""
    from delta.tables import DeltaMergeBuilder
    from pyspark.sql import DataFrame

    assert spec.merge is not None
    got = spec.merge(target, source)
    if isinstance(got, DeltaMergeBuilder):
        return got
    hint = (" (did it call .execute()? Return the builder instead: the MERGE the function "
            "executed ran inside the sink's commit confs and carries the batch's tag, so "
            "the restarted query finds that batch committed and does not apply it again)"
            if got is None or isinstance(got, DataFrame) else "")  # execute() gives either
    raise ConfigurationError(
        "merge= must return the delta.tables.DeltaMergeBuilder of target.merge(source, ...)"
        f".when...() without calling .execute(): the sink executes it inside its idempotent "
        f"commit; it returned {type(got).__name__}{hint}",
        sink_id=sink_id,
    )
