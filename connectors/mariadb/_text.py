"""Arrow columns as the text MariaDB reads them from: one Arrow string array per column.

Every conversion is vectorised with ``pyarrow.compute`` (no Python object per value); a
NULL stays NULL (the caller writes it as ``\\N``). The text is what MariaDB's LOAD DATA and
its JSON functions read back as the same value:

==================  ======================================================================
Arrow               text
==================  ======================================================================
integers            decimal digits
floats              the shortest text that reads back as the same double (float16 and
                    float32 widened to float64 first, exactly: the text is then exact in a
                    FLOAT column and in a DOUBLE one); NaN and infinities are refused,
                    MariaDB has no such values; ``-0.0`` reads back as ``0`` (MariaDB
                    keeps no negative zero)
decimal             the exact decimal text (a small exponent in scientific notation,
                    ``1E-10``, which MariaDB reads exactly)
boolean             ``1`` / ``0`` (``true`` / ``false`` inside JSON)
string              as is (escaping is the file's business: ``_encode``)
binary              as is, or as hex digits (:func:`hex_text`) for ``UNHEX``
date                ``YYYY-MM-DD``
timestamp           ``YYYY-MM-DD HH:MM:SS.ffffff``; a timestamp with a time zone as its UTC
                    wall time (a DATETIME(6) column has no zone: the sink documents that
                    it stores UTC); finer than microseconds is refused
time                ``HH:MM:SS.ffffff``; finer than microseconds is refused
==================  ======================================================================

A column that cannot be written raises :class:`ValueRefused`, whose message names the column
and the reason, never a value.

Example::

    >>> import pyarrow as pa
    >>> scalar_text(pa.array([1.5, None, 0.1]), "amount").to_pylist()
    ['1.5', None, '0.1']
    >>> scalar_text(pa.array([True, False, None]), "flag").to_pylist()
    ['1', '0', None]
    >>> hex_text(pa.array([b"\\x00\\xff", None, b""])).to_pylist()
    ['00ff', None, '']
    >>> try:
    ...     scalar_text(pa.array([float("nan")]), "amount")
    ... except ValueRefused as refused:
    ...     print(refused)
    column 'amount': NaN or an infinity: MariaDB has no such values; ...
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["TEXT", "ValueRefused", "concat", "hex_text", "is_binary", "is_text",
           "offsets_of", "plain", "scalar_text"]

#: The type of every text array built here (64-bit offsets: a batch may pass 2 GiB).
TEXT = pa.large_string()


class ValueRefused(ValueError):
    """A column MariaDB cannot hold as it is: ``str()`` names the column and why, no value."""

    def __init__(self, column: str, reason: str) -> None:
        super().__init__(column, reason)
        self.column = column
        self.reason = reason

    def __str__(self) -> str:
        return f"column {self.column!r}: {self.reason}"


def plain(arr: pa.Array) -> pa.Array:
    """``arr`` with a dictionary decoded and an extension type's storage taken."""
    if isinstance(arr.type, pa.ExtensionType):
        arr = arr.storage
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    return arr


def is_text(t: pa.DataType) -> bool:
    """A string type of any width (``string``, ``large_string``, ``string_view``)."""
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t)
                or pa.types.is_string_view(t))


def is_binary(t: pa.DataType) -> bool:
    """A binary type of any width (``binary``, ``large_binary``, ``binary_view``, fixed)."""
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t)
                or pa.types.is_binary_view(t) or pa.types.is_fixed_size_binary(t))


def concat(*parts: pa.Array | str) -> pa.Array:
    """Item ``i`` is the parts' items ``i`` joined (a ``str`` part is the same in each row);
    NULL where any part is NULL. Text parts only."""
    args = [p if isinstance(p, pa.Array) else pa.scalar(p, TEXT) for p in parts]
    return pc.binary_join_element_wise(*args, pa.scalar("", TEXT))


def _nulls_where_invalid(source: pa.Array, values: pa.Array) -> pa.Array:
    """``values`` with NULL wherever ``source`` is NULL."""
    if source.null_count == 0:
        return values
    return pc.if_else(source.is_valid(), values, pa.scalar(None, values.type))


def offsets_of(arr: pa.Array) -> pa.Array:
    """The ``n + 1`` offsets (int64) of a ``large_binary``/``large_string`` array's slice."""
    return pa.Array.from_buffers(pa.int64(), len(arr) + 1, [None, arr.buffers()[1]],
                                 offset=arr.offset)


def hex_text(arr: pa.Array) -> pa.Array:
    """Binary values as lower-case hex digits (for ``UNHEX``); one C call for all bytes."""
    arr = plain(arr).cast(pa.large_binary())
    n = len(arr)
    if n == 0:
        return pa.array([], TEXT)
    offsets = offsets_of(arr)
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    data = arr.buffers()[2]
    digits = memoryview(data)[start:end].hex().encode("ascii") if end > start else b""
    doubled = pc.multiply(pc.subtract(offsets, start), 2)
    out = pa.Array.from_buffers(TEXT, n, [None, doubled.buffers()[1], pa.py_buffer(digits)])
    return _nulls_where_invalid(arr, out)


def _finite(arr: pa.Array, column: str) -> pa.Array:
    """``arr`` as float64 (exactly), refused when it holds a NaN or an infinity."""
    wide = arr.cast(pa.float64())
    bad: Any = pc.any(pc.or_(pc.is_nan(wide), pc.is_inf(wide))).as_py()
    if bad:
        raise ValueRefused(column, "NaN or an infinity: MariaDB has no such values; filter "
                                   "them or map them to NULL in the query")
    return wide


def _finer_than_micros(column: str, what: str) -> ValueRefused:
    return ValueRefused(column, f"a {what} finer than microseconds: MariaDB keeps at most 6 "
                                "fraction digits; truncate it in the query")


def _timestamp_text(arr: pa.Array, column: str) -> pa.Array:
    t = arr.type
    naive = arr.view(pa.timestamp(t.unit)) if t.tz is not None else arr  # the UTC wall time
    try:
        micros = naive.cast(pa.timestamp("us"))
    except pa.ArrowInvalid:
        raise _finer_than_micros(column, "timestamp") from None
    return micros.cast(TEXT)


def _time_text(arr: pa.Array, column: str) -> pa.Array:
    try:
        micros = arr.cast(pa.time64("us"))
    except pa.ArrowInvalid:
        raise _finer_than_micros(column, "time") from None
    return micros.cast(TEXT)


def scalar_text(arr: pa.Array, column: str) -> pa.Array:
    """The text of a column of one value per row (no list, map, struct; binary as is),
    NULLs kept, as a ``large_string`` array (``large_binary`` for binary)."""
    arr = plain(arr)
    t = arr.type
    if pa.types.is_null(t):
        return pa.nulls(len(arr), TEXT)
    if pa.types.is_boolean(t):
        return pc.if_else(arr, pa.scalar("1", TEXT), pa.scalar("0", TEXT))
    if pa.types.is_integer(t) or pa.types.is_decimal(t) or is_text(t):
        return arr.cast(TEXT)
    if pa.types.is_floating(t):
        return _finite(arr, column).cast(TEXT)
    if is_binary(t):
        return arr.cast(pa.large_binary())
    if pa.types.is_date(t):
        return arr.cast(pa.date32()).cast(TEXT)
    if pa.types.is_timestamp(t):
        return _timestamp_text(arr, column)
    if pa.types.is_time(t):
        return _time_text(arr, column)
    raise ValueRefused(column, f"no MariaDB text form for Arrow type {t}")
