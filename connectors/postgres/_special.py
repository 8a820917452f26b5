"""Column types beyond pgpq's own encoders: planned on the driver, converted in the task.

:func:`plan_special` decides, for a table column (its type resolved by
:mod:`~connectors.postgres._pgtypes`) and a batch column's Arrow type, how the task
converts the column before pgpq encodes it (a :class:`Special`); :func:`convert` does it.

- ``uuid`` (from strings in PostgreSQL's spellings, or 16-byte binary), ``inet``/``cidr``,
  ``timetz``, ``time`` from strings, ``interval`` from Arrow month intervals, and arrays
  whose element OID pgpq would get wrong (``varchar[]``, ``uuid[]``, an enum's array, an
  array of a domain, ...): encoded into their binary receive format
  (:mod:`~connectors.postgres._encode`) in a binary column that pgpq frames as it frames
  ``bytea``;
- arrays pgpq encodes with the element OID the column has (``integer[]``, ``text[]``, ...):
  cast to a ``large_list`` and left to pgpq;
- ``interval`` from durations (Spark's day-time intervals): pgpq's duration encoder
  (microseconds, 0 days, 0 months: an exact duration);
- enums: the label's text, checked against the enum's labels so the error names the column;
- ``json``/``jsonb`` from maps, structs and lists: their JSON text.

In ``upsert`` mode every special column travels as PostgreSQL *text* input instead
(:func:`convert` with ``upsert=True``) and is cast back in the ``SELECT`` over ``unnest``
(:func:`upsert_sql`): an array column cannot go through ``unnest(%s::integer[][])``, which
would flatten it.
"""

from __future__ import annotations

import base64
import json
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from psycopg import adapt, sql

from connectors.postgres._encode import TEXT_KINDS, ValueRefused, encode, frame_arrays
from connectors.postgres._pgtypes import PgType

__all__ = [
    "NATIVE_ARRAY_OIDS", "ColumnRefused", "Special", "aliases", "convert", "convert_batch",
    "plan_special", "upsert_sql",
]

#: Element kinds whose pgpq list encoder writes the element OID PostgreSQL's array_recv
#: wants (pgpq's own output type): only then does pgpq encode the array itself.
NATIVE_ARRAY_OIDS = {
    "int2": 21, "int4": 23, "int8": 20, "float4": 700, "float8": 701, "bool": 16,
    "text": 25, "bytea": 17, "numeric": 1700, "date": 1082, "timestamp": 1114,
}  # not timestamptz: pgpq 0.12 writes its lists with timestamp's OID 1114
_MAX_LABELS = 20  # enum labels an error lists
_STRINGS = (pa.types.is_string, pa.types.is_large_string)
_BINARIES = (pa.types.is_binary, pa.types.is_large_binary)


def _is(checks: tuple[Any, ...], t: pa.DataType) -> bool:
    return any(check(t) for check in checks)


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t)
                or pa.types.is_fixed_size_list(t))


def _nested(t: pa.DataType) -> bool:
    return bool(pa.types.is_map(t) or pa.types.is_struct(t) or _is_list(t))


@dataclass(frozen=True)
class Special:
    """How a task converts one column (picklable: it travels in the plan)."""

    how: str  # "binary", "native" (a cast), "enum", "json"
    kind: str  # the scalar kind, or the element's for arrays
    target: pa.DataType  # what pgpq encodes (append mode)
    sql_type: str  # format_type() of the column: the upsert's cast
    array: bool = False
    elem_oid: int = 0
    labels: frozenset[str] = frozenset()
    elem_json: bool = False  # array elements from maps/structs: JSON text first


def _scalar_ok(kind: str, t: pa.DataType) -> bool:
    """Can :func:`encode` write ``kind`` from Arrow type ``t``?"""
    if pa.types.is_dictionary(t):
        t = t.value_type
    numeric = pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
    checks = {
        "int2": pa.types.is_integer(t), "int4": pa.types.is_integer(t),
        "int8": pa.types.is_integer(t), "float4": numeric, "float8": numeric,
        "bool": pa.types.is_boolean(t), "bytea": _is(_BINARIES, t),
        "numeric": pa.types.is_decimal(t) or pa.types.is_integer(t),
        "uuid": _is(_STRINGS + _BINARIES, t) or (
            pa.types.is_fixed_size_binary(t) and t.byte_width == 16),
        "date": pa.types.is_date(t), "timestamp": pa.types.is_timestamp(t),
        "timestamptz": pa.types.is_timestamp(t),
        "time": pa.types.is_time(t) or _is(_STRINGS, t),
        "timetz": pa.types.is_time(t) or _is(_STRINGS, t),
        "interval": pa.types.is_duration(t) or t == pa.month_day_nano_interval(),
        "inet": _is(_STRINGS, t), "cidr": _is(_STRINGS, t),
        "jsonb": _is(_STRINGS, t) or _nested(t), "json": _is(_STRINGS, t) or _nested(t),
    }
    if kind in checks:
        return bool(checks[kind])
    return kind in TEXT_KINDS and _is(_STRINGS, t)


