"""The sink's own binary encoders, byte by byte against psycopg's binary dumpers (no server).

psycopg's dumpers write what ``*_send`` writes; the server's ``*_recv`` reads that back.
"""

from __future__ import annotations

import ipaddress
import uuid
from datetime import time, timedelta, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from psycopg import postgres, pq
from psycopg.adapt import Transformer
from psycopg.types.array import ListBinaryDumper

from connectors.core.errors import BadInputError, ConfigurationError
from connectors.postgres._encode import ValueRefused, _parse_time, encode, frame_arrays
from connectors.postgres._pgtypes import PgType
from connectors.postgres._special import (
    ColumnRefused,
    convert_batch,
    plan_special,
)
from connectors.postgres._types import Column, plan_write

BIN = pq.Format.BINARY


def ref(oid: int, value: Any) -> bytes | None:
    """psycopg's binary dump of ``value`` as the type ``oid``."""
    if value is None:
        return None
    cls = postgres.adapters.get_dumper_by_oid(oid, BIN)
    return bytes(cls(type(value)).dump(value) or b"")


def ref_array(elem_oid: int, items: list[Any] | None, as_oid: int | None = None) -> bytes | None:
    """psycopg's binary array of ``items`` dumped as ``elem_oid``, the header naming
    ``as_oid`` (an enum's or a domain's OID) if given."""
    if items is None:
        return None
    example = next((i for i in items if i is not None), "")
    sub: Any = postgres.adapters.get_dumper_by_oid(elem_oid, BIN)(type(example))
    if as_oid is not None:
        sub = _Renamed(sub, as_oid)
    dumper = ListBinaryDumper(list, Transformer())
    dumper.sub_dumper = sub
    return bytes(dumper.dump(items) or b"")


class _Renamed:
    """A dumper whose OID is another type's (psycopg's C dumpers' oid is read-only)."""

    def __init__(self, inner: Any, oid: int) -> None:
        self.inner, self.oid = inner, oid

    def dump(self, value: Any) -> Any:
        return self.inner.dump(value)


def ours(kind: str, values: list[Any], arrow_type: pa.DataType | None = None) -> list[Any]:
    return encode(kind, pa.array(values, arrow_type)).to_pylist()


UUIDS = [uuid.UUID(int=0), uuid.UUID(int=2**128 - 1), uuid.uuid4(), uuid.uuid4()]


