"""Order-independent fingerprints of Arrow data: a row count and a 64-bit digest.

A replayed micro-batch must hold the same rows as the committed one, but Spark may split
and order them differently (SPARK-28650). The fingerprint therefore hashes each row to 64
bits and *adds* the row hashes modulo 2**64: the sum does not depend on row order nor on
how rows are split into record batches, partitions or tasks, and (unlike XOR) a duplicated
row changes it. Fingerprints of tasks combine with ``+``.

Hashing is vectorised with numpy: fixed-width columns are mixed with splitmix64;
variable-width columns (strings, binary) use a position-normalised polynomial hash over
their data buffer (per-value sums modulo 2**64), so no Python object is made per row; a
list column hashes its elements so (recursively) and combines them per row with the same
position-normalised polynomial. Structs and maps fall back to hashing each value's Python
form, which is slower.

This is a consistency check, not a cryptographic hash: it detects a non-deterministic
replay, it does not resist an adversary.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = [
    "ROW_HASH_COLUMN",
    "Fingerprint",
    "fingerprint_batch",
    "fingerprint_batches",
    "split_row_hash",
    "without_row_hash",
]

#: An engine may append this column to the batches it hands to tasks: each row's 64-bit
#: hash, computed by the engine itself (on Spark: ``xxhash64`` of the row, in the JVM, see
#: :mod:`connectors.spark.frames`). A batch that carries it is fingerprinted by summing
#: that column instead of hashing its rows in Python, and sinks never see the column
#: (:func:`split_row_hash`). Both sides of every comparison come from the same engine.
ROW_HASH_COLUMN = "__connectors_row_hash"

_MASK = (1 << 64) - 1
_U64 = np.uint64
_GOLDEN = _U64(0x9E3779B97F4A7C15)
_M1 = _U64(0xBF58476D1CE4E5B9)
_M2 = _U64(0x94D049BB133111EB)
_NULL_HASH = _U64(0x6A09E667F3BCC909)
_P = 0x100000001B3  # odd, so invertible modulo 2**64
_P_INV = pow(_P, -1, 1 << 64)
#: Largest data buffer hashed in one go; bigger string columns are hashed in row slices so
#: that the temporaries (8 bytes per data byte) stay bounded.
_MAX_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class Fingerprint:
    """Row count and order-independent 64-bit digest of a set of rows.

    Example::

        >>> import pyarrow as pa
        >>> a = fingerprint_batch(pa.record_batch({"x": [1, 2]}))
        >>> b = fingerprint_batch(pa.record_batch({"x": [2, 1]}))
        >>> a == b
        True
    """

    rows: int = 0
    digest: int = 0

    def __add__(self, other: Fingerprint) -> Fingerprint:
        return Fingerprint(self.rows + other.rows, (self.digest + other.digest) & _MASK)

    @property
    def hex(self) -> str:
        """The digest as 16 hex digits."""
        return f"{self.digest:016x}"

    def to_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "digest": self.hex}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fingerprint:
        return cls(int(data["rows"]), int(str(data["digest"]), 16))

    def __str__(self) -> str:
        return f"{self.rows} rows, digest {self.hex}"


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, vectorised (uint64 arithmetic wraps modulo 2**64)."""
    h = h ^ (h >> _U64(30))
    h = h * _M1
    h = h ^ (h >> _U64(27))
    h = h * _M2
    out: np.ndarray = h ^ (h >> _U64(31))
    return out


_powers = np.ones(1, dtype=_U64)
_inverse_powers = np.ones(1, dtype=_U64)


def _power_tables(size: int) -> tuple[np.ndarray, np.ndarray]:
    """``P**k`` and ``P**-k`` modulo 2**64 for ``k < size`` (grown on demand, cached)."""
    global _powers, _inverse_powers
    if len(_powers) < size:
        size = max(size, 2 * len(_powers))
        powers = np.full(size, _P, dtype=_U64)
        powers[0] = 1
        inverse = np.full(size, _P_INV, dtype=_U64)
        inverse[0] = 1
        _powers, _inverse_powers = np.cumprod(powers), np.cumprod(inverse)
    return _powers, _inverse_powers


def _hash_varwidth(arr: pa.Array) -> np.ndarray:
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=_U64)
    buffers = arr.buffers()
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    offsets = np.frombuffer(buffers[1], dtype=np.int64 if large else np.int32)
    offsets = offsets[arr.offset : arr.offset + n + 1].astype(np.int64)
    start, end = int(offsets[0]), int(offsets[-1])
    if end - start > _MAX_CHUNK_BYTES and n > 1:
        half = n // 2
        return np.concatenate([_hash_varwidth(arr.slice(0, half)), _hash_varwidth(arr.slice(half))])
    lengths = np.diff(offsets)
    h = np.zeros(n, dtype=_U64)
    if end > start and buffers[2] is not None:
        powers, inverse = _power_tables(end - start)
        # Polynomial hash of each value: sum of (byte + 1) * P**position over the buffer,
        # summed per value, then multiplied by P**-start so that it does not depend on
        # where the value sits in the buffer (P is odd, so invertible modulo 2**64).
        data = np.frombuffer(buffers[2], dtype=np.uint8)[start:end].astype(_U64)
        data += _U64(1)
        data *= powers[: end - start]
        nonempty = lengths > 0
        starts = np.asarray((offsets[:-1] - start)[nonempty], dtype=np.int64)
        h[nonempty] = np.add.reduceat(data, starts) * inverse[starts]
    return _mix(h ^ _mix(lengths.astype(_U64) + _GOLDEN))


