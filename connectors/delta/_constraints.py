"""What Delta's writer refuses only while it commits, checked earlier for a fan-out.

A DeltaSink on its own lets Delta's writer refuse a NULL in a NOT NULL column or a row
that fails a CHECK constraint: the commit fails and nothing is written. In a fan-out
(:class:`~connectors.core.templates.fanout.FanOut`) that commit comes after the decision, when the
targets before it have the batch, so :meth:`DeltaSink.check_input
<connectors.delta.DeltaSink.check_input>` runs these checks before the decision: one
Spark job, and only for a table with NOT NULL columns the batch may leave NULL or with
CHECK constraints (``delta.constraints.<name>`` table properties, read once per table
schema the sink reads). A row violates a CHECK constraint when its expression is false or
NULL, as in Delta's own check. Nested NOT NULL fields and column invariants
(``delta.invariants``) are left to Delta's writer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from connectors.core.errors import BadInputError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["ValueChecks", "value_checks"]

#: Delta's table properties that hold CHECK constraints, by name.
CONSTRAINT_PREFIX = "delta.constraints."


def value_checks(batch: StructType, table: StructType,
                 properties: dict[str, str]) -> list[tuple[str, str]]:
    """``(what a violating row breaks, a SQL expression true for such a row)`` for each
    NOT NULL column of ``table`` that ``batch`` may leave NULL, and each CHECK constraint
    in ``properties``."""
    required = {f.name.lower() for f in table.fields if not f.nullable}
    checks = [(f"NOT NULL column {f.name!r}", f"{_quoted(f.name)} IS NULL")
              for f in batch.fields if f.nullable and f.name.lower() in required]
    for key, expression in sorted(properties.items()):
        if key.lower().startswith(CONSTRAINT_PREFIX):
            name = key[len(CONSTRAINT_PREFIX):]
            checks.append((f"CHECK constraint {name} ({expression})",
                           f"NOT coalesce(({expression}), false)"))
    return checks


class ValueChecks:
    """DeltaSink's value checks (:meth:`run`), with the table's properties read once per
    table schema the sink reads (a run's start, a schema change): a CHECK constraint
    added while a run goes on is Delta's writer's to find."""

    def __init__(self) -> None:
        self._schema: StructType | None = None
        self._properties: dict[str, str] = {}

    def run(self, session: SparkSession, df: DataFrame, table: StructType, location: str, *,
            sink_id: str, batch_id: int) -> None:
        """Raise :class:`BadInputError` naming the first of :func:`value_checks` that a row
        of ``df`` breaks: one Spark job for all of them, none when the table has no such
        columns or constraints."""
        if self._schema is not table:
            import connectors.delta._api as delta_api

            self._properties = delta_api.properties(session, location)
            self._schema = table
        checks = value_checks(df.schema, table, self._properties)
        if not checks:
            return
        from pyspark.sql import functions as F  # noqa: N812

        counts: list[Any] = [F.sum(F.when(F.expr(condition), 1).otherwise(0)).alias(f"c{i}")
                             for i, (_what, condition) in enumerate(checks)]
        row = df.agg(*counts).first()
        broken = [(what, int(row[i] or 0)) for i, (what, _c) in enumerate(checks)
                  if row is not None and (row[i] or 0) > 0]
        if broken:
            what, rows = broken[0]
            raise BadInputError(
                f"{rows} row(s) of the batch break the {what} of the Delta table at "
                f"{location}, which Delta's writer would refuse after the other targets "
                "committed: filter or fix those rows in the query, or change the table's "
                "constraint", sink_id=sink_id, batch_id=batch_id)


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