def plan_special(pg: PgType, formatted: str, source: pa.DataType,
                 native: Any) -> Special | None:
    """How to write ``source`` into a column of type ``pg``; None if it cannot be.

    ``native(kind, arrow_type)`` is the plain cast target pgpq encodes for a scalar kind
    (:func:`connectors.postgres._types._target`), or None.
    """
    if pa.types.is_dictionary(source):
        source = source.value_type
    kind = pg.scalar_kind
    labels = frozenset(pg.labels)
    if pg.elem is not None:
        if not _is_list(source):
            return None
        value_type = source.value_type
        ekind = pg.elem.scalar_kind
        if pa.types.is_dictionary(value_type):
            value_type = value_type.value_type
        elem_native = native(ekind, value_type)
        if NATIVE_ARRAY_OIDS.get(ekind) == pg.elem_oid and elem_native is not None:
            return Special("native", ekind, pa.large_list(elem_native), formatted, True,
                           pg.elem_oid)
        if not (_scalar_ok(ekind, value_type) or pa.types.is_null(value_type)):
            return None
        return Special("binary", ekind, pa.large_binary(), formatted, True, pg.elem_oid,
                       frozenset(pg.elem.labels),
                       elem_json=ekind in ("json", "jsonb") and _nested(value_type))
    if kind == "enum":
        ok = _is(_STRINGS, source)
        return Special("enum", kind, pa.large_string(), formatted, labels=labels) if ok else None
    if kind in ("json", "jsonb") and _nested(source):
        return Special("json", kind, pa.large_string(), formatted)
    if kind == "interval" and pa.types.is_duration(source):
        return Special("native", kind, pa.duration("us"), formatted)
    if kind in ("uuid", "inet", "cidr", "timetz", "time", "interval") and _scalar_ok(kind, source):
        return Special("binary", kind, pa.large_binary(), formatted)
    return None


# ---------------------------------------------------------------- in the task
def _json(value: Any, t: pa.DataType) -> str:
    """``value`` (of Arrow type ``t``, as ``to_pylist`` gives it) as JSON text, exact:
    decimals keep every digit (PostgreSQL's jsonb stores numbers as ``numeric``), like
    Spark's ``to_json``; bytes are base64, dates and times ISO 8601, durations seconds."""
    if value is None:
        return "null"
    if pa.types.is_map(t):
        return "{" + ",".join(
            _key(k, t.key_type) + ":" + _json(v, t.item_type) for k, v in value) + "}"
    if pa.types.is_struct(t):
        return "{" + ",".join(
            _dumps(f.name) + ":" + _json(value.get(f.name), f.type) for f in t) + "}"
    if _is_list(t):
        return "[" + ",".join(_json(v, t.value_type) for v in value) + "]"
    if isinstance(value, Decimal):
        return str(value) if value.is_finite() else _dumps(str(value))
    if isinstance(value, float) and not math.isfinite(value):
        return _dumps("NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity"))
    if isinstance(value, (bytes, bytearray)):
        return _dumps(base64.b64encode(value).decode())
    if isinstance(value, (datetime, date, time)):
        return _dumps(value.isoformat())
    if isinstance(value, timedelta):
        return _dumps(value.total_seconds())
    return _dumps(value)


def _key(k: Any, t: pa.DataType) -> str:
    """A map key: a string as it is, any other key as the JSON text of its value."""
    return _dumps(k if isinstance(k, str) else _json(k, t))


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _json_text(arr: pa.Array) -> pa.Array:
    t = arr.type
    return pa.array([None if v is None else _json(v, t) for v in arr.to_pylist()],
                    pa.large_string())


def _check_labels(arr: pa.Array, labels: frozenset[str]) -> pa.Array:
    arr = arr.cast(pa.large_string())
    known = pc.is_in(arr, value_set=pa.array(sorted(labels), pa.large_string()))
    bad = pc.and_(pc.invert(known), arr.is_valid())
    if pc.any(bad).as_py():
        first = arr.filter(bad)[0].as_py()
        shown = sorted(labels)[:_MAX_LABELS]
        more = ", ..." if len(labels) > _MAX_LABELS else ""
        raise ValueRefused(f"a value is not a label of the enum (labels: "
                           f"{', '.join(shown)}{more})", first)
    return arr


def _elements(spec: Special, values: pa.Array) -> pa.Array:
    """Array elements ready for :func:`encode` (enum labels checked, JSON made)."""
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if spec.elem_json:
        values = _json_text(values)
    if spec.kind == "enum":
        values = _check_labels(values, spec.labels)
    if pa.types.is_null(values.type):
        return pa.nulls(len(values), pa.large_binary())
    return values


