"""The LOAD DATA encoder (connectors/mariadb/_encode.py, _text.py, _json.py), without a
server: every type's text, NULLs, escapes, unicode, empty batches, the statement. The
server's side of the round trip is ``benchmarks/mariadb_load.py --smoke``."""

from __future__ import annotations

import datetime as dt
import json
import math
import pickle
import random
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from connectors.mariadb._config import quote
from connectors.mariadb._encode import LoadPlan, qualified_name
from connectors.mariadb._json import json_text
from connectors.mariadb._text import ValueRefused, hex_text, scalar_text

_UNESCAPE = {b"\\": b"\\", b"t": b"\t", b"n": b"\n", b"r": b"\r", b"0": b"\x00"}


def unload(data: bytes) -> list[list[bytes | None]]:
    """The file read back as MariaDB reads it: rows of fields, ``\\N`` as None."""
    assert data == b"" or data.endswith(b"\n")
    rows = []
    for line in data.split(b"\n")[:-1]:
        fields: list[bytes | None] = []
        for raw in line.split(b"\t"):
            if raw == b"\\N":
                fields.append(None)
                continue
            out, i = bytearray(), 0
            while i < len(raw):
                if raw[i:i + 1] == b"\\":
                    out += _UNESCAPE[raw[i + 1:i + 2]]  # only the five escapes are written
                    i += 2
                else:
                    out += raw[i:i + 1]
                    i += 1
            fields.append(bytes(out))
        rows.append(fields)
    return rows


def load_text(batch: pa.RecordBatch | pa.Table, binary: Any = "hex") -> list[list[Any]]:
    plan = LoadPlan.for_schema(batch.schema, binary=binary)
    return [[None if f is None else f.decode("utf-8", "surrogateescape") for f in row]
            for row in unload(bytes(plan.encode(batch)))]


def column(values: list[Any], typ: pa.DataType | None = None, **kw: Any) -> list[Any]:
    """One column's fields as text, through the whole file."""
    rows = load_text(pa.table({"c": pa.array(values, typ)}), **kw)
    return [r[0] for r in rows]


@pytest.mark.parametrize("typ", [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(),
                                 pa.uint16(), pa.uint32(), pa.uint64()])
def test_integers_of_every_width_are_their_digits_up_to_the_extremes(typ: pa.DataType) -> None:
    bits = typ.bit_width
    signed = pa.types.is_signed_integer(typ)
    info = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    assert column([info[0], None, info[1], 0], typ) == [str(info[0]), None, str(info[1]), "0"]


def test_doubles_read_back_exactly() -> None:
    rng = random.Random(54)
    values = [0.1, 1 / 3, 1e300, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308,
              -1e-7, 123456789.12345679, 0.0]
    values += [rng.uniform(-1e6, 1e6) for _ in range(200)]
    values += [math.ldexp(rng.random(), rng.randint(-1000, 1000)) for _ in range(200)]
    texts = column(values, pa.float64())
    assert [float(t) for t in texts] == values


def test_float32_is_widened_exactly_so_both_float_and_double_columns_read_it_back() -> None:
    texts = column([0.1, 3.4028234663852886e38, None], pa.float32())
    assert texts[0] == "0.10000000149011612"  # the float32 value itself, as a double
    assert float(texts[1]) == 3.4028234663852886e38 and texts[2] is None


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinities_are_refused_naming_the_column_not_the_value(bad: float) -> None:
    batch = pa.table({"amount": [1.0, bad]})
    with pytest.raises(ValueRefused) as caught:
        LoadPlan.for_schema(batch.schema).encode(batch)
    assert caught.value.column == "amount" and "NaN or an infinity" in str(caught.value)
    assert pickle.loads(pickle.dumps(caught.value)).column == "amount"


def test_decimals_are_exact_text() -> None:
    values = [Decimal("-1234567890123456789012345678.0123456789"), Decimal("0.0000000001"),
              None, Decimal("1.5")]
    texts = column(values, pa.decimal128(38, 10))
    # Arrow writes a small exponent in scientific notation (1E-10): MariaDB reads it exactly
    # (benchmarks/mariadb_load.py --smoke loads 0.0000000001 into DECIMAL(38,10))
    assert texts == ["-1234567890123456789012345678.0123456789", "1E-10", None,
                     "1.5000000000"]
    assert [Decimal(t) if t else None for t in texts] == values
    assert column([Decimal("1e40")], pa.decimal256(50, 0)) == ["1" + "0" * 40]


def test_booleans_are_one_and_zero() -> None:
    assert column([True, False, None], pa.bool_()) == ["1", "0", None]


TRICKY = ["tab\there", "new\nline", "cr\rhere", "back\\slash", "\\N", "nul\x00byte",
          "\\t not a tab", "", "ünïcødé 😀 中文", "\\\\N\t\n"]


