"""``benchmarks/mariadb_load.py --smoke``'s checks on a real server, per driver.

* every type of ``connectors.mariadb._encode`` through LOAD DATA LOCAL INFILE (the encoder's
  bytes, from memory), read back and compared value by value: NULLs, escapes (tab, newline,
  carriage return, backslash, the text ``\\N``, NUL), unicode, extremes of every integer,
  floats, DECIMAL(38,10), time zones, JSON of lists, structs and maps; binary both ways
  (hex + ``UNHEX`` and the escaped bytes, bytes that are no UTF-8 included);
* the strict-mode probe (``connectors/mariadb/_strict.py``): each bad value gives the
  warning code written there and the load goes on; the refusal names no value.
"""

from __future__ import annotations

import datetime as dt
import json
import struct
from decimal import Decimal
from typing import Any

import pyarrow as pa

from benchmarks._mariadb_drivers import in_memory_file
from connectors.mariadb._encode import LoadPlan
from connectors.mariadb._strict import parse_warnings, refusal

__all__ = ["STRICT_MODE", "round_trip", "strict_probe"]

STRICT_MODE = ("SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ZERO_DATE,NO_ZERO_IN_DATE,"
               "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION'")
_TRICKY = "tab\there, newline\nthere, cr\r, backslash \\ and \\N, nul \x00 end"
_IST = dt.timezone(dt.timedelta(hours=5, minutes=30))
_STRUCT = pa.struct([("a", pa.string()), ("b", pa.list_(pa.float64())), ("c", pa.bool_())])

#: (name, Arrow type, SQL type, values of rows 0..3: row 3 is all NULL)
COLUMNS: list[tuple[str, pa.DataType, str, list[Any]]] = [
    ("i8", pa.int8(), "TINYINT", [-128, 127, 0]),
    ("i16", pa.int16(), "SMALLINT", [-32768, 32767, 0]),
    ("u32", pa.uint32(), "INT UNSIGNED", [0, 2**32 - 1, 7]),
    ("i64", pa.int64(), "BIGINT", [-(2**63), 2**63 - 1, 0]),
    ("u64", pa.uint64(), "BIGINT UNSIGNED", [0, 2**64 - 1, 1]),
    ("f32", pa.float32(), "FLOAT", [0.1, 3.4028234663852886e38, -1.1754943508222875e-38]),
    ("f64", pa.float64(), "DOUBLE", [0.1, 1.7976931348623157e308, 2.2250738585072014e-308]),
    ("f64b", pa.float64(), "DOUBLE", [-0.0, 1 / 3, 123456789.12345679]),
    ("dec", pa.decimal128(38, 10), "DECIMAL(38,10)",
     [Decimal("-1234567890123456789012345678.0123456789"),
      Decimal("9999999999999999999999999999.9999999999"), Decimal("0.0000000001")]),
    ("b", pa.bool_(), "BOOLEAN", [True, False, True]),
    ("s", pa.string(), "VARCHAR(200)", [_TRICKY, "ünïcødé 😀 中文", ""]),
    ("t", pa.large_string(), "TEXT", ["\\N", "\\", "\t\n\r\x00\\"]),
    ("bin", pa.binary(), "VARBINARY(64)", [b"\x00\t\n\r\\\xff\xfe", b"", b"\\N"]),
    ("d", pa.date32(), "DATE", [dt.date(1000, 1, 1), dt.date(9999, 12, 31),
                                dt.date(2024, 2, 29)]),
    ("ts", pa.timestamp("us"), "DATETIME(6)", [
        dt.datetime(1000, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
        dt.datetime(2024, 2, 29, 12, 0, 0, 1)]),
    ("tsz", pa.timestamp("us", tz="Asia/Kolkata"), "DATETIME(6)", [
        dt.datetime(2024, 3, 10, 5, 30, tzinfo=_IST),
        dt.datetime(2024, 1, 1, 0, 0, 0, 123456, tzinfo=dt.timezone.utc),
        dt.datetime(1970, 1, 1, 5, 29, 59, tzinfo=_IST)]),
    ("tm", pa.time64("us"), "TIME(6)", [dt.time(0), dt.time(23, 59, 59, 999999),
                                        dt.time(12, 0, 0, 1)]),
    ("j", pa.list_(pa.int64()), "JSON", [[1, None, -3], [], [2**63 - 1]]),
    ("js", _STRUCT, "JSON", [{"a": 'quote " backslash \\ newline \n ctl \x01', "b": [1.5, None],
                              "c": False}, {"a": "", "b": [], "c": True},
                             {"a": "😀", "b": [0.1], "c": None}]),
    ("jm", pa.map_(pa.string(), pa.int32()), "JSON", [[('k"1', 1), ("ü", None)], [],
                                                       [("x", 2)]]),
]


def _table() -> pa.Table:
    data = {"k": pa.array([0, 1, 2, 3], pa.int32())}
    for name, typ, _sql, values in COLUMNS:
        data[name] = pa.array([*values, None], typ)
    return pa.table(data)


def _expected(name: str, typ: pa.DataType, value: Any) -> Any:
    if value is None:
        return None
    if pa.types.is_boolean(typ):
        return int(value)
    if pa.types.is_float32(typ):
        return struct.unpack("f", struct.pack("f", value))[0]
    if pa.types.is_timestamp(typ) and typ.tz:
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    if pa.types.is_time(typ):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 10**6 + value.microsecond
    if pa.types.is_map(typ):
        return dict(value)
    return value


def _got(name: str, typ: pa.DataType, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)) and not pa.types.is_binary(typ):
        value = bytes(value).decode()
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, dt.timedelta):
        return (value.days * 86400 + value.seconds) * 10**6 + value.microseconds
    if isinstance(value, dt.time):
        return _expected(name, pa.time64("us"), value)
    if str(typ).startswith(("list", "struct", "map")):
        return json.loads(value)
    if pa.types.is_boolean(typ):
        return int(value)
    return value


