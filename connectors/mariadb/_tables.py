"""Driver side, before a batch is written: the target table read, created or refused.

:func:`plan_table` reads the table's columns (``information_schema.columns``), creates the
table from the batch's Arrow schema when it is missing and ``create_table`` allows it
(:func:`ddl_type`; in upsert and changes mode with the keys as its primary key), and
refuses a batch that does not fit: a column the table lacks, a required column (``NOT
NULL`` without a default) the batch lacks, a type the sink cannot write, or (upsert,
changes) a key the batch lacks or that no primary key or unique index of the table covers
exactly. With ``mode="changes"`` the batch's op and sequence columns must be there and of
types the tasks can read, and each is written only when the table has a column of its name
(:mod:`connectors.core.changes`; ``create_table`` creates the sequence column, not the op
column). Each refusal names the column and the fix, and comes before any task runs.
The result, :class:`TablePlan`, is what the tasks load with.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from connectors.core.changes import check_change_input, written_schema
from connectors.core.errors import BadInputError
from connectors.mariadb._config import MariaDBOptions, TableName, quote
from connectors.mariadb._encode import LoadPlan
from connectors.mariadb._ledger import DriverConnection

__all__ = ["TableColumn", "TablePlan", "ddl_type", "key_ddl_type", "plan_table",
           "read_columns", "unique_keys"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableColumn:
    """One column of the target table, as ``information_schema`` gives it."""

    name: str
    data_type: str  # e.g. "bigint", "varchar", "datetime", "json" (longtext + JSON check)
    column_type: str  # e.g. "bigint(20) unsigned", "varchar(64)"
    required: bool  # NOT NULL and no default


@dataclass(frozen=True)
class TablePlan:
    """What a task needs to load a batch: the table and the batch's columns in order, each
    with its table column."""

    table: TableName
    columns: tuple[str, ...]
    table_columns: tuple[TableColumn, ...]
    load: LoadPlan  # how the tasks encode and load the batch's columns
    keys: tuple[str, ...] = ()  # upsert, changes: the key columns as the batch names them
    key_load: LoadPlan | None = None  # changes: how the deleted keys are loaded


def read_columns(db: DriverConnection, table: TableName) -> list[TableColumn]:
    """The columns of ``table`` in order; empty if it does not exist."""
    rows = db.fetch(
        f"reading the columns of {table}",
        "SELECT column_name, data_type, column_type, is_nullable, column_default, extra "
        "FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
        "ORDER BY ordinal_position", (table.database, table.name))
    return [TableColumn(name=str(r[0]), data_type=str(r[1]).lower(),
                        column_type=str(r[2]).lower(),
                        required=(r[3] == "NO" and r[4] is None
                                  and "auto_increment" not in str(r[5]).lower()
                                  and "generated" not in str(r[5]).lower()))
            for r in rows]


def ddl_type(field: pa.Field) -> str:
    """The MariaDB type ``create_table`` gives an Arrow field (``BadInputError`` for one the
    sink cannot write)."""
    t = field.type
    simple: list[tuple[Any, str]] = [
        (pa.types.is_boolean, "BOOLEAN"), (pa.types.is_int8, "TINYINT"),
        (pa.types.is_int16, "SMALLINT"), (pa.types.is_int32, "INT"),
        (pa.types.is_int64, "BIGINT"), (pa.types.is_uint8, "TINYINT UNSIGNED"),
        (pa.types.is_uint16, "SMALLINT UNSIGNED"), (pa.types.is_uint32, "INT UNSIGNED"),
        (pa.types.is_uint64, "BIGINT UNSIGNED"), (pa.types.is_float32, "FLOAT"),
        (pa.types.is_float64, "DOUBLE"), (pa.types.is_date, "DATE"),
        (pa.types.is_timestamp, "DATETIME(6)"), (pa.types.is_time, "TIME(6)"),
        (pa.types.is_string, "LONGTEXT"), (pa.types.is_large_string, "LONGTEXT"),
        (pa.types.is_binary, "LONGBLOB"), (pa.types.is_large_binary, "LONGBLOB"),
        (pa.types.is_fixed_size_binary, "LONGBLOB"),
    ]
    for test, name in simple:
        if test(t):
            return name
    if pa.types.is_decimal(t):
        if t.precision > 65 or t.scale > 38:
            raise BadInputError(
                f"column {field.name!r} is {t}: MariaDB's DECIMAL holds at most 65 digits, 38 "
                "after the point. Cast it in the query (e.g. to decimal(38, 9)) or create "
                "the table yourself")
        return f"DECIMAL({t.precision},{t.scale})"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t) \
            or pa.types.is_struct(t):
        return "JSON"
    raise BadInputError(
        f"column {field.name!r} has type {t}, which MariaDBSink cannot write: cast it in "
        "the query to a number, string, binary, decimal, date, timestamp, array, map or "
        "struct")


def key_ddl_type(field: pa.Field) -> str:
    """A key column's type for ``create_table``: text and binary as ``VARCHAR(255)`` /
    ``VARBINARY(255)`` (an index needs a bounded length)."""
    t = field.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "VARCHAR(255)"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "VARBINARY(255)"
    return ddl_type(field)


def unique_keys(db: DriverConnection, table: TableName) -> list[set[str]]:
    """The column sets (lower case) of the table's primary key and unique indexes."""
    rows = db.fetch(
        f"reading the unique indexes of {table}",
        "SELECT index_name, column_name FROM information_schema.statistics WHERE "
        "table_schema = %s AND table_name = %s AND non_unique = 0", (table.database, table.name))
    found: dict[str, set[str]] = {}
    for index, column in rows:
        found.setdefault(str(index), set()).add(str(column).lower())
    return list(found.values())


