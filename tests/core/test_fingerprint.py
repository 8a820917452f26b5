"""Order-independent fingerprints: independent of order, splitting and slicing; sensitive
to every value, every duplicate and the difference between null, "" and "null"."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import random
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from connectors.core.fingerprint import (
    ROW_HASH_COLUMN,
    Fingerprint,
    fingerprint_batch,
    fingerprint_batches,
    split_row_hash,
)

MASK = (1 << 64) - 1
UTC = dt.timezone.utc


def fp_of(values: list[Any], type_: pa.DataType | None = None) -> Fingerprint:
    return fingerprint_batch(pa.record_batch({"c": pa.array(values, type_)}))


def rebuilt(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The same rows in fresh buffers (offset 0), through Python values."""
    return pa.RecordBatch.from_pylist(batch.to_pylist(), schema=batch.schema)


# Per type: values (with a null), and a copy with exactly one value changed.
TYPED_CASES: dict[str, tuple[pa.DataType, list[Any], list[Any]]] = {
    "int8": (pa.int8(), [1, -2, None, 127, -128, 5], [1, -2, None, 127, -127, 5]),
    "int16": (pa.int16(), [1, -2, None, 32767, 9, 5], [1, -2, None, 32767, 10, 5]),
    "int32": (pa.int32(), [1, -2, None, 2**31 - 1, 9, 5], [1, -2, None, 2**31 - 1, 9, 6]),
    "int64": (pa.int64(), [1, -2, None, 2**63 - 1, 9, 5], [1, -3, None, 2**63 - 1, 9, 5]),
    "uint8": (pa.uint8(), [1, 2, None, 255, 9, 5], [1, 2, None, 254, 9, 5]),
    "uint16": (pa.uint16(), [1, 2, None, 65535, 9, 5], [0, 2, None, 65535, 9, 5]),
    "uint32": (pa.uint32(), [1, 2, None, 2**32 - 1, 9, 5], [1, 2, None, 2**32 - 2, 9, 5]),
    "uint64": (pa.uint64(), [1, 2, None, 2**64 - 1, 9, 5], [1, 2, None, 2**64 - 1, 9, 4]),
    "float16": (
        pa.float16(),
        [np.float16(1.5), np.float16(-2), None, np.float16(0.25), np.float16(9), np.float16(5)],
        [np.float16(1.5), np.float16(-2), None, np.float16(0.5), np.float16(9), np.float16(5)],
    ),
    "float32": (pa.float32(), [1.5, -2.0, None, 0.25, 9.0, 5.0],
                [1.5, -2.0, None, 0.25, 9.0, 5.5]),
    "float64": (pa.float64(), [1.5, -2.0, None, 1e300, 9.0, 5.0],
                [1.5, 2.0, None, 1e300, 9.0, 5.0]),
    "bool": (pa.bool_(), [True, False, None, True, True, False],
             [True, False, None, False, True, False]),
    "string": (pa.string(), ["a", "bc", None, "", "\u00e9t\u00e9", "x" * 50],
               ["a", "bc", None, "", "\u00e9t\u00e9", "x" * 49 + "y"]),
    "large_string": (pa.large_string(), ["a", "bc", None, "", "d", "e"],
                     ["a", "cb", None, "", "d", "e"]),
    "binary": (pa.binary(), [b"\x00", b"\x00\x00", None, b"", b"\xff", b"ab"],
               [b"\x00", b"\x00\x01", None, b"", b"\xff", b"ab"]),
    "large_binary": (pa.large_binary(), [b"a", b"b", None, b"", b"c", b"d"],
                     [b"a", b"b", None, b"", b"c", b"e"]),
    "fixed_size_binary": (pa.binary(3), [b"abc", b"abd", None, b"\x00\x00\x00", b"zzz", b"q12"],
                          [b"abc", b"abd", None, b"\x00\x00\x01", b"zzz", b"q12"]),
    "timestamp_tz": (
        pa.timestamp("us", tz="UTC"),
        [dt.datetime(2024, 1, 1, tzinfo=UTC), dt.datetime(2024, 1, 2, tzinfo=UTC), None,
         dt.datetime(1970, 1, 1, tzinfo=UTC), dt.datetime(2038, 1, 19, tzinfo=UTC),
         dt.datetime(2024, 1, 1, 0, 0, 0, 1, tzinfo=UTC)],
        [dt.datetime(2024, 1, 1, tzinfo=UTC), dt.datetime(2024, 1, 2, tzinfo=UTC), None,
         dt.datetime(1970, 1, 1, tzinfo=UTC), dt.datetime(2038, 1, 19, tzinfo=UTC),
         dt.datetime(2024, 1, 1, 0, 0, 0, 2, tzinfo=UTC)],
    ),
    "date32": (pa.date32(), [dt.date(2024, 1, 1), dt.date(2000, 2, 29), None,
                             dt.date(1970, 1, 1), dt.date(1, 1, 1), dt.date(9999, 12, 31)],
               [dt.date(2024, 1, 2), dt.date(2000, 2, 29), None,
                dt.date(1970, 1, 1), dt.date(1, 1, 1), dt.date(9999, 12, 31)]),
    "decimal128": (
        pa.decimal128(20, 2),
        [Decimal("1.00"), Decimal("-2.50"), None, Decimal("123456789012345678.99"),
         Decimal("0.01"), Decimal("5.00")],
        [Decimal("1.00"), Decimal("-2.50"), None, Decimal("123456789012345678.98"),
         Decimal("0.01"), Decimal("5.00")],
    ),
    "list": (pa.list_(pa.int64()), [[1, 2], [], None, [3], [4, 5, 6], [None]],
             [[1, 2], [], None, [3], [4, 6, 5], [None]]),
    "list_of_strings": (pa.large_list(pa.string()), [["a", "b"], [], None, [""], ["x", None],
                                                      ["ab", "c"]],
                        [["a", "b"], [], None, [""], ["x", None], ["a", "bc"]]),
    "nested_list": (pa.list_(pa.list_(pa.int32())), [[[1], [2, 3]], [], None, [[]], [None],
                                                      [[4]]],
                    [[[1], [2, 3]], [], None, [[]], [None], [[4], []]]),
    "struct": (
        pa.struct([("a", pa.int64()), ("b", pa.string())]),
        [{"a": 1, "b": "x"}, {"a": 2, "b": None}, None, {"a": None, "b": "y"},
         {"a": 3, "b": ""}, {"a": 4, "b": "z"}],
        [{"a": 1, "b": "x"}, {"a": 2, "b": None}, None, {"a": None, "b": "y"},
         {"a": 3, "b": "null"}, {"a": 4, "b": "z"}],
    ),
}


