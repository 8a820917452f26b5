"""Values in PostgreSQL's binary *receive* format, built with numpy: one Arrow binary array.

pgpq frames a ``large_binary`` column as ``bytea`` (an int32 length, then the bytes), which
is exactly how COPY BINARY frames any value: the server hands those bytes to the column
type's receive function. So a column whose type pgpq has no encoder for (uuid, inet, timetz,
an array whose element OID pgpq would get wrong, ...) is encoded here, value by value into
one binary array, and written through pgpq's binary encoder.

:func:`encode` takes a kind (the element or column type's ``typname``, ``"enum"`` for an
enum, text types as ``"text"``) and an Arrow array; fixed-width kinds are vectorized.
:func:`frame_arrays` builds PostgreSQL arrays (``array_send``'s format: ndim, has-null flag,
element OID, dimension and lower bound, then each element as an int32 length, ``-1`` for
NULL, and its bytes; an empty array is ndim 0) from a list array and its encoded elements.
A value that cannot be encoded raises :class:`ValueRefused`, whose message quotes nothing.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from datetime import time, timedelta, timezone, tzinfo
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["TEXT_KINDS", "ValueRefused", "encode", "frame_arrays", "parse_uuid"]

#: Kinds whose binary format is the value's UTF-8 text.
TEXT_KINDS = frozenset({"text", "varchar", "bpchar", "name", "citext", "json", "enum", "xml"})
_PG_EPOCH_DAYS = 10957  # 2000-01-01 - 1970-01-01
_PG_EPOCH_US = _PG_EPOCH_DAYS * 86_400_000_000
_UUID_RE = re.compile(r"[0-9a-fA-F]{4}(?:-?[0-9a-fA-F]{4}){7}")
_HEX8 = np.full(256, 255, dtype=np.uint8)  # hex digit -> value; 255: not a hex digit
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX8[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX8[_c] = 10 + _i
_HYPHENS = np.array([8, 13, 18, 23])


class ValueRefused(ValueError):
    """A value the column's type does not accept; ``str()`` quotes no value, ``value`` does."""

    def __init__(self, reason: str, value: Any = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.value = value


# ---------------------------------------------------------------- Arrow <-> numpy
def _valid(arr: pa.Array) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=bool)
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, data)`` of a large_binary/large_string array (slices respected)."""
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64)[arr.offset: arr.offset + len(arr) + 1]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.empty(0, np.uint8)
    return offsets, data


def binary(offsets: np.ndarray, data: np.ndarray, valid: np.ndarray) -> pa.Array:
    """A large_binary array from numpy offsets (n + 1), bytes and validity."""
    n = len(valid)
    mask = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(
        pa.large_binary(), n,
        [mask, pa.py_buffer(np.ascontiguousarray(offsets, dtype=np.int64)),
         pa.py_buffer(np.ascontiguousarray(data, dtype=np.uint8))],
        null_count=int(n - valid.sum()))


def _fixed(rows: np.ndarray, valid: np.ndarray) -> pa.Array:
    """``rows`` (n x width bytes) as a binary array; a NULL's bytes are dropped."""
    width = rows.shape[1]
    lengths = valid.astype(np.int64) * width
    offsets = np.zeros(len(valid) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = rows[valid] if not valid.all() else rows
    return binary(offsets, data.reshape(-1), valid)


def _be(values: np.ndarray, dtype: str) -> np.ndarray:
    """``values`` as big-endian bytes, one row per value."""
    out = np.ascontiguousarray(values.astype(dtype))
    return out.view(np.uint8).reshape(len(values), np.dtype(dtype).itemsize)


def _numbers(arr: pa.Array, arrow_type: pa.DataType, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Values cast safely to ``arrow_type`` as big-endian rows, and the validity."""
    cast = arr.cast(arrow_type)
    valid = _valid(cast)
    values = cast.fill_null(0) if cast.null_count else cast
    return _be(values.to_numpy(zero_copy_only=False), dtype), valid


def concat(a: pa.Array, b: pa.Array, valid: np.ndarray) -> pa.Array:
    """Item ``i`` is ``a[i] + b[i]`` (binary arrays of one length), NULL where not ``valid``."""
    a_off, a_data = _parts(a)
    b_off, b_data = _parts(b)
    la, lb = np.diff(a_off), np.diff(b_off)
    offsets = np.zeros(len(la) + 1, dtype=np.int64)
    np.cumsum(la + lb, out=offsets[1:])
    out = np.empty(int(offsets[-1]), dtype=np.uint8)
    for src_off, src, lengths, start in ((a_off, a_data, la, offsets[:-1]),
                                         (b_off, b_data, lb, offsets[:-1] + la)):
        total = int(src_off[-1] - src_off[0])
        if total:
            dest = np.arange(src_off[0], src_off[-1], dtype=np.int64)
            dest += np.repeat(start - src_off[:-1], lengths)
            out[dest] = src[src_off[0]: src_off[-1]]
    return binary(offsets, out, valid)


# ---------------------------------------------------------------- per kind
def parse_uuid(text: str) -> bytes:
    """PostgreSQL's spellings: any case, optional braces, a hyphen after any 4 digits."""
    body = text[1:-1] if text.startswith("{") and text.endswith("}") else text
    if not _UUID_RE.fullmatch(body):
        raise ValueRefused("not a uuid", text)
    return bytes.fromhex(body.replace("-", ""))


def _uuid_rows(chars: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Canonical uuid texts (m x 36 bytes) -> (m x 16 bytes, which rows were canonical)."""
    digits = np.concatenate([chars[:, 0:8], chars[:, 9:13], chars[:, 14:18], chars[:, 19:23],
                             chars[:, 24:36]], axis=1)
    # Two hex digits at once: their native uint16 -> the byte (>= 256: not hex).
    values = np.take(_hex_pairs(), digits.view(np.uint16))
    ok = (chars[:, _HYPHENS] == ord("-")).all(axis=1) & (values < 256).all(axis=1)
    return values.astype(np.uint8), ok


_PAIRS: list[np.ndarray] = []


def _hex_pairs() -> np.ndarray:
    """uint16 of two ASCII bytes (native order) -> their byte value, 256 if not hex."""
    if not _PAIRS:
        first, second = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
        hi, lo = _HEX8[first].astype(np.uint16), _HEX8[second].astype(np.uint16)
        table = np.where((hi < 16) & (lo < 16), hi * 16 + lo, 256).astype(np.uint16)
        pair = np.empty((256, 256, 2), dtype=np.uint8)
        pair[..., 0], pair[..., 1] = first, second
        lut = np.full(65536, 256, dtype=np.uint16)
        lut[pair.reshape(-1, 2).copy().view(np.uint16).ravel()] = table.ravel()
        _PAIRS.append(lut)
    return _PAIRS[0]


def _uuid(arr: pa.Array) -> pa.Array:
    t = arr.type
    if pa.types.is_fixed_size_binary(t) and t.byte_width == 16:
        arr = arr.cast(pa.large_binary())
        t = arr.type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        arr = arr.cast(pa.large_binary())
        offsets, _ = _parts(arr)
        if np.any(np.diff(offsets)[_valid(arr)] != 16):
            raise ValueRefused("a binary uuid must have 16 bytes")
        return arr
    arr = arr.cast(pa.large_string())
    valid = _valid(arr)
    offsets, data = _parts(arr)
    lengths = np.diff(offsets)
    canonical = valid & (lengths == 36)
    if canonical.sum() == int(lengths.sum()) // 36 and not np.any(lengths[~canonical]):
        # Every value is 36 bytes (NULLs 0): the texts are one contiguous m x 36 block.
        chars = data[offsets[0]: offsets[-1]].reshape(-1, 36)
        decoded, ok = _uuid_rows(chars)
        if ok.all() and canonical.all():
            return _fixed(decoded, valid)  # the common case: no copy of the texts
        rows = np.zeros((len(arr), 16), dtype=np.uint8)
        rows[canonical] = decoded
    else:
        rows = np.zeros((len(arr), 16), dtype=np.uint8)
        ok = np.ones(0, dtype=bool)
        if canonical.any():
            chars = data[offsets[:-1][canonical, None] + np.arange(36)]
            decoded, ok = _uuid_rows(chars)
            rows[canonical] = decoded
    canonical[np.flatnonzero(canonical)[~ok]] = False
    for i in np.flatnonzero(valid & ~canonical):  # other spellings (and malformed values)
        rows[i] = np.frombuffer(parse_uuid(arr[int(i)].as_py()), dtype=np.uint8)
    return _fixed(rows, valid)


def _interval(arr: pa.Array) -> pa.Array:
    t = arr.type
    n = len(arr)
    micros = np.zeros(n, dtype=np.int64)
    months = np.zeros(n, dtype=np.int64)
    days = np.zeros(n, dtype=np.int64)
    valid = _valid(arr)
    if pa.types.is_duration(t):
        micros = arr.cast(pa.duration("us")).cast(pa.int64()).fill_null(0).to_numpy()
    elif t == pa.month_day_nano_interval():
        for i, v in enumerate(arr.to_pylist()):
            if v is not None:
                if v.nanoseconds % 1000:
                    raise ValueRefused("an interval has finer than microsecond precision", v)
                months[i], days[i], micros[i] = v.months, v.days, v.nanoseconds // 1000
    else:  # pragma: no cover - the plan admits these sources only
        raise ValueRefused(f"no interval from {t}")
    rows = np.concatenate([_be(micros, ">i8"), _be(days, ">i4"), _be(months, ">i4")], axis=1)
    return _fixed(rows, valid)


#: An ISO 8601 time in the forms Python 3.11's ``time.fromisoformat`` reads (3.10's reads
#: fewer: no fraction of other than 3 or 6 digits, no ``Z``, no ``+HHMM`` nor ``+HH``, no
#: ``HHMMSS``): extended (colons) or basic, a fraction of any length (cut to microseconds),
#: a ``Z`` or an offset.
_ISO_TIME = re.compile(
    r"(?P<h>\d{2})(?:(?P<c>:?)(?P<m>\d{2})(?:(?P=c)(?P<s>\d{2})(?:[.,](?P<f>\d+))?)?)?"
    r"(?P<z>Z|[+-]\d{2}(?::?\d{2}(?::?\d{2}(?:[.,]\d{1,6})?)?)?)?")
_OFFSET = re.compile(r"([+-])(\d{2}):?(\d{2})?:?(\d{2})?(?:[.,](\d{1,6}))?")


def _parse_time(text: str) -> time:
    """``text`` as a time, the same on every supported Python: ``time.fromisoformat``, and
    where it refuses (Python 3.10), :data:`_ISO_TIME`."""
    text = text.strip()
    try:
        return time.fromisoformat(text)
    except ValueError:
        pass
    match = _ISO_TIME.fullmatch(text)
    if match is None:
        raise ValueRefused("not a time", text)
    zone = match["z"]
    tz: tzinfo | None = None
    try:
        if zone == "Z":
            tz = timezone.utc
        elif zone:
            sign, hh, mm, ss, ff = _OFFSET.fullmatch(zone).groups()  # type: ignore[union-attr]
            delta = timedelta(hours=int(hh), minutes=int(mm or 0), seconds=int(ss or 0),
                              microseconds=int((ff or "0").ljust(6, "0")))
            tz = timezone(-delta if sign == "-" else delta)
        return time(int(match["h"]), int(match["m"] or 0), int(match["s"] or 0),
                    int((match["f"] or "0")[:6].ljust(6, "0")), tzinfo=tz)
    except ValueError:  # 25:00, an offset of a day or more
        raise ValueRefused("not a time", text) from None


def _time_of(value: Any, with_zone: bool) -> tuple[int, int]:
    """``(microseconds, seconds west of UTC)`` of a time or a time string."""
    if isinstance(value, str):
        value = _parse_time(value)
    if not isinstance(value, time):
        raise ValueRefused("not a time", value)
    micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 \
        + value.microsecond
    offset = value.utcoffset()
    west = -int(offset.total_seconds()) if offset is not None and with_zone else 0
    return micros, west


def _times(arr: pa.Array, with_zone: bool) -> pa.Array:
    valid = _valid(arr)
    micros = np.zeros(len(arr), dtype=np.int64)
    west = np.zeros(len(arr), dtype=np.int64)
    if pa.types.is_time(arr.type):
        micros = arr.cast(pa.time64("us")).cast(pa.int64()).fill_null(0).to_numpy()
    else:
        for i, v in enumerate(arr.to_pylist()):
            if v is not None:
                micros[i], west[i] = _time_of(v, with_zone)
    rows = _be(micros, ">i8")
    if with_zone:
        rows = np.concatenate([rows, _be(west, ">i4")], axis=1)
    return _fixed(rows, valid)


def inet_bytes(value: str, cidr: bool) -> bytes:
    """``inet``/``cidr`` binary: family (2 IPv4, 3 IPv6), bits, is_cidr, length, address."""
    try:
        if cidr:
            net = ipaddress.ip_network(value.strip(), strict=True)
            address, bits = net.network_address, net.prefixlen
        else:
            iface = ipaddress.ip_interface(value.strip())
            address, bits = iface.ip, iface.network.prefixlen
    except ValueError:
        raise ValueRefused(f"not a{' cidr' if cidr else 'n inet'} value", value) from None
    packed = address.packed
    family = 2 if address.version == 4 else 3
    return bytes([family, bits, int(cidr), len(packed)]) + packed


def _per_value(arr: pa.Array, one: Callable[[Any], bytes]) -> pa.Array:
    values = arr.to_pylist()
    valid = np.array([v is not None for v in values], dtype=bool)
    pieces = [one(v) for v in values if v is not None]
    lengths = np.zeros(len(values), dtype=np.int64)
    lengths[valid] = [len(p) for p in pieces]
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return binary(offsets, np.frombuffer(b"".join(pieces), dtype=np.uint8), valid)


def _numeric(value: Any) -> bytes:
    from psycopg.types.numeric import DecimalBinaryDumper

    return bytes(DecimalBinaryDumper(Decimal).dump(Decimal(value)) or b"")


_FIXED: dict[str, tuple[pa.DataType, str]] = {
    "int2": (pa.int16(), ">i2"), "int4": (pa.int32(), ">i4"), "int8": (pa.int64(), ">i8"),
    "float4": (pa.float32(), ">f4"), "float8": (pa.float64(), ">f8"), "bool": (pa.uint8(), "u1"),
}


def encode(kind: str, arr: pa.Array) -> pa.Array:
    """``arr`` as a large_binary array of ``kind``'s binary values (NULLs kept)."""
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if arr.null_count == len(arr):  # also Spark's array() (Arrow null elements)
        return pa.nulls(len(arr), pa.large_binary())
    if kind in _FIXED:
        arrow_type, dtype = _FIXED[kind]
        source = arr.cast(pa.bool_()) if kind == "bool" else arr
        rows, valid = _numbers(source, arrow_type, dtype)
        return _fixed(rows, valid)
    if kind in TEXT_KINDS or kind == "bytea":
        target = pa.large_binary() if kind == "bytea" else pa.large_string()
        return arr.cast(target).cast(pa.large_binary())
    if kind == "jsonb":  # version 1, then the text
        text = arr.cast(pa.large_string()).cast(pa.large_binary())
        one = pa.array([b"\x01"] * len(arr), pa.large_binary())
        return concat(one, text, _valid(arr))
    if kind == "uuid":
        return _uuid(arr)
    if kind == "date":
        days = arr.cast(pa.date32()).cast(pa.int32())
        return _fixed(*_numbers(pc.subtract(days, _PG_EPOCH_DAYS), pa.int32(), ">i4"))
    if kind in ("timestamp", "timestamptz"):
        target = pa.timestamp("us", tz="UTC" if kind == "timestamptz" else None)
        micros = arr.cast(target).cast(pa.int64())
        return _fixed(*_numbers(pc.subtract_checked(micros, _PG_EPOCH_US), pa.int64(), ">i8"))
    if kind in ("time", "timetz"):
        return _times(arr, kind == "timetz")
    if kind == "interval":
        return _interval(arr)
    if kind in ("inet", "cidr"):
        return _per_value(arr.cast(pa.large_string()), lambda v: inet_bytes(v, kind == "cidr"))
    if kind == "numeric":
        return _per_value(arr, _numeric)
    raise ValueRefused(f"no binary encoder for {kind}")


def frame_arrays(lists: pa.Array, encode_elements: Callable[[pa.Array], pa.Array],
                 elem_oid: int) -> pa.Array:
    """PostgreSQL 1-dimensional arrays (lower bound 1), one per item of ``lists`` (a list
    array), their elements encoded by ``encode_elements`` (NULLs kept)."""
    if pa.types.is_fixed_size_list(lists.type):
        size = lists.type.list_size
        offsets = (lists.offset + np.arange(len(lists) + 1, dtype=np.int64)) * size
    else:
        offsets = np.asarray(lists.offsets.to_numpy(), dtype=np.int64)
    base = int(offsets[0])
    offsets = offsets - base
    elements = encode_elements(lists.values.slice(base, int(offsets[-1])))
    n = len(lists)
    ones = np.ones(n, dtype=bool)
    el_valid = _valid(elements)
    # Each element: its int32 length (-1 for NULL), then its bytes.
    e_off, _ = _parts(elements)
    lengths = np.where(el_valid, np.diff(e_off), -1)
    framed = concat(_fixed(_be(lengths, ">i4"), np.ones(len(lengths), bool)), elements,
                    np.ones(len(lengths), bool))
    f_off, f_data = _parts(framed)
    counts = np.diff(offsets)
    null_sum = np.zeros(len(el_valid) + 1, dtype=np.int64)
    np.cumsum(~el_valid, out=null_sum[1:])
    has_null = (null_sum[offsets[1:]] - null_sum[offsets[:-1]]) > 0
    header = np.concatenate([
        _be((counts > 0).astype(np.int64), ">i4"), _be(has_null.astype(np.int64), ">i4"),
        _be(np.full(n, elem_oid, dtype=np.int64), ">i4"),
        _be(counts, ">i4"), _be(np.ones(n, dtype=np.int64), ">i4")], axis=1)
    h_len = np.where(counts > 0, 20, 12)  # an empty array: ndim 0, no dimension
    h_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(h_len, out=h_off[1:])
    keep = np.arange(20)[None, :] < h_len[:, None]
    headers = binary(h_off, header[keep], ones)
    bodies = binary(f_off[offsets] - f_off[0], f_data[f_off[0]:], ones)
    return concat(headers, bodies, _valid(lists))
