"""Lists, maps and structs as JSON text (for JSON columns), vectorised with pyarrow.compute.

A list is ``[...]``, a struct ``{"field": ...}`` (its fields in order), a map ``{"key":
...}`` (a key that is no string is written as its text: ``{"1": ...}``); inside them a NULL
is ``null``, a boolean ``true``/``false``, a number its text (:mod:`._text`: NaN and
infinities refused), a string a JSON string, binary its hex digits as a string, and a date,
timestamp or time its text as a string. A NULL list, map or struct stays NULL (SQL NULL,
not the JSON ``null``).

Each level is built for all rows at once: the elements of every list are encoded as one
array, then joined per list with ``binary_join`` over the list offsets.

Example::

    >>> import pyarrow as pa
    >>> json_text(pa.array([[1, None], [], None]), "tags").to_pylist()
    ['[1,null]', '[]', None]
    >>> rows = pa.array([{"a": "x\\"y", "b": True}], pa.struct([("a", pa.string()),
    ...                                                         ("b", pa.bool_())]))
    >>> json_text(rows, "doc").to_pylist()
    ['{"a":"x\\\\"y","b":true}']
    >>> json_text(pa.array([[(1, 2.5)]], pa.map_(pa.int32(), pa.float64())), "m").to_pylist()
    ['{"1":2.5}']
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from connectors.mariadb._text import (
    TEXT,
    ValueRefused,
    concat,
    hex_text,
    is_binary,
    is_text,
    plain,
    scalar_text,
)

__all__ = ["is_nested", "json_text"]

#: JSON's two-character escapes; every other control character is ``\u00XX``.
_SHORT = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b",
          "\f": "\\f"}
_CONTROL = [chr(c) for c in range(0x20) if chr(c) not in _SHORT]


def is_nested(t: pa.DataType) -> bool:
    """A list (of any kind), map or struct type: written as JSON text."""
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t)
                or pa.types.is_fixed_size_list(t) or pa.types.is_list_view(t)
                or pa.types.is_large_list_view(t) or pa.types.is_map(t)
                or pa.types.is_struct(t))


def _string(arr: pa.Array) -> pa.Array:
    """Text values as JSON strings (quoted, escaped), NULLs kept."""
    out = arr.cast(TEXT)
    for char in ("\\", '"'):
        out = pc.replace_substring(out, char, _SHORT[char])
    controls: Any = pc.any(pc.match_substring_regex(out, "[\\x00-\\x1f]")).as_py()
    if controls:
        for char in ("\n", "\r", "\t", "\b", "\f"):
            out = pc.replace_substring(out, char, _SHORT[char])
        for char in _CONTROL:
            out = pc.replace_substring(out, char, f"\\u{ord(char):04x}")
    return concat('"', out, '"')


def _null_as_json(arr: pa.Array) -> pa.Array:
    return arr.fill_null(pa.scalar("null", TEXT)) if arr.null_count else arr


def _per_list(offsets: pa.Array, items: pa.Array, start: int, open_: str,
              close: str) -> pa.Array:
    """``open_ + ",".join(items of the list) + close`` per list, by the lists' offsets."""
    lists = pa.LargeListArray.from_arrays(pc.subtract(offsets.cast(pa.int64()), start), items)
    return concat(open_, pc.binary_join(lists, pa.scalar(",", TEXT)), close)


def _keep_nulls(source: pa.Array, values: pa.Array) -> pa.Array:
    if source.null_count == 0:
        return values
    return pc.if_else(source.is_valid(), values, pa.scalar(None, TEXT))


def _list(arr: pa.Array, column: str) -> pa.Array:
    lists = arr.cast(pa.large_list(arr.type.value_type))
    offsets = lists.offsets
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    items = _null_as_json(_json(lists.values.slice(start, end - start), column))
    return _keep_nulls(arr, _per_list(offsets, items, start, "[", "]"))


def _map(arr: pa.Array, column: str) -> pa.Array:
    offsets = arr.offsets
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    entries = arr.values.slice(start, end - start)
    keys = plain(entries.field(0))
    if is_text(keys.type):
        key_text = keys
    elif is_binary(keys.type):
        key_text = hex_text(keys)
    else:
        key_text = scalar_text(keys, column)
    values = _null_as_json(_json(entries.field(1), column))
    items = concat(_string(key_text), ":", values)
    return _keep_nulls(arr, _per_list(offsets, items, start, "{", "}"))


def _struct(arr: pa.Array, column: str) -> pa.Array:
    if arr.type.num_fields == 0:
        return _keep_nulls(arr, pa.array(["{}"] * len(arr), TEXT))
    parts: list[pa.Array | str] = ["{"]
    for i, child in enumerate(arr.flatten()):  # flatten: a NULL struct's fields are NULL
        name = json.dumps(arr.type.field(i).name, ensure_ascii=False)
        parts += ["," if i else "", f"{name}:", _null_as_json(_json(child, column))]
    parts.append("}")
    return _keep_nulls(arr, concat(*parts))


def _json(arr: pa.Array, column: str) -> pa.Array:
    """JSON text of every value, NULL where the value is NULL."""
    arr = plain(arr)
    t = arr.type
    if pa.types.is_map(t):
        return _map(arr, column)
    if is_nested(t) and not pa.types.is_struct(t):
        return _list(arr, column)
    if pa.types.is_struct(t):
        return _struct(arr, column)
    if pa.types.is_boolean(t):
        return pc.if_else(arr, pa.scalar("true", TEXT), pa.scalar("false", TEXT))
    if is_text(t):
        return _string(arr)
    if is_binary(t):
        return _string(hex_text(arr))
    text = scalar_text(arr, column)
    if (pa.types.is_date(t) or pa.types.is_timestamp(t) or pa.types.is_time(t)):
        return _string(text)
    return text


def json_text(arr: pa.Array, column: str) -> pa.Array:
    """Each value of a list, map or struct column as JSON text (``large_string``); a NULL
    value stays NULL. Raises :class:`~._text.ValueRefused` for a value JSON cannot hold."""
    if not is_nested(plain(arr).type):
        raise ValueRefused(column, f"not a list, map or struct: {arr.type}")
    return _json(arr, column)