def _array(name: str, which: int) -> pa.Array:
    type_, values, changed = TYPED_CASES[name]
    return pa.array(values if which == 0 else changed, type_)


def _dictionary_array(values: list[Any]) -> pa.Array:
    return pa.array(values, pa.string()).dictionary_encode()


@pytest.mark.parametrize("name", list(TYPED_CASES))
def test_each_column_type_is_hashed_and_sensitive_to_one_changed_value(name: str) -> None:
    original = pa.record_batch({"c": _array(name, 0)})
    changed = pa.record_batch({"c": _array(name, 1)})
    fp, fp_changed = fingerprint_batch(original), fingerprint_batch(changed)
    assert fp.rows == fp_changed.rows == 6
    assert fp.digest != fp_changed.digest
    assert fp.digest != 0


@pytest.mark.parametrize("name", list(TYPED_CASES))
def test_each_column_type_is_order_independent(name: str) -> None:
    arr = _array(name, 0)
    order = [3, 0, 5, 1, 4, 2]
    shuffled = arr.take(pa.array(order))
    assert fingerprint_batch(pa.record_batch({"c": shuffled})) == fingerprint_batch(
        pa.record_batch({"c": arr})
    )


@pytest.mark.parametrize("name", list(TYPED_CASES))
def test_each_column_type_is_independent_of_slicing_offsets(name: str) -> None:
    batch = pa.record_batch({"c": _array(name, 0), "n": pa.array(range(6), pa.int64())})
    whole = fingerprint_batch(batch)
    for cut in range(7):
        parts = fingerprint_batch(batch.slice(0, cut)) + fingerprint_batch(batch.slice(cut))
        assert parts == whole, cut
    for offset in range(6):
        for length in range(6 - offset + 1):
            sliced = batch.slice(offset, length)
            assert fingerprint_batch(sliced) == fingerprint_batch(rebuilt(sliced)), (offset, length)


