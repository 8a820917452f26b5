"""``mode="changes"`` in PostgreSQL: the last change of each key applied with SQL.

The database-independent part (op codes, the staging of each batch, the last change of each
key, the driver's checks) is :mod:`connectors.core.changes`; this module applies its result
inside the task's transaction (then the receipt and the ``PREPARE`` as always):

- the deleted keys: one ``DELETE ... USING unnest(...)`` (a key the table does not hold is
  fine; a delete's other columns are never written, NULL or not);
- the upserted keys: the full row, with the upsert SQL
  (``INSERT ... ON CONFLICT (keys) DO UPDATE``).

Deletes and upserts touch distinct keys; applying the batch's changes one by one in
sequence order would leave the same table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from connectors.core.changes import latest_changes
from connectors.postgres._config import PostgresOptions
from connectors.postgres._types import WritePlan

__all__ = ["apply_changes", "delete_statement"]


def delete_statement(options: PostgresOptions, plan: WritePlan) -> sql.Composed:
    """``DELETE`` of the keys given as one array parameter per key column."""
    keys = list(options.key_columns)
    types = [plan.sql_types[plan.columns.index(k)] for k in keys]
    return sql.SQL("DELETE FROM {t} AS t USING unnest({arrays}) AS d({names}) "
                   "WHERE {match}").format(
        t=options.table.sql(),
        arrays=sql.SQL(", ").join(sql.SQL("%s::{}[]").format(sql.SQL(t)) for t in types),
        names=sql.SQL(", ").join(map(sql.Identifier, keys)),
        match=sql.SQL(" AND ").join(
            sql.SQL("t.{k} = d.{k}").format(k=sql.Identifier(k)) for k in keys),
    )


def apply_changes(conn: psycopg.Connection[Any], staged: Sequence[pa.RecordBatch],
                  options: PostgresOptions, plan: WritePlan,
                  upsert: Callable[[pa.Table], None]) -> tuple[int, int]:
    """Apply the last change of each key: deletes, then upserts (through ``upsert``, the
    upsert mode's SQL); ``(upserted, deleted)`` keys."""
    if not staged:
        return 0, 0
    # Ties: the other columns in the batch's order, the op column only as its delete flag
    # (the same order whether the table has the op column or not).
    tie_break = [c for c in plan.columns if c != options.op_column]
    upserts, deletes = latest_changes(staged, options.key_columns, plan.columns, tie_break)
    if deletes.num_rows:
        conn.execute(delete_statement(options, plan),
                     [deletes.column(k).to_pylist() for k in options.key_columns])
    if upserts.num_rows:
        upsert(upserts)
    return upserts.num_rows, deletes.num_rows
