"""Driver side, before a batch is written: the target table and the server's capacity.

- :func:`plan_table`: the table exists (or is created from the batch's schema), every
  column of the batch fits one of its columns, the upsert (or change) keys are in the batch
  and a unique index covers them; ``mode="changes"`` leaves out the op and sequence
  columns the table lacks (:mod:`~connectors.core.changes`); the result
  is the :class:`~connectors.postgres._types.WritePlan` the tasks write with;
- :func:`check_max_prepared`: ``max_prepared_transactions`` covers every task of the batch
  (each prepares one transaction); the error names the setting and the value to use.

Both run on the driver's connection (:class:`~connectors.postgres._ledger.DriverConnection`).
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from connectors.core.changes import check_change_input, written_schema
from connectors.core.errors import BadInputError, ConfigurationError
from connectors.postgres._config import PostgresOptions, TableName
from connectors.postgres._errors import raise_translated
from connectors.postgres._ledger import DriverConnection
from connectors.postgres._pgtypes import describe_types
from connectors.postgres._types import (
    Column,
    WritePlan,
    check_column_names,
    ddl_type,
    plan_write,
)

__all__ = ["OPERATOR_TABLE", "check_max_prepared", "has_unique_index", "plan_table",
           "read_columns"]

logger = logging.getLogger(__name__)

#: Built-in scalar types the sink converts itself (:mod:`connectors.postgres._special`).
_RESOLVED = frozenset({"uuid", "interval", "inet", "cidr", "timetz", "time", "json", "jsonb"})

#: The placeholder table of :meth:`PostgresSink.operator` instances.
OPERATOR_TABLE = "pg_catalog.connectors_operator_no_table"


def read_columns(conn: psycopg.Connection[Any], table: TableName) -> list[Column]:
    """The columns of ``table`` in order; empty if it does not exist."""
    rows = conn.execute(
        "SELECT a.attname, t.typname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
        "a.atthasdef, a.atttypid::int8, t.typtype, t.typcategory "
        "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped "
        "ORDER BY a.attnum",
        (table.schema, table.name),
    ).fetchall()
    # Types beyond the built-in scalars: resolved (domains, arrays, enums) for the wire.
    custom = [int(r[5]) for r in rows if r[6] != "b" or r[7] == "A" or r[1] in _RESOLVED]
    types = describe_types(conn, custom) if custom else {}
    return [Column(r[0], r[1], r[2], bool(r[3]), bool(r[4]), types.get(int(r[5])))
            for r in rows]


def _create_table(
    conn: psycopg.Connection[Any], options: PostgresOptions, schema: pa.Schema, sink_id: str
) -> None:
    columns = [
        sql.SQL("{} {}").format(sql.Identifier(f.name), sql.SQL(ddl_type(f.type)))
        for f in schema
    ]
    if options.key_columns:
        columns.append(sql.SQL("PRIMARY KEY ({})").format(
            sql.SQL(", ").join(map(sql.Identifier, options.key_columns))))
    conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
        options.table.sql(), sql.SQL(", ").join(columns)))
    logger.info("sink %s: created table %s", sink_id, options.table)


def plan_table(
    db: DriverConnection, options: PostgresOptions, schema: pa.Schema, *, sink_id: str
) -> WritePlan:
    """The table exists (or is created), every column fits, keys are in the batch."""
    table = options.table
    if table == TableName.parse(OPERATOR_TABLE):
        raise ConfigurationError("PostgresSink.operator(...) settles transactions; it "
                                 "cannot write: create a PostgresSink with a table",
                                 sink_id=sink_id)
    changes = options.mode == "changes"
    try:
        check_column_names(schema, str(table))
        if changes:
            check_change_input(schema, options, str(table))
    except BadInputError as exc:
        exc.sink_id = sink_id
        raise
    with db.lock:
        conn = db.get()

        def read() -> tuple[list[Column], bool]:
            columns = read_columns(conn, table)
            if not columns and options.create_table:
                created = written_schema(schema, options, None) if changes else schema
                _create_table(conn, options, created, sink_id)
                columns = read_columns(conn, table)
            keyed = bool(columns) and bool(options.key_columns) and has_unique_index(
                conn, table, options.key_columns)
            return columns, keyed

        columns, keyed = raise_translated(
            read, lambda exc: db.error(exc, f"reading the columns of {table}"))
    if not columns:
        raise BadInputError(
            f"table {table} does not exist: create it, or pass create_table=True",
            sink_id=sink_id,
        )
    if changes:
        schema = written_schema(schema, options, [c.name for c in columns])
    plan = plan_write(str(table), schema, columns)
    missing_keys = [k for k in options.key_columns if k not in plan.columns]
    if missing_keys:
        raise BadInputError(
            f"key column(s) {', '.join(map(repr, missing_keys))} are not in the batch (its "
            f"columns: {', '.join(map(repr, plan.columns))}); names are matched exactly",
            sink_id=sink_id,
        )
    if options.key_columns and not keyed:
        keys = ", ".join(options.key_columns)
        raise ConfigurationError(
            f"mode={options.mode!r} needs a unique index or primary key of {table} on "
            f"exactly key_columns ({keys}), for ON CONFLICT: ALTER TABLE {table} ADD "
            f"PRIMARY KEY ({keys}) (or CREATE UNIQUE INDEX ... ({keys}); not partial, not "
            "deferrable), or let create_table=True create the table",
            sink_id=sink_id,
        )
    return plan


def has_unique_index(conn: psycopg.Connection[Any], table: TableName,
                     keys: tuple[str, ...]) -> bool:
    """Whether a unique index of ``table`` on exactly ``keys`` (any order) can be the
    arbiter of ``ON CONFLICT (keys)``: valid, immediate, not partial, no expression."""
    rows = conn.execute(
        "SELECT 1 FROM pg_index i "
        "WHERE i.indrelid = to_regclass(format('%%I.%%I', %s::text, %s::text)) "
        "AND i.indisunique AND i.indisvalid AND i.indimmediate AND i.indpred IS NULL "
        "AND i.indexprs IS NULL AND i.indnkeyatts = %s "
        "AND (SELECT array_agg(a.attname::text) FROM unnest(i.indkey::int2[]) "
        "WITH ORDINALITY k(attnum, n) JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = k.attnum WHERE k.n <= i.indnkeyatts) @> %s::text[] LIMIT 1",
        (table.schema, table.name, len(keys), list(keys)),
    ).fetchall()
    return bool(rows)


def check_max_prepared(db: DriverConnection, tasks: int, *, sink_id: str) -> int:
    """The server's ``max_prepared_transactions`` if it is at least ``tasks``, else a
    :class:`~connectors.core.errors.ConfigurationError` that says what to set."""
    rows = db.fetch("reading max_prepared_transactions", "SHOW max_prepared_transactions")
    limit = int(rows[0][0]) if rows else 0
    if limit < tasks:
        needed = max(64, tasks * 2)
        raise ConfigurationError(
            f"max_prepared_transactions is {limit} on the server, below the {tasks} "
            f"task(s) of this batch that each prepare a transaction: set "
            f"max_prepared_transactions = {needed} in postgresql.conf (ALTER SYSTEM SET "
            f"max_prepared_transactions = {needed}) and restart PostgreSQL",
            sink_id=sink_id,
        )
    return limit