@pytest.mark.parametrize("name", list(TYPED_CASES))
def test_sliced_arrays_hash_like_fresh_arrays(name: str) -> None:
    arr = _array(name, 0)
    for offset in range(1, 6):
        sliced = arr.slice(offset)
        fresh = pa.array(sliced.to_pylist(), arr.type)
        assert fingerprint_batch(pa.record_batch({"c": sliced})) == fingerprint_batch(
            pa.record_batch({"c": fresh})
        )


def test_dictionary_encoded_strings_hash_like_their_values() -> None:
    values = ["b", "a", None, "b", "c", "a"]
    plain = fp_of(values, pa.string())
    encoded = fingerprint_batch(pa.record_batch({"c": _dictionary_array(values)}))
    assert encoded == plain
    # A different dictionary order for the same values changes nothing either.
    dictionary = pa.array(["c", "b", "a"])
    indices = pa.array([1, 2, None, 1, 0, 2], pa.int32())
    reordered = pa.DictionaryArray.from_arrays(indices, dictionary)
    assert fingerprint_batch(pa.record_batch({"c": reordered})) == plain


def test_dictionary_encoded_strings_are_sensitive_to_one_changed_value() -> None:
    a = _dictionary_array(["b", "a", None, "b"])
    b = _dictionary_array(["b", "a", None, "c"])
    assert fingerprint_batch(pa.record_batch({"c": a})) != fingerprint_batch(
        pa.record_batch({"c": b})
    )


def test_sliced_dictionary_array_hashes_like_its_values() -> None:
    arr = _dictionary_array(["b", "a", None, "b", "c", "a"]).slice(2, 3)
    assert fingerprint_batch(pa.record_batch({"c": arr})) == fp_of([None, "b", "c"])


def test_string_view_hashes_like_its_values() -> None:
    values = ["x", None, "a longer value than twelve bytes", ""]
    view = pa.array(values, pa.string_view())
    assert fingerprint_batch(pa.record_batch({"c": view})) == fp_of(values, pa.large_string())


def test_null_type_column_is_hashed() -> None:
    fp = fingerprint_batch(pa.record_batch({"c": pa.nulls(3)}))
    assert fp.rows == 3
    assert fp.digest != 0


# --- order, splitting, duplicates --------------------------------------------------------


def _table(n: int, seed: int = 1) -> pa.Table:
    rnd = random.Random(seed)
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "name": pa.array([f"name-{rnd.randrange(1000)}" if i % 7 else None for i in range(n)]),
            "score": pa.array([rnd.random() for _ in range(n)], pa.float64()),
            "flag": pa.array([i % 3 == 0 for i in range(n)]),
        }
    )


def test_row_order_does_not_matter() -> None:
    table = _table(500)
    perm = list(range(500))
    random.Random(7).shuffle(perm)
    assert fingerprint_batch(table.take(pa.array(perm))) == fingerprint_batch(table)


def test_splitting_into_record_batches_does_not_matter() -> None:
    table = _table(1000)
    whole = fingerprint_batch(table.combine_chunks().to_batches()[0])
    for max_chunksize in (7, 64, 999, 1000, 5000):
        assert fingerprint_batches(table.to_batches(max_chunksize=max_chunksize)) == whole
    rnd = random.Random(3)
    cuts = sorted({0, 1000, *(rnd.randrange(1000) for _ in range(20))})
    batch = table.combine_chunks().to_batches()[0]
    pieces = [batch.slice(a, b - a) for a, b in itertools.pairwise(cuts)]
    assert fingerprint_batches(pieces) == whole
    # and however the pieces are then grouped into "tasks"
    total = Fingerprint()
    for task in (pieces[::2], pieces[1::2]):
        total = total + fingerprint_batches(task)
    assert total == whole