def _check_keys(db: DriverConnection, options: MariaDBOptions, schema: pa.Schema, *,
                sink_id: str) -> None:
    table, keys = options.table, options.key_columns
    given = {f.name.lower() for f in schema}
    absent = [k for k in keys if k.lower() not in given]
    if absent:
        raise BadInputError(
            f"key column(s) {', '.join(absent)} are not in the batch (its columns: "
            f"{', '.join(schema.names)}): nothing was committed. Select them in the query, or "
            "change key_columns", sink_id=sink_id)
    want = {k.lower() for k in keys}
    if want not in unique_keys(db, table):
        raise BadInputError(
            f"no primary key or unique index of {table} covers exactly the key columns "
            f"{', '.join(keys)}: mode={options.mode!r} would insert duplicates. Add one "
            f"(ALTER TABLE {table} ADD UNIQUE ({', '.join(quote(k) for k in keys)})) or change "
            "key_columns", sink_id=sink_id)


def plan_table(db: DriverConnection, options: MariaDBOptions, schema: pa.Schema, *,
               sink_id: str) -> TablePlan:
    """The table exists (or is created), the batch's columns fit it (see the module
    docstring)."""
    table = options.table
    changes = options.mode == "changes"
    if changes:
        try:
            check_change_input(schema, options, str(table))
        except BadInputError as exc:
            raise BadInputError(f"{exc}: nothing was committed", sink_id=sink_id) from None
    columns = read_columns(db, table)
    if not columns:
        if not options.create_table:
            raise BadInputError(
                f"the table {table} does not exist in MariaDB {db.address.where()}: create "
                "it, or pass create_table=True", sink_id=sink_id)
        lowered = {k.lower() for k in options.key_columns}
        body = ", ".join(
            f"{quote(f.name)} {key_ddl_type(f) if f.name.lower() in lowered else ddl_type(f)}"
            + ("" if f.nullable and f.name.lower() not in lowered else " NOT NULL")
            for f in (written_schema(schema, options, None) if changes else schema))
        if options.key_columns:
            body += f", PRIMARY KEY ({', '.join(quote(k) for k in options.key_columns)})"
        db.fetch(f"creating the table {table}",
                 f"CREATE TABLE IF NOT EXISTS {table.sql()} ({body}) ENGINE=InnoDB "
                 "DEFAULT CHARSET=utf8mb4")
        logger.info("sink %s: created the table %s", sink_id, table)
        columns = read_columns(db, table)
    by_name = {c.name.lower(): c for c in columns}
    if changes:  # the op and sequence columns only if the table has them (any case)
        schema = written_schema(schema, options,
                                [f.name for f in schema if f.name.lower() in by_name])
    extra = [f.name for f in schema if f.name.lower() not in by_name]
    if extra:
        raise BadInputError(
            f"the batch has column(s) {', '.join(extra)} that the table {table} does not "
            f"(its columns: {', '.join(c.name for c in columns)}): nothing was committed. "
            f"Drop them in the query, or add them (ALTER TABLE {table} ADD COLUMN ...)",
            sink_id=sink_id)
    given = {f.name.lower() for f in schema}
    missing = [c.name for c in columns if c.required and c.name.lower() not in given]
    if missing:
        raise BadInputError(
            f"the table {table} requires column(s) {', '.join(missing)} (NOT NULL, no "
            "default) and the batch lacks them: nothing was committed. Select them in the "
            "query", sink_id=sink_id)
    for f in schema:  # a type the sink cannot write is refused before any task
        ddl_type(f)
    keys: tuple[str, ...] = ()
    if options.mode in ("upsert", "changes"):
        _check_keys(db, options, schema, sink_id=sink_id)
        named = {f.name.lower(): f.name for f in schema}
        keys = tuple(named[k.lower()] for k in options.key_columns)
    try:
        load = LoadPlan.for_schema(schema)
        key_load = (LoadPlan.for_schema(pa.schema([schema.field(k) for k in keys]))
                    if changes else None)
    except (ValueError, TypeError) as exc:
        raise BadInputError(f"the batch cannot be loaded into {table}: {exc}",
                            sink_id=sink_id) from None
    return TablePlan(table=table, columns=tuple(f.name for f in schema),
                     table_columns=tuple(by_name[f.name.lower()] for f in schema), load=load,
                     keys=keys, key_load=key_load)
