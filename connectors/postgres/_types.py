"""Arrow <-> PostgreSQL types for binary COPY: what each column is cast to before encoding.

Binary COPY needs the exact wire type of each column (an ``int8`` value cannot go into an
``integer`` column), so the driver reads the table's columns once per batch and builds a
:class:`WritePlan`: the Arrow type every input column is cast to (a *safe* cast: an
overflowing value is a bad-input error, never a wrapped number).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import pyarrow as pa

from connectors.core.errors import BadInputError, ConfigurationError
from connectors.postgres._names import MAX_IDENTIFIER_BYTES
from connectors.postgres._pgtypes import PgType
from connectors.postgres._special import Special, plan_special

__all__ = ["Column", "WritePlan", "check_column_names", "ddl_type", "plan_write"]


@dataclass(frozen=True)
class Column:
    """A column of the target table, as PostgreSQL describes it."""

    name: str
    typname: str  # pg_type.typname, e.g. int8, timestamptz, _int4 for arrays
    formatted: str  # format_type(), e.g. "timestamp with time zone"
    not_null: bool
    has_default: bool
    pg: PgType | None = None  # the type resolved (domains, arrays, enums), if read


@dataclass(frozen=True)
class WritePlan:
    """What a task needs to write: column order, Arrow types, jsonb columns, SQL types."""

    columns: tuple[str, ...]
    schema: pa.Schema
    jsonb: tuple[str, ...]
    sql_types: tuple[str, ...]
    #: Per column: how the task converts it first (:mod:`connectors.postgres._special`).
    specials: tuple[Special | None, ...] = ()


def _ints(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t))


def _target(col: Column, source: pa.DataType) -> pa.DataType | None:
    """The Arrow type to cast ``source`` to for ``col``, or None if incompatible."""
    name = col.typname
    if pa.types.is_dictionary(source):
        source = source.value_type
    if name in ("int2", "int4", "int8"):
        target = {"int2": pa.int16(), "int4": pa.int32(), "int8": pa.int64()}[name]
        return target if _ints(source) else None
    if name in ("float4", "float8"):
        ok = _ints(source) or pa.types.is_floating(source) or pa.types.is_decimal(source)
        return (pa.float32() if name == "float4" else pa.float64()) if ok else None
    if name == "numeric":
        if pa.types.is_decimal(source):
            return pa.decimal128(source.precision, source.scale) if source.precision <= 38 else None
        return pa.decimal128(38, 0) if _ints(source) else None
    if name == "bool":
        return pa.bool_() if pa.types.is_boolean(source) else None
    if name in ("text", "varchar", "bpchar", "name", "json", "jsonb", "citext"):
        ok = pa.types.is_string(source) or pa.types.is_large_string(source)
        return pa.large_string() if ok else None
    if name == "bytea":
        ok = pa.types.is_binary(source) or pa.types.is_large_binary(source)
        return pa.large_binary() if ok else None
    if name in ("timestamptz", "timestamp"):
        if not pa.types.is_timestamp(source):
            return None
        return pa.timestamp("us", tz="UTC") if name == "timestamptz" else pa.timestamp("us")
    if name == "date":
        return pa.date32() if pa.types.is_date(source) else None
    if name == "time":
        return pa.time64("us") if pa.types.is_time(source) else None
    return None


_SUPPORTED = (
    "smallint, integer, bigint, real, double precision, numeric, boolean, text, varchar, "
    "char, citext, json, jsonb, bytea, timestamp, timestamptz, date, time, timetz, uuid, "
    "interval, inet, cidr, enums, domains and one-dimensional arrays of these"
)
_PROBES = (pa.int64(), pa.string(), pa.timestamp("us"), pa.duration("us"),
           pa.list_(pa.string()), pa.list_(pa.int64()), pa.map_(pa.string(), pa.string()))


def _native(kind: str, source: pa.DataType) -> pa.DataType | None:
    return _target(Column("", kind, kind, False, False), source)


def _plan_column(col: Column, source: pa.DataType) -> tuple[pa.DataType | None, Special | None]:
    """The Arrow type pgpq encodes for ``col`` and, if the task converts first, how."""
    pg = col.pg
    base = col if pg is None or not pg.domain else replace(col, typname=pg.name)
    target = _target(base, source) if pg is None or not pg.is_array else None
    if target is not None or pg is None:
        return target, None
    spec = plan_special(pg, col.formatted, source, _native)
    return (spec.target, spec) if spec is not None else (None, None)


def check_column_names(schema: pa.Schema, table: str) -> None:
    """The batch's column names are ones PostgreSQL keeps as they are (before the table is
    read or created: ``create_table`` would otherwise create truncated names)."""
    for name in schema.names:
        if "\x00" in name or len(name.encode("utf-8")) > MAX_IDENTIFIER_BYTES:
            raise BadInputError(
                f"column {name!r} of the batch cannot be a column of table {table}: "
                f"PostgreSQL truncates names to {MAX_IDENTIFIER_BYTES} bytes (UTF-8) and "
                "refuses NUL characters; rename the column in the DataFrame")


def _not_in_table(name: str, table: str, by_name: dict[str, Column]) -> BadInputError:
    folded = [c for c in by_name if c.lower() == name.lower()]
    hint = (f"; the table has {folded[0]!r}: names are matched exactly (PostgreSQL folds "
            "an unquoted name in CREATE TABLE to lower case), so rename the DataFrame's "
            "column to match" if folded else "; add it to the table or drop it from the "
            "DataFrame")
    return BadInputError(
        f"column {name!r} of the batch does not exist in table {table} "
        f"(its columns: {', '.join(map(repr, sorted(by_name)))}){hint}")


def plan_write(table: str, input_schema: pa.Schema, columns: Sequence[Column]) -> WritePlan:
    """Check ``input_schema`` against the table's columns; raise naming the problem."""
    by_name = {c.name: c for c in columns}
    fields, sql_types, jsonb = [], [], []
    specials: list[Special | None] = []
    for field in input_schema:
        col = by_name.get(field.name)
        if col is None:
            raise _not_in_table(field.name, table, by_name)
        target, special = _plan_column(col, field.type)
        if target is None:
            if all(_plan_column(col, probe)[0] is None for probe in _PROBES):
                raise ConfigurationError(
                    f"column {field.name!r} of {table} has type {col.formatted}, which the "
                    f"sink cannot write with binary COPY (supported: {_SUPPORTED})"
                )
            raise BadInputError(
                f"column {field.name!r}: the batch has {field.type}, table {table} has "
                f"{col.formatted}: incompatible; cast the column in the DataFrame "
                f"(e.g. col({field.name!r}).cast(...)) or change the table"
            )
        fields.append(pa.field(field.name, target, nullable=True))
        sql_types.append(col.formatted)
        specials.append(special)
        base = col.pg.name if col.pg is not None else col.typname
        if base == "jsonb" and (special is None or special.how == "json"):
            jsonb.append(field.name)
    present = {f.name for f in input_schema}
    missing = [
        c.name for c in columns if c.not_null and not c.has_default and c.name not in present
    ]
    if missing:
        raise BadInputError(
            f"table {table} has NOT NULL column(s) {', '.join(map(repr, missing))} without a "
            "default, and the batch does not have them: add them to the DataFrame"
        )
    return WritePlan(
        columns=tuple(f.name for f in input_schema),
        schema=pa.schema(fields),
        jsonb=tuple(jsonb),
        sql_types=tuple(sql_types),
        specials=tuple(specials) if any(s is not None for s in specials) else (),
    )