def test_table_with_many_chunks_equals_its_batches() -> None:
    table = pa.concat_tables([_table(10, seed=s) for s in range(5)])
    assert table.column(0).num_chunks == 5
    assert fingerprint_batch(table) == fingerprint_batches(table.to_batches())
    assert fingerprint_batch(table).rows == 50


def test_duplicates_change_the_digest() -> None:
    once = fp_of([1, 2])
    twice = fp_of([1, 2, 2])
    assert twice != once
    # Unlike an XOR of row hashes, a row pair does not cancel out.
    assert fp_of([1, 1, 2]).digest != fp_of([2]).digest
    assert fp_of([1, 1]).digest != 0
    assert fp_of([1, 1]).digest == (2 * fp_of([1]).digest) & MASK


def test_null_empty_string_and_the_string_null_differ() -> None:
    digests = {fp_of([v], pa.string()).digest for v in (None, "", "null", "None")}
    assert len(digests) == 4
    assert len({fp_of([v], pa.binary()).digest for v in (None, b"", b"null")}) == 3


def test_null_and_zero_differ_for_numbers_and_bools() -> None:
    assert fp_of([None], pa.int64()) != fp_of([0], pa.int64())
    assert fp_of([None], pa.bool_()) != fp_of([False], pa.bool_())
    assert fp_of([None], pa.float64()) != fp_of([0.0], pa.float64())


def test_values_swapped_between_columns_differ() -> None:
    a = pa.record_batch({"x": [1], "y": [2]})
    b = pa.record_batch({"x": [2], "y": [1]})
    assert fingerprint_batch(a) != fingerprint_batch(b)


def test_string_boundaries_matter() -> None:
    a = pa.record_batch({"x": ["ab"], "y": ["c"]})
    b = pa.record_batch({"x": ["a"], "y": ["bc"]})
    assert fingerprint_batch(a) != fingerprint_batch(b)
    assert fp_of(["ab", "c"]) != fp_of(["a", "bc"])


def test_zero_bytes_count() -> None:
    assert fp_of([b"\x00"], pa.binary()) != fp_of([b"\x00\x00"], pa.binary())
    assert fp_of([b"\x00"], pa.binary()) != fp_of([b""], pa.binary())


def test_empty_batch_is_the_zero_fingerprint() -> None:
    empty = pa.record_batch({"c": pa.array([], pa.string())})
    assert fingerprint_batch(empty) == Fingerprint()
    assert fingerprint_batches([]) == Fingerprint()
    assert fingerprint_batch(pa.table({"c": pa.array([], pa.int64())})) == Fingerprint()


# --- large strings: hashed in chunks -----------------------------------------------------