class TestScalars:
    def test_uuid_canonical_strings_vectorized_and_other_spellings(self) -> None:
        texts = [str(u) for u in UUIDS] + [None]
        assert ours("uuid", texts) == [ref(2950, u) for u in UUIDS] + [None]
        u = UUIDS[2]
        for spelling in (str(u).upper(), "{" + str(u) + "}", u.hex, u.hex.upper(),
                         "-".join(u.hex[i:i + 4] for i in range(0, 32, 4))):
            assert ours("uuid", [spelling]) == [u.bytes], spelling

    @pytest.mark.parametrize("bad", ["", "not-a-uuid", "0" * 35 + "g", "{" + "0" * 32,
                                     "0" * 8 + "x" + "0" * 27, "0" * 36])
    def test_uuid_malformed_is_refused_without_its_value_in_the_message(self, bad: str) -> None:
        with pytest.raises(ValueRefused) as info:
            encode("uuid", pa.array(["00000000-0000-0000-0000-000000000000", bad]))
        assert bad not in str(info.value) or not bad
        assert info.value.value == bad

    def test_uuid_from_binary(self) -> None:
        raw = [u.bytes for u in UUIDS]
        assert ours("uuid", raw, pa.binary(16)) == raw
        assert ours("uuid", [*raw, None], pa.binary()) == [*raw, None]
        with pytest.raises(ValueRefused, match="16 bytes"):
            encode("uuid", pa.array([b"short"]))

    @pytest.mark.parametrize(("kind", "oid", "values", "arrow_type"), [
        ("int2", 21, [0, -32768, 32767, None], pa.int16()),
        ("int4", 23, [0, -2**31, 2**31 - 1, None], pa.int32()),
        ("int8", 20, [0, -2**63, 2**63 - 1, None], pa.int64()),
        ("float8", 701, [0.0, -1.5, 1e308, float("inf"), None], pa.float64()),
        ("bool", 16, [True, False, None], pa.bool_()),
        ("text", 25, ["", "é", "a\"b", None], pa.string()),
        ("bytea", 17, [b"", b"\x00\xff", None], pa.binary()),
        ("interval", 1186, [timedelta(0), timedelta(microseconds=-1), None], pa.duration("us")),
    ])
    def test_fixed_and_text_kinds(self, kind: str, oid: int, values: list[Any],
                                  arrow_type: pa.DataType) -> None:
        if kind == "interval":  # psycopg splits days; the sink keeps microseconds (0 days)
            expected = [None if v is None else
                        (v // timedelta(microseconds=1)).to_bytes(8, "big", signed=True)
                        + bytes(8) for v in values]
        else:
            expected = [ref(oid, v) for v in values]
        assert ours(kind, values, arrow_type) == expected

    def test_interval_from_month_day_nano(self) -> None:
        arr = pa.array([(14, 2, 5000), None], pa.month_day_nano_interval())
        assert encode("interval", arr).to_pylist() == [
            (5).to_bytes(8, "big") + (2).to_bytes(4, "big") + (14).to_bytes(4, "big"), None]
        with pytest.raises(ValueRefused, match="microsecond"):
            encode("interval", pa.array([(0, 0, 1)], pa.month_day_nano_interval()))

    def test_inet_and_cidr_as_psycopg(self) -> None:
        inets = ["192.168.0.1/24", "10.1.2.3", "::1", "2001:db8::5/64"]
        assert ours("inet", inets) == [ref(869, ipaddress.ip_interface(v)) for v in inets]
        cidrs = ["10.0.0.0/8", "2001:db8::/32", "1.2.3.4/32"]
        assert ours("cidr", cidrs) == [ref(650, ipaddress.ip_network(v)) for v in cidrs]
        with pytest.raises(ValueRefused):
            encode("cidr", pa.array(["10.0.0.1/8"]))  # host bits set: PostgreSQL refuses it
        with pytest.raises(ValueRefused):
            encode("inet", pa.array(["300.1.1.1"]))

    def test_timetz_and_time_from_strings_and_arrow(self) -> None:
        plus2 = timezone(timedelta(hours=2))
        minus530 = timezone(-timedelta(hours=5, minutes=30))
        assert ours("timetz", ["12:34:56.5+02:00", "00:00:00-05:30", None]) == [
            ref(1266, time(12, 34, 56, 500000, tzinfo=plus2)),
            ref(1266, time(0, 0, tzinfo=minus530)), None]
        assert ours("timetz", [time(1, 2, 3)], pa.time64("us")) == [
            ref(1266, time(1, 2, 3, tzinfo=timezone.utc))]
        assert ours("time", ["23:59:59.999999", None]) == [
            ref(1083, time(23, 59, 59, 999999)), None]
        with pytest.raises(ValueRefused):
            encode("time", pa.array(["25:00"]))

    @pytest.mark.parametrize(("text", "want"), [
        ("12:34:56.5+02:00", time(12, 34, 56, 500000, tzinfo=timezone(timedelta(hours=2)))),
        ("12:34:56.1234567", time(12, 34, 56, 123456)),
        ("12:34Z", time(12, 34, tzinfo=timezone.utc)),
        ("12:34:56,5", time(12, 34, 56, 500000)),
        ("12:34:56+0200", time(12, 34, 56, tzinfo=timezone(timedelta(hours=2)))),
        ("12:34:56-02", time(12, 34, 56, tzinfo=timezone(-timedelta(hours=2)))),
        ("1234", time(12, 34)),
        ("123456.25", time(12, 34, 56, 250000)),
        (" 12:34:56.123-05:30:15 ", time(12, 34, 56, 123000,
                                         tzinfo=timezone(-timedelta(hours=5, minutes=30,
                                                                    seconds=15)))),
    ])
    def test_time_strings_read_the_same_on_every_python(self, text: str, want: time) -> None:
        """The forms Python 3.11's ``time.fromisoformat`` reads, read on 3.10 too."""
        assert _parse_time(text) == want

    @pytest.mark.parametrize("text", ["25:00", "12:60", "12:34:56.5 +02:00", "12:3456",
                                      "noon", "12:34:56+24:00", ""])
    def test_what_is_not_a_time_is_refused_on_every_python(self, text: str) -> None:
        with pytest.raises(ValueRefused, match="not a time"):
            _parse_time(text)

    def test_jsonb_is_version_1_then_text(self) -> None:
        assert ours("jsonb", ['{"a":1}', None]) == [b'\x01{"a":1}', None]


class TestArrays:
    @pytest.mark.parametrize(("kind", "elem_oid", "rows", "arrow_type"), [
        ("int4", 23, [[1, None, 3], [], None, [2**31 - 1]], pa.list_(pa.int32())),
        ("int8", 20, [[-1], [None], []], pa.large_list(pa.int64())),
        ("text", 25, [["a", "b\"c", None], [], [""]], pa.list_(pa.string())),
        ("varchar", 1043, [["x"], [None, None]], pa.list_(pa.string())),
        ("uuid", 2950, [[str(UUIDS[2]), None], []], pa.list_(pa.string())),
        ("numeric", 1700, [[Decimal("1.50"), None]], pa.list_(pa.decimal128(10, 2))),
    ])
    def test_arrays_as_psycopg(self, kind: str, elem_oid: int, rows: list[Any],
                               arrow_type: pa.DataType) -> None:
        lists = pa.array(rows, arrow_type)
        got = frame_arrays(lists, lambda v: encode(kind, v), elem_oid).to_pylist()
        py = [None if r is None else [
            uuid.UUID(v) if kind == "uuid" and v is not None else v for v in r] for r in rows]
        assert got == [ref_array(elem_oid, r) for r in py]

    def test_enum_array_carries_the_enum_oid_and_sliced_lists(self) -> None:
        lists = pa.array([["x"], ["sad", None, "ok"], [], ["ok"]], pa.list_(pa.string()))
        got = frame_arrays(lists.slice(1, 2), lambda v: encode("enum", v), 90001).to_pylist()
        assert got == [ref_array(25, ["sad", None, "ok"], 90001), ref_array(25, [], 90001)]


def _pg(name: str, kind: str = "b", **kw: Any) -> PgType:
    return PgType(1, name, kind, **kw)


class TestPlan:
    def test_native_arrays_only_where_pgpq_writes_the_right_oid(self) -> None:
        ints = _pg("_int4", elem=_pg("int4"), elem_oid=23)
        spec = plan_special(ints, "integer[]", pa.list_(pa.int32()), _native)
        assert spec is not None and spec.how == "native"
        tstz = _pg("_timestamptz", elem=_pg("timestamptz"), elem_oid=1184)
        spec = plan_special(tstz, "timestamp with time zone[]",
                            pa.list_(pa.timestamp("us", tz="UTC")), _native)
        assert spec is not None and spec.how == "binary"  # pgpq would write OID 1114
        domain = _pg("_int4", elem=_pg("int4"), elem_oid=77777)  # array of a domain
        spec = plan_special(domain, "pos[]", pa.list_(pa.int32()), _native)
        assert spec is not None and spec.how == "binary" and spec.elem_oid == 77777

    def test_unknown_enum_label_names_the_column_not_the_value(self) -> None:
        mood = Column("m", "mood", "mood", False, False,
                      _pg("mood", "e", labels=("sad", "ok")))
        plan = plan_write("public.t", pa.schema([("m", pa.string())]), [mood])
        batch = pa.record_batch({"m": ["sad", "secret-label"]})
        with pytest.raises(ColumnRefused) as info:
            convert_batch(plan.columns, plan.schema, plan.sql_types, plan.specials, batch,
                          upsert=False)
        assert "'m' (mood)" in str(info.value) and "secret" not in str(info.value)
        assert info.value.value == "secret-label"

    def test_upsert_arrays_travel_as_array_literals(self) -> None:
        ints = Column("a", "_int4", "integer[]", False, False,
                      _pg("_int4", elem=_pg("int4"), elem_oid=23))
        plan = plan_write("public.t", pa.schema([("a", pa.list_(pa.int32()))]), [ints])
        batch = pa.record_batch({"a": pa.array([[1, None], [], None], pa.list_(pa.int32()))})
        out = convert_batch(plan.columns, plan.schema, plan.sql_types, plan.specials, batch,
                            upsert=True)
        assert out.column(0).to_pylist() == ["{1,NULL}", "{}", None]

    def test_unsupported_and_incompatible(self) -> None:
        uid = Column("u", "uuid", "uuid", False, False, _pg("uuid"))
        with pytest.raises(BadInputError, match="incompatible"):
            plan_write("public.t", pa.schema([("u", pa.int64())]), [uid])
        box = Column("b", "box", "box", False, False, _pg("box"))
        with pytest.raises(ConfigurationError, match="cannot write"):
            plan_write("public.t", pa.schema([("b", pa.string())]), [box])


def _native(kind: str, t: pa.DataType) -> pa.DataType | None:
    from connectors.postgres._types import _native as native

    return native(kind, t)


def test_sliced_lists_and_null_typed_elements_in_both_modes() -> None:
    ints = Column("a", "_int4", "integer[]", False, False,
                  _pg("_int4", elem=_pg("int4"), elem_oid=23))
    uids = Column("u", "_uuid", "uuid[]", False, False,
                  _pg("_uuid", elem=_pg("uuid"), elem_oid=2950))
    lists = pa.array([[9], None, [1, None], [], [2]], pa.list_(pa.int32())).slice(1)
    nulls = pa.array([[None], None, [], [None, None], []], pa.list_(pa.null())).slice(1)
    batch = pa.record_batch({"a": lists, "u": nulls})
    plan = plan_write("public.t", batch.schema, [ints, uids])
    text = convert_batch(plan.columns, plan.schema, plan.sql_types, plan.specials, batch,
                         upsert=True)
    assert text.column(0).to_pylist() == [None, "{1,NULL}", "{}", "{2}"]
    assert text.column(1).to_pylist() == [None, "{}", "{NULL,NULL}", "{}"]
    binary = convert_batch(plan.columns, plan.schema, plan.sql_types, plan.specials, batch,
                           upsert=False)
    assert binary.column(1).to_pylist() == [
        None, ref_array(2950, []), ref_array(2950, [None, None]), ref_array(2950, [])]


def test_json_of_maps_and_structs_is_exact() -> None:
    """Maps, structs and lists into json/jsonb: decimals keep every digit (jsonb stores
    numbers as numeric; a float would round 12345678901234567.89), keys of other types
    become strings, bytes base64, times ISO 8601, NULL elements null."""
    import datetime as dt
    import json

    from connectors.postgres._special import _json_text

    t = pa.struct([("price", pa.decimal128(20, 2)), ("tags", pa.map_(pa.int32(), pa.string())),
                   ("raw", pa.binary()), ("at", pa.date32()), ("xs", pa.list_(pa.float64()))])
    arr = pa.array([{"price": Decimal("12345678901234567.89"), "tags": [(1, "a"), (2, None)],
                     "raw": b"\x00\xff", "at": dt.date(2026, 11, 27), "xs": [1.5, None]},
                    None], t)
    text = _json_text(arr).to_pylist()
    assert text[1] is None
    assert text[0] == ('{"price":12345678901234567.89,"tags":{"1":"a","2":null},'
                       '"raw":"AP8=","at":"2026-11-27","xs":[1.5,null]}')
    assert json.loads(text[0], parse_float=Decimal)["price"] == Decimal("12345678901234567.89")