def _binary(spec: Special, arr: pa.Array) -> pa.Array:
    if spec.array:
        return frame_arrays(arr, lambda v: encode(spec.kind, _elements(spec, v)), spec.elem_oid)
    return encode(spec.kind, arr)


def _text_value(kind: str, value: Any) -> Any:
    """One scalar as PostgreSQL's text input (or a value psycopg's text dumper writes so)."""
    if value is None:
        return None
    if kind == "uuid":
        raw = value if isinstance(value, bytes) else None
        return str(uuid.UUID(bytes=raw)) if raw is not None else value
    if kind == "interval":
        if isinstance(value, timedelta):
            us = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
            return f"{us} microseconds"
        return f"{value.months} months {value.days} days {value.nanoseconds // 1000} microseconds"
    if isinstance(value, time):
        return value.isoformat()
    return value


def _texts(spec: Special, arr: pa.Array) -> pa.Array:
    """Upsert mode: the column as PostgreSQL text input, checked like the binary path."""
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if spec.how == "enum":
        return _check_labels(arr, spec.labels)
    if spec.how == "json":
        return _json_text(arr)
    if not spec.array:
        _binary(spec, arr)  # refuses what the binary path refuses
        return pa.array([_text_value(spec.kind, v) for v in arr.to_pylist()], pa.large_string())
    if spec.how == "binary":
        _binary(spec, arr)
    flat = arr.flatten()  # the elements of the non-NULL rows, slicing respected
    values = _elements(spec, flat) if spec.how == "binary" else flat
    rows = arr.to_pylist()
    it = iter([_text_value(spec.kind, v) for v in values.to_pylist()])
    out: list[str | None] = []
    tx = adapt.Transformer()
    for row in rows:
        if row is None:
            out.append(None)
            continue
        items = [next(it) for _ in row]
        dumped = tx.get_dumper(items, adapt.PyFormat.TEXT).dump(items) if items else b"{}"
        out.append(bytes(dumped or b"{}").decode())
    return pa.array(out, pa.large_string())


def convert(spec: Special, arr: pa.Array, *, upsert: bool) -> pa.Array:
    """The column as the task writes it; :class:`ValueRefused` for a value that cannot be."""
    if upsert:
        return _texts(spec, arr)
    if spec.how == "native":
        return arr.cast(spec.target)
    if spec.how == "enum":
        return _check_labels(arr, spec.labels)
    if spec.how == "json":
        return _json_text(arr)
    return _binary(spec, arr)


class ColumnRefused(ValueError):
    """A column of the batch the task cannot write: names it, quotes no value."""

    def __init__(self, column: str, sql_type: str, reason: str, value: Any = None) -> None:
        super().__init__(f"column {column!r} ({sql_type}): {reason}")
        self.column, self.sql_type, self.reason, self.value = column, sql_type, reason, value


def convert_batch(columns: Sequence[str], schema: pa.Schema, sql_types: Sequence[str],
                  specials: Sequence[Special | None], batch: pa.RecordBatch, *,
                  upsert: bool) -> pa.RecordBatch:
    """``batch``'s columns in plan order, each cast or converted; :class:`ColumnRefused`
    names the first column that cannot be."""
    arrays, fields = [], []
    for name, field, sql_type, spec in zip(columns, schema, sql_types, specials, strict=True):
        arr = batch.column(name)
        try:
            out = arr.cast(field.type) if spec is None else convert(spec, arr, upsert=upsert)
        except ValueRefused as exc:
            raise ColumnRefused(name, sql_type, exc.reason, exc.value) from None
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ColumnRefused(name, sql_type, "the value does not fit", str(exc)) from None
        arrays.append(out)
        fields.append(pa.field(name, out.type, nullable=True))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def upsert_sql(columns: Sequence[str], sql_types: Sequence[str],
               special: Sequence[bool]) -> tuple[sql.Composable, sql.Composable]:
    """``(arrays, select)`` for ``SELECT {select} FROM unnest({arrays}) AS u(c0, ...)``:
    a special column travels as ``text[]`` and is cast back to its type per row."""
    arrays, select = [], []
    for i, (_, sql_type, text) in enumerate(zip(columns, sql_types, special, strict=True)):
        alias = sql.Identifier(f"c{i}")
        arrays.append(sql.SQL("%s::{}[]").format(sql.SQL("text" if text else sql_type)))
        select.append(sql.SQL("{}::{}").format(alias, sql.SQL(sql_type)) if text else alias)
    return sql.SQL(", ").join(arrays), sql.SQL(", ").join(select)


def aliases(n: int) -> sql.Composable:
    return sql.SQL(", ").join(sql.Identifier(f"c{i}") for i in range(n))