@pytest.mark.parametrize("typ", [pa.string(), pa.large_string(), pa.string_view()])
def test_strings_escape_tab_newline_cr_backslash_and_nul(typ: pa.DataType) -> None:
    assert column([*TRICKY, None], typ) == [*TRICKY, None]
    raw = bytes(LoadPlan.for_schema(pa.schema([("c", typ)])).encode(
        pa.table({"c": pa.array(["a\tb\\N\n\x00"], typ)})))
    assert raw == b"a\\tb\\\\N\\n\\0\n"


def test_random_text_survives_the_file() -> None:
    rng = random.Random(7)
    alphabet = "ab\t\n\r\\N\x00é😀 "
    values = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
              for _ in range(500)]
    assert column(values, pa.string()) == values


def test_binary_as_hex_loads_through_unhex() -> None:
    values = [b"\x00\t\n\r\\\xff", b"", None, b"\\N"]
    assert column(values, pa.binary(), binary="hex") == ["00090a0d5cff", "", None, "5c4e"]
    plan = LoadPlan.for_schema(pa.schema([("k", pa.int32()), ("b", pa.binary())]),
                               binary="hex")
    assert plan.statement("t", "/p").endswith("(`k`, @eos_hex1) SET `b` = UNHEX(@eos_hex1)")


@pytest.mark.parametrize("typ", [pa.binary(), pa.large_binary(), pa.binary(2),
                                 pa.binary_view()])
def test_binary_as_escaped_bytes_by_default(typ: pa.DataType) -> None:
    values = [b"\xff\t", b"\x00\\", None]
    for plan in (LoadPlan.for_schema(pa.schema([("b", typ)])),  # the default
                 LoadPlan.for_schema(pa.schema([("b", typ)]), binary="bytes")):
        rows = unload(bytes(plan.encode(pa.table({"b": pa.array(values, typ)}))))
        assert [r[0] for r in rows] == values
        assert "UNHEX" not in plan.statement("t", "/p")


def test_hex_of_a_sliced_array_starts_at_the_slice() -> None:
    arr = pa.array([b"ab", None, b"\x01"]).slice(1)
    assert hex_text(arr).to_pylist() == [None, "01"]


def test_dates_times_and_naive_timestamps_are_written_as_given() -> None:
    assert column([dt.date(1000, 1, 1), dt.date(9999, 12, 31), None], pa.date32()) == [
        "1000-01-01", "9999-12-31", None]
    assert column([dt.date(2024, 2, 29)], pa.date64()) == ["2024-02-29"]
    ts = [dt.datetime(2024, 2, 29, 12, 0, 0, 1), dt.datetime(1000, 1, 1), None]
    assert column(ts, pa.timestamp("us")) == [
        "2024-02-29 12:00:00.000001", "1000-01-01 00:00:00.000000", None]
    assert column(ts[:1], pa.timestamp("ns")) == ["2024-02-29 12:00:00.000001"]
    assert column(ts[:1], pa.timestamp("ms")) == ["2024-02-29 12:00:00.000000"]
    assert column([dt.datetime(2024, 1, 2, 3, 4, 5)], pa.timestamp("s")) == [
        "2024-01-02 03:04:05.000000"]
    assert column([dt.time(23, 59, 59, 999999), None], pa.time64("us")) == [
        "23:59:59.999999", None]
    assert column([dt.time(1, 2, 3)], pa.time32("s")) == ["01:02:03.000000"]


def test_a_timestamp_with_a_zone_is_written_as_its_utc_wall_time() -> None:
    ist = dt.timezone(dt.timedelta(hours=5, minutes=30))
    values = [dt.datetime(2024, 3, 10, 5, 30, tzinfo=ist)]
    for zone in ("Asia/Kolkata", "UTC", "+05:30"):
        assert column(values, pa.timestamp("us", tz=zone)) == ["2024-03-10 00:00:00.000000"]


def test_nanoseconds_are_refused_rather_than_cut() -> None:
    batch = pa.table({"ts": pa.array([1_000_000_001], pa.timestamp("ns"))})
    with pytest.raises(ValueRefused, match="finer than microseconds"):
        LoadPlan.for_schema(batch.schema).encode(batch)
    times = pa.table({"t": pa.array([1_001], pa.time64("ns"))})
    with pytest.raises(ValueRefused, match="finer than microseconds"):
        LoadPlan.for_schema(times.schema).encode(times)