def _hash_fixed(arr: pa.Array) -> np.ndarray:
    n = len(arr)
    width = arr.type.bit_width
    if width == 1:
        values = arr.fill_null(False).to_numpy(zero_copy_only=False).astype(_U64)
        return _mix(values + _GOLDEN)
    nbytes = width // 8
    raw = np.frombuffer(arr.buffers()[1], dtype=np.uint8)
    raw = raw[arr.offset * nbytes : (arr.offset + n) * nbytes]
    if nbytes in (1, 2, 4, 8):
        values = raw.view(f"<u{nbytes}").astype(_U64)
        return _mix(values + _GOLDEN)
    rows = raw.reshape(n, nbytes).astype(_U64)
    powers, _ = _power_tables(nbytes)
    return _mix((rows * powers[:nbytes]).sum(axis=1, dtype=_U64) + _GOLDEN)


def _hash_list(arr: pa.Array) -> np.ndarray:
    """Per row: the polynomial over its elements' hashes (by position), and its length."""
    n = len(arr)
    if pa.types.is_fixed_size_list(arr.type):
        size = arr.type.list_size
        offsets = (arr.offset + np.arange(n + 1, dtype=np.int64)) * size
    else:
        offsets = np.asarray(arr.offsets.to_numpy(), dtype=np.int64)
    start, end = int(offsets[0]), int(offsets[-1])
    if end - start > _MAX_CHUNK_BYTES and n > 1:
        half = n // 2
        return np.concatenate([_hash_list(arr.slice(0, half)), _hash_list(arr.slice(half))])
    lengths = np.diff(offsets)
    h = np.zeros(n, dtype=_U64)
    if end > start:
        powers, inverse = _power_tables(end - start)
        elements = _hash_column(arr.values.slice(start, end - start)) * powers[: end - start]
        nonempty = lengths > 0
        starts = np.asarray((offsets[:-1] - start)[nonempty], dtype=np.int64)
        h[nonempty] = np.add.reduceat(elements, starts) * inverse[starts]
    return _mix(h ^ _mix(lengths.astype(_U64) + _U64(_P)))


def _hash_python(arr: pa.Array) -> np.ndarray:
    out = np.empty(len(arr), dtype=_U64)
    for i, value in enumerate(arr.to_pylist()):
        digest = hashlib.blake2b(repr(value).encode(), digest_size=8).digest()
        out[i] = int.from_bytes(digest, "little")
    return out


def _hash_column(arr: pa.Array) -> np.ndarray:
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        arr = arr.cast(pa.large_binary())
        t = arr.type
    if pa.types.is_null(t):
        h = np.full(len(arr), _NULL_HASH, dtype=_U64)
    elif (
        pa.types.is_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_string(t)
        or pa.types.is_large_binary(t)
    ):
        h = _hash_varwidth(arr)
    elif pa.types.is_primitive(t) or pa.types.is_decimal(t) or pa.types.is_fixed_size_binary(t):
        h = _hash_fixed(arr)
    elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        h = _hash_list(arr)
    else:
        h = _hash_python(arr)
    if arr.null_count:
        nulls = arr.is_null().to_numpy(zero_copy_only=False)
        h = h.copy()
        h[nulls] = _NULL_HASH
    return h


def _has_row_hash(batch: pa.RecordBatch) -> bool:
    names = batch.schema.names
    return bool(names) and names[-1] == ROW_HASH_COLUMN


def _sum_row_hash(batch: pa.RecordBatch) -> Fingerprint:
    n = batch.num_rows
    if n == 0:
        return Fingerprint()
    hashes = batch.column(batch.num_columns - 1).to_numpy(zero_copy_only=False)
    return Fingerprint(n, int(hashes.astype(np.int64).view(_U64).sum(dtype=_U64)))


def without_row_hash(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` without the engine's :data:`ROW_HASH_COLUMN` (unchanged if it has none)."""
    if not _has_row_hash(batch):
        return batch
    index = batch.num_columns - 1
    return pa.RecordBatch.from_arrays(batch.columns[:index], schema=batch.schema.remove(index))


def split_row_hash(batch: pa.RecordBatch) -> tuple[Fingerprint, pa.RecordBatch]:
    """The fingerprint of ``batch`` and its rows as the sink must see them: without the
    engine's :data:`ROW_HASH_COLUMN` if it carries one (then the fingerprint is the sum of
    that column), else unchanged (then the rows are hashed here)."""
    if not _has_row_hash(batch):
        return fingerprint_batch(batch), batch
    return _sum_row_hash(batch), without_row_hash(batch)


def fingerprint_batch(batch: pa.RecordBatch | pa.Table) -> Fingerprint:
    """Fingerprint one record batch (or table); a batch carrying the engine's
    :data:`ROW_HASH_COLUMN` sums that column instead."""
    if isinstance(batch, pa.Table):
        return fingerprint_batches(batch.to_batches())
    if _has_row_hash(batch):
        return _sum_row_hash(batch)
    n = batch.num_rows
    if n == 0:
        return Fingerprint()
    row = np.full(n, _U64(batch.num_columns), dtype=_U64)
    for column in batch.columns:
        row = _mix((row * _U64(_P)) ^ _hash_column(column))
    return Fingerprint(n, int(row.sum(dtype=_U64)))


def fingerprint_batches(batches: Iterable[pa.RecordBatch]) -> Fingerprint:
    """Fingerprint any number of record batches: the same rows give the same result."""
    total = Fingerprint()
    for batch in batches:
        total = total + fingerprint_batch(batch)
    return total