def ddl_type(t: pa.DataType) -> str:
    """The PostgreSQL type ``create_table=True`` uses for an Arrow type."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    simple = [
        (pa.types.is_boolean, "boolean"),
        (pa.types.is_int8, "smallint"),
        (pa.types.is_int16, "smallint"),
        (pa.types.is_int32, "integer"),
        (pa.types.is_int64, "bigint"),
        (pa.types.is_float32, "real"),
        (pa.types.is_float64, "double precision"),
        (pa.types.is_string, "text"),
        (pa.types.is_large_string, "text"),
        (pa.types.is_binary, "bytea"),
        (pa.types.is_large_binary, "bytea"),
        (pa.types.is_date, "date"),
        (pa.types.is_time, "time"),
    ]
    for check, name in simple:
        if check(t):
            return name
    if pa.types.is_timestamp(t):
        return "timestamp with time zone" if t.tz else "timestamp"
    if pa.types.is_duration(t) or t == pa.month_day_nano_interval():
        return "interval"
    if pa.types.is_map(t) or pa.types.is_struct(t):
        return "jsonb"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        inner = t.value_type
        if pa.types.is_map(inner) or pa.types.is_struct(inner):
            return "jsonb"
        if not (pa.types.is_list(inner) or pa.types.is_large_list(inner)
                or pa.types.is_fixed_size_list(inner)):
            return f"{ddl_type(inner)}[]"
    if pa.types.is_decimal(t):
        return f"numeric({t.precision},{t.scale})"
    raise ConfigurationError(
        f"create_table cannot map the Arrow type {t} to a PostgreSQL type; create the table "
        "yourself"
    )