def _load(cur: Any, driver: str, plan: LoadPlan, table: str, data: Any) -> list[Any]:
    with in_memory_file(plan.encode(data), driver) as path:
        cur.execute(plan.statement(table, path))
    cur.execute("SHOW WARNINGS")
    return list(cur.fetchall())


def round_trip(conn: Any, driver: str) -> list[str]:
    """Load every type, read it back, compare every value: the differences (none: [])."""
    cur = conn.cursor()
    cur.execute(STRICT_MODE)
    cur.execute("SET time_zone = '+00:00'")
    table = _table()
    name = "eos_smoke_types"
    cols = ", ".join(f"`{n}` {sql}" for n, _t, sql, _v in COLUMNS)
    cur.execute(f"DROP TABLE IF EXISTS {name}")
    cur.execute(f"CREATE TABLE {name} (k INT PRIMARY KEY, {cols}) ENGINE=InnoDB")
    problems = []
    for binary in ("hex", "bytes"):
        cur.execute(f"DELETE FROM {name}")
        plan = LoadPlan.for_schema(table.schema, binary=binary)
        warnings = _load(cur, driver, plan, name, table)
        if warnings:
            problems.append(f"{binary}: " + refusal(warnings, plan.names))
        select = ", ".join("CAST(f32 AS DOUBLE)" if n == "f32" else f"`{n}`"
                           for n, *_ in COLUMNS)
        cur.execute(f"SELECT k, {select} FROM {name} ORDER BY k")
        rows = cur.fetchall()
        if len(rows) != table.num_rows:
            problems.append(f"{binary}: {len(rows)} rows read back, {table.num_rows} loaded")
        for row in rows:
            k = row[0]
            for (col, typ, _sql, _v), got in zip(COLUMNS, row[1:], strict=True):
                want = _expected(col, typ, table.column(col)[k].as_py())
                have = _got(col, typ, got)
                # MariaDB keeps no negative zero: -0.0 reads back as 0 (equal, not the same)
                same = have == want and (not isinstance(want, float) or want == 0
                                         or repr(have) == repr(want))
                if not same:
                    problems.append(f"{binary}: row {k} column {col}: "
                                    f"{have!r} != {want!r}")
    cur.execute(f"DROP TABLE {name}")
    return problems


#: (what, batch of (id, name, d, ts), the code the warning must carry)
_BAD = [
    ("text into INT", {"id": ["abc"], "name": ["x"]}, 1366),
    ("11 chars into VARCHAR(5)", {"id": [2], "name": ["abcdefghijk"]}, 1265),
    ("DECIMAL out of range", {"id": [3], "name": ["x"], "d": [123456.5]}, 1264),
    ("DECIMAL rounded", {"id": [4], "name": ["x"], "d": [1.239]}, 1265),
    ("NULL into NOT NULL", {"id": [5], "name": pa.array([None], pa.string())}, 1263),
    ("duplicate key", {"id": [6, 6], "name": ["x", "y"]}, 1062),
    ("impossible DATETIME", {"id": [7], "name": ["x"], "ts": ["2024-13-45 00:00:00"]}, 1265),
]


def strict_probe(conn: Any, driver: str) -> list[tuple[str, str, str]]:
    """Each bad value loaded under the strict sql_mode: (what, outcome, refusal line)."""
    cur = conn.cursor()
    cur.execute(STRICT_MODE)
    name = "eos_smoke_strict"
    cur.execute(f"DROP TABLE IF EXISTS {name}")
    cur.execute(f"CREATE TABLE {name} (id INT PRIMARY KEY, name VARCHAR(5) NOT NULL, "
                "d DECIMAL(5,2), ts DATETIME(6)) ENGINE=InnoDB")
    found = []
    for what, columns, code in _BAD:
        batch = pa.record_batch(columns)
        plan = LoadPlan.for_schema(batch.schema)
        try:
            warnings = _load(cur, driver, plan, name, batch)
        except Exception as exc:  # an error (not a warning) is a finding too
            found.append((what, f"ERROR {type(exc).__name__}", "-"))
            continue
        parsed = parse_warnings(warnings, plan.names)
        codes = ",".join(f"{w.level} {w.code}" for w in parsed) or "no warning"
        ok = "as documented" if [w.code for w in parsed] == [code] else f"EXPECTED {code}"
        line = parsed[0].describe().splitlines()[0] if parsed else "-"
        found.append((what, f"{codes} ({ok})", line))
    cur.execute(f"DROP TABLE {name}")
    return found