def test_lists_structs_and_maps_are_json_text() -> None:
    struct = pa.struct([("a", pa.string()), ("b", pa.list_(pa.float64())), ("c", pa.bool_()),
                        ("d", pa.date32()), ("e", pa.binary())])
    rows = [{"a": 'q " b \\ n \n c \x01 \t', "b": [1.5, None], "c": False,
             "d": dt.date(2024, 1, 2), "e": b"\x01"},
            {"a": None, "b": [], "c": True, "d": None, "e": None}, None]
    texts = column(rows, struct)
    assert [json.loads(t) if t else t for t in texts] == [
        {"a": 'q " b \\ n \n c \x01 \t', "b": [1.5, None], "c": False, "d": "2024-01-02",
         "e": "01"},
        {"a": None, "b": [], "c": True, "d": None, "e": None}, None]
    lists = column([[1, None], [], None, [3]], pa.list_(pa.int64()))
    assert lists == ["[1,null]", "[]", None, "[3]"]
    maps = column([[("k\"1", 1), ("ü", None)], [], None], pa.map_(pa.string(), pa.int32()))
    assert [json.loads(m) if m else m for m in maps] == [{"k\"1": 1, "ü": None}, {}, None]
    nested = column([[[1, 2], [None]], [None]], pa.large_list(pa.list_(pa.int8())))
    assert nested == ["[[1,2],[null]]", "[null]"]
    fixed = column([[1.5, 2.0]], pa.list_(pa.float64(), 2))
    assert json.loads(fixed[0]) == [1.5, 2.0]


def test_json_of_a_sliced_list_column_starts_at_the_slice() -> None:
    arr = pa.array([[1], [2, 3], None, [4]]).slice(1, 2)
    assert json_text(arr, "c").to_pylist() == ["[2,3]", None]


def test_json_refuses_nan_too() -> None:
    with pytest.raises(ValueRefused, match="column 'c'"):
        json_text(pa.array([[1.0, float("nan")]]), "c")


def test_dictionaries_and_all_null_columns() -> None:
    assert column(["a\tb", None, "a\tb"], pa.dictionary(pa.int8(), pa.string())) == [
        "a\tb", None, "a\tb"]
    assert column([None, None], pa.null()) == [None, None]


def test_rows_columns_and_nulls_in_the_file() -> None:
    batch = pa.record_batch({"id": [1, 2], "name": ["x", None], "amount": [0.5, None]})
    data = bytes(LoadPlan.for_schema(batch.schema).encode(batch))
    assert data == b"1\tx\t0.5\n2\t\\N\t\\N\n"


def test_an_empty_batch_is_an_empty_file() -> None:
    schema = pa.schema([("id", pa.int64()), ("tags", pa.list_(pa.string()))])
    plan = LoadPlan.for_schema(schema)
    assert bytes(plan.encode(schema.empty_table())) == b""
    assert bytes(plan.encode(pa.RecordBatch.from_pylist([], schema=schema))) == b""


def test_a_table_of_several_chunks_and_a_sliced_batch() -> None:
    batch = pa.record_batch({"id": [1, 2, 3], "s": ["a", "b\n", None]})
    plan = LoadPlan.for_schema(batch.schema)
    table = pa.Table.from_batches([batch, batch.slice(1)])
    assert unload(bytes(plan.encode(table))) == [
        [b"1", b"a"], [b"2", b"b\n"], [b"3", None], [b"2", b"b\n"], [b"3", None]]
    assert unload(bytes(plan.encode(batch.slice(2)))) == [[b"3", None]]


def test_the_plan_refuses_what_it_cannot_write_before_any_data() -> None:
    with pytest.raises(ValueRefused, match=r"column 'd'.*duration"):
        LoadPlan.for_schema(pa.schema([("d", pa.duration("s"))]))
    with pytest.raises(ValueError, match="twice"):
        LoadPlan.for_schema(pa.schema([("a", pa.int8()), ("A", pa.int8())]))
    with pytest.raises(ValueError, match="without columns"):
        LoadPlan.for_schema(pa.schema([]))
    plan = LoadPlan.for_schema(pa.schema([("a", pa.int8())]))
    with pytest.raises(ValueError, match="not the plan's"):
        plan.encode(pa.table({"b": [1]}))


def test_the_statement_quotes_identifiers_and_spells_delimiters_in_hex() -> None:
    plan = LoadPlan.for_schema(pa.schema([("we`ird", pa.int8()), ("b", pa.string())]))
    sql = plan.statement(("db", "t`1"), "/proc/self/fd/9")
    assert sql == (
        "LOAD DATA LOCAL INFILE '/proc/self/fd/9' INTO TABLE `db`.`t``1` CHARACTER SET "
        "utf8mb4\nFIELDS TERMINATED BY X'09' ESCAPED BY X'5C' LINES TERMINATED BY X'0A'\n"
        "(`we``ird`, `b`)")
    assert qualified_name("a.b") == "`a.b`"
    assert quote("ü") == "`ü`"
    for bad_path in ("/tmp/it's", "C:\\x", ""):
        with pytest.raises(ValueError, match="path"):
            plan.statement("t", bad_path)
    with pytest.raises(ValueError):
        quote("")
    with pytest.raises(ValueError):
        qualified_name(("a", "b", "c"))


def test_the_plan_is_picklable_for_the_tasks() -> None:
    plan = LoadPlan.for_schema(pa.schema([("a", pa.int8()), ("b", pa.binary())]), binary="hex")
    assert pickle.loads(pickle.dumps(plan)) == plan


def test_scalar_text_refuses_nested_types() -> None:
    with pytest.raises(ValueRefused, match="no MariaDB text form"):
        scalar_text(pa.array([[1]]), "c")