def _big_strings(n: int, size: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    letters = rng.integers(ord("a"), ord("z") + 1, size=n * size, dtype=np.uint8)
    blob = letters.tobytes().decode()
    return [blob[i * size : (i + 1) * size] for i in range(n)]


@pytest.mark.parametrize("type_", [pa.string(), pa.large_string()], ids=str)
def test_multi_chunk_large_strings_match_the_split_version(type_: pa.DataType) -> None:
    values = _big_strings(300, 15_000)  # 4.5 MB of data: more than one 4 MiB chunk
    arr = pa.array(values, type_)
    assert arr.buffers()[2].size > 4 << 20
    batch = pa.record_batch({"s": arr})
    whole = fingerprint_batch(batch)
    for cut in (137, 299):
        assert fingerprint_batch(batch.slice(0, cut)) + fingerprint_batch(batch.slice(cut)) == whole
    small = [pa.record_batch({"s": pa.array(values[i : i + 25], type_)}) for i in range(0, 300, 25)]
    assert fingerprint_batches(small) == whole
    # Row by row: every value's hash is independent of where the chunking put it.
    one_by_one = Fingerprint()
    for i in range(300):
        one_by_one = one_by_one + fingerprint_batch(batch.slice(i, 1))
    assert one_by_one == whole


def test_multi_chunk_large_strings_are_sensitive_to_one_byte() -> None:
    values = _big_strings(300, 15_000, seed=1)
    changed = list(values)
    middle = changed[150]
    changed[150] = middle[:7_000] + ("b" if middle[7_000] != "b" else "c") + middle[7_001:]
    assert fp_of(values) != fp_of(changed)


def test_one_value_larger_than_a_chunk() -> None:
    huge = "q" * ((4 << 20) + 1)
    values = ["a", huge, "b", None]
    whole = fp_of(values)
    split = fp_of(values[:1]) + fp_of(values[1:2]) + fp_of(values[2:])
    assert whole == split
    assert fp_of(["a", huge[:-1] + "r", "b", None]) != whole


# --- the Fingerprint value ---------------------------------------------------------------


def test_fingerprints_add_rows_and_digests_modulo_2_64() -> None:
    a = Fingerprint(2, 5)
    b = Fingerprint(3, MASK)
    assert a + b == Fingerprint(5, 4)
    assert a + Fingerprint() == a
    assert (a + b) + Fingerprint(1, 1) == a + (b + Fingerprint(1, 1))
    assert sum([a, b], Fingerprint()) == a + b


def test_fingerprint_json_round_trip() -> None:
    for fp in (Fingerprint(), Fingerprint(1, 1), Fingerprint(10**12, MASK), fp_of([1, 2, 3])):
        data = json.loads(json.dumps(fp.to_json()))
        assert Fingerprint.from_json(data) == fp
    assert Fingerprint(3, 255).to_json() == {"rows": 3, "digest": "00000000000000ff"}


def test_fingerprint_hex_and_str() -> None:
    fp = Fingerprint(3, 0xABC)
    assert fp.hex == "0000000000000abc"
    assert str(fp) == "3 rows, digest 0000000000000abc"


def test_fingerprint_is_immutable_and_hashable() -> None:
    fp = Fingerprint(1, 2)
    with pytest.raises(AttributeError):
        fp.rows = 3  # type: ignore[misc]
    assert {fp, Fingerprint(1, 2)} == {fp}


# ----------------------------------------------------------- the engine's row-hash column


def _with_hashes(batch: pa.RecordBatch, hashes: list[int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [*batch.columns, pa.array(hashes, pa.int64())],
        schema=batch.schema.append(pa.field(ROW_HASH_COLUMN, pa.int64())),
    )


def test_a_batch_with_the_row_hash_column_sums_it_modulo_2_64() -> None:
    data = pa.record_batch({"a": [1, 2, 3]})
    hashes = [-1, 2**63 - 1, 5]  # signed longs, as the JVM's xxhash64 gives them
    fp = fingerprint_batch(_with_hashes(data, hashes))
    assert fp == Fingerprint(3, sum(h % 2**64 for h in hashes) % 2**64)


def test_split_row_hash_strips_the_column_and_keeps_everything_else() -> None:
    data = pa.record_batch({"a": [1, 2], "b": ["x", None]})
    data = data.replace_schema_metadata({b"k": b"v"})
    fp, stripped = split_row_hash(_with_hashes(data, [7, 8]))
    assert fp == Fingerprint(2, 15)
    assert stripped.equals(data) and stripped.schema.metadata == {b"k": b"v"}
    # Without the column: hashed here, returned unchanged.
    fp2, same = split_row_hash(data)
    assert same is data and fp2 == fingerprint_batch(data)


def test_the_row_hash_column_counts_only_as_the_last_column() -> None:
    data = pa.record_batch({ROW_HASH_COLUMN: [1, 2], "a": [1, 2]})
    fp, same = split_row_hash(data)
    assert same is data and fp == fingerprint_batch(data) and fp.digest != 3


def test_list_hashes_are_vectorized_and_tell_moved_elements_apart() -> None:
    rows = [[1, 2], [3]], [[1], [2, 3]], [[2, 1], [3]]
    digests = {fingerprint_batch(pa.record_batch({"c": pa.array(r, pa.list_(pa.int64()))}))
               for r in rows}
    assert len(digests) == 3
    big = pa.array([[i, i + 1, None] for i in range(200_000)], pa.list_(pa.int32()))
    whole = fingerprint_batch(pa.record_batch({"c": big}))  # hashed in row slices
    assert whole == fingerprint_batch(pa.record_batch({"c": big.slice(0, 77)})) + \
        fingerprint_batch(pa.record_batch({"c": big.slice(77)}))

