"""``mode="changes"`` in MariaDB: the last change of each key, applied inside the branch.

The task keeps its batches, each staged with its sequence value and delete flag
(:func:`connectors.core.changes.stage`: a NULL or unknown op, a NULL sequence value is a
:class:`~connectors.core.errors.BadInputError`, nothing committed), and at the prepare
reduces them to the last change of each key (:func:`split`, the same rule as PostgreSQL's:
:func:`connectors.core.changes.latest_changes`). Then, in the XA branch:

- the upserted keys' full rows are loaded into the temporary table made ``LIKE`` the
  target and ``INSERT ... SELECT ... ON DUPLICATE KEY UPDATE`` (as ``mode="upsert"``);
- the deleted keys alone are loaded into a temporary table of the key columns
  (:func:`deletes_table_sql`: ``CREATE TEMPORARY TABLE ... SELECT <keys> FROM <target>
  LIMIT 0``, the key columns' types without the target's ``NOT NULL`` others), then
  ``DELETE t FROM <target> t JOIN <deletes> s ON <keys>`` (:func:`delete_sql`).

A delete's other columns are never loaded: Debezium's deletes often carry NULL there, and
a staging table ``LIKE`` a target with ``NOT NULL`` columns turns a loaded NULL into a
warning (1263, measured on 10.11), which the task refuses. PostgreSQL likewise deletes by
the keys alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from connectors.core.changes import latest_changes
from connectors.mariadb._config import MariaDBOptions, TableName, quote

__all__ = ["DELETES", "delete_sql", "deletes_table_sql", "split"]

#: The deleted keys' staging table: temporary, private to the task's session and branch.
DELETES = "connectors_deletes"


def split(staged: Sequence[pa.RecordBatch], options: MariaDBOptions,
          columns: Sequence[str], keys: Sequence[str]) -> tuple[pa.Table, pa.Table]:
    """``(upserts, deletes)``: the last change of each key; ties broken by the written
    columns but the op column (the same order whether the table has it or not)."""
    tie_break = [c for c in columns if c != options.op_column]
    return latest_changes(staged, keys, columns, tie_break)


def deletes_table_sql(target: TableName, stage: TableName, keys: Sequence[str]) -> str:
    """The deleted keys' temporary table: the target's key columns, no rows."""
    return (f"CREATE TEMPORARY TABLE {stage.sql()} SELECT "
            f"{', '.join(quote(k) for k in keys)} FROM {target.sql()} LIMIT 0")


def delete_sql(target: TableName, stage: TableName, keys: Sequence[str]) -> str:
    """``DELETE`` of the target's rows whose keys the staging table holds (a key the
    target lacks deletes nothing)."""
    match = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in keys)
    return f"DELETE t FROM {target.sql()} AS t JOIN {stage.sql()} AS s ON {match}"
