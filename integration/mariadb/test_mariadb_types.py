"""MariaDBSink writes DECIMAL, DATETIME(6) and TIMESTAMP(6) (time zones as docs/mariadb.md
states), JSON from strings, arrays, maps and structs, BLOB, VARBINARY, UUID and the plain
types from a real Spark DataFrame into a real MariaDB (issue 54, item 3).

Each case writes with the sink (``append``: ``LOAD DATA LOCAL`` into the table; ``upsert``:
into the staging table, then ``INSERT ... SELECT ... ON DUPLICATE KEY UPDATE``) and reads
every value back with PyMySQL: extremes, escapes (tab, newline, backslash, ``\\N``), bytes
that are no UTF-8, NULLs. A value the column refuses (a string that is no UUID, one that is
no JSON document) fails the batch with a ``BadInputError`` naming the column, not the value;
nothing is committed or left prepared, and the same batch id with the input fixed then
writes every row exactly once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import pytest

from integration.mariadb.test_mariadb_kill import Target

pytestmark = pytest.mark.integration

U1 = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
U_MAX = "ffffffff-ffff-ffff-ffff-ffffffffffff"
UTC = timezone.utc
TS = datetime(2026, 11, 27, 12, 30, 45, 123456, tzinfo=UTC)
EPOCH_1 = datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)  # TIMESTAMP's first second
TRICKY = "héllo 😀 \t tab \n newline \\ backslash \\N not null"

COLUMNS = [  # (name, Spark type, the table's type, JSON?)
    ("id", "BIGINT", "BIGINT PRIMARY KEY", False),
    ("d", "DECIMAL(38,10)", "DECIMAL(38,10)", False),
    ("dt", "TIMESTAMP", "DATETIME(6)", False),
    ("ts", "TIMESTAMP", "TIMESTAMP(6) NULL", False),
    ("ntz", "TIMESTAMP_NTZ", "DATETIME(6)", False),
    ("j", "STRING", "JSON", True),
    ("b", "BINARY", "BLOB", False),
    ("vb", "BINARY", "VARBINARY(64)", False),
    ("u", "STRING", "UUID", False),
    ("arr", "ARRAY<INT>", "JSON", True),
    ("m", "MAP<STRING,INT>", "JSON", True),
    ("st", "STRUCT<x: INT, y: STRING>", "JSON", True),
    ("s", "STRING", "VARCHAR(100)", False),
    ("bo", "BOOLEAN", "BOOLEAN", False),
    ("f", "FLOAT", "FLOAT", False),
    ("dbl", "DOUBLE", "DOUBLE", False),
    ("dte", "DATE", "DATE", False),
    ("ti", "TINYINT", "TINYINT", False),
    ("sm", "SMALLINT", "SMALLINT", False),
]
SCHEMA = ", ".join(f"{n} {t}" for n, t, _, _ in COLUMNS)
DDL = ", ".join(f"`{n}` {t}" for n, _, t, _ in COLUMNS)
NAMES = [n for n, *_ in COLUMNS]


def rows() -> list[tuple[Any, ...]]:
    """Three rows: extremes and escapes, empty values, all NULL."""
    return [
        (1, Decimal("1234567890123456789012345678.0123456789"), TS, TS,
         datetime(9999, 12, 31, 23, 59, 59, 999999), '{"a": [1, "x\\ty"], "b": null}',
         bytes(range(256)), b"\x00\xff\t\n\\N", U1, [1, None, -2**31], {"k": 1, "q": None},
         (7, 'z\t"q'), TRICKY, True, 1.5, -1.7976931348623157e308, date(1000, 1, 1), -128,
         32767),
        (2, Decimal("-0.0000000001"), datetime(1000, 1, 1, tzinfo=UTC), EPOCH_1,
         datetime(2000, 2, 29, 0, 0), "[]", b"", b"", U_MAX, [], {}, (None, None), "", False,
         0.0, 5e-324, date(9999, 12, 31), 127, -32768),
        (3, *([None] * (len(COLUMNS) - 1))),
    ]


def naive_utc(value: datetime) -> datetime:
    """A timestamp as the table holds it: its UTC wall time (the session's time zone)."""
    return value.astimezone(UTC).replace(tzinfo=None)


def expected() -> list[tuple[Any, ...]]:
    """What PyMySQL reads back: JSON columns parsed, timestamps as UTC wall times,
    booleans as 0/1."""
    return [
        (1, Decimal("1234567890123456789012345678.0123456789"), naive_utc(TS), naive_utc(TS),
         datetime(9999, 12, 31, 23, 59, 59, 999999), {"a": [1, "x\ty"], "b": None},
         bytes(range(256)), b"\x00\xff\t\n\\N", U1, [1, None, -2**31], {"k": 1, "q": None},
         {"x": 7, "y": 'z\t"q'}, TRICKY, 1, 1.5, -1.7976931348623157e308, date(1000, 1, 1),
         -128, 32767),
        (2, Decimal("-0.0000000001"), datetime(1000, 1, 1), naive_utc(EPOCH_1),
         datetime(2000, 2, 29), [], b"", b"", U_MAX, [], {}, {"x": None, "y": None}, "", 0,
         0.0, 5e-324, date(9999, 12, 31), 127, -32768),
        (3, *([None] * (len(COLUMNS) - 1))),
    ]


@pytest.fixture
def target(mariadb_url: str) -> Iterator[Target]:
    t = Target(mariadb_url)
    t.execute(f"DROP TABLE {t.sql()}")
    t.execute(f"CREATE TABLE {t.sql()} ({DDL}) ENGINE=InnoDB")
    yield t
    t.cleanup()


def _write(target: Target, mode: str, df: Any, batch_id: int) -> None:
    from connectors import MariaDBSink

    keys = {"key_columns": ["id"]} if mode == "upsert" else {}
    sink = MariaDBSink(target.url, target.table, sink_id=target.sink_id,
                       ledger_table=target.ledger, mode=mode, **keys)  # type: ignore[arg-type]
    try:
        sink(df, batch_id)
    finally:
        sink.close()


def _read(target: Target) -> list[tuple[Any, ...]]:
    got = target.execute(f"SELECT {', '.join(f'`{n}`' for n in NAMES)} FROM {target.sql()} "
                         "ORDER BY id")
    is_json = [j for *_, j in COLUMNS]
    return [tuple(json.loads(v) if j and v is not None else v
                  for v, j in zip(row, is_json, strict=True)) for row in got]


def _exact(target: Target) -> None:
    got, want = _read(target), expected()
    assert len(got) == len(want), got
    for g, w in zip(got, want, strict=True):
        for name, a, b in zip(NAMES, g, w, strict=True):
            assert a == b and type(a) is type(b), (g[0], name, a, b)
    assert target.ledger_states() == {0: "COMMITTED"} and target.prepared() == []


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_every_type_round_trips_exactly(mode: str, spark: Any, target: Target) -> None:
    df = spark.createDataFrame(rows(), SCHEMA).repartition(2)
    _write(target, mode, df, 0)
    _write(target, mode, df.repartition(3), 0)  # a replay: fingerprints match, nothing written
    _exact(target)


def test_create_table_maps_every_type(spark: Any, target: Target) -> None:
    """``create_table=True``: the table made from the batch's schema (docs/mariadb.md's
    table), then the same values read back (JSON, BLOB and DATETIME(6) columns)."""
    from connectors import MariaDBSink

    target.execute(f"DROP TABLE {target.sql()}")
    df = spark.createDataFrame(rows(), SCHEMA).drop("ts", "vb", "u")
    sink = MariaDBSink(target.url, target.table, sink_id=target.sink_id,
                       ledger_table=target.ledger, create_table=True)
    try:
        sink(df, 0)
    finally:
        sink.close()
    types = dict(target.execute(
        "SELECT column_name, column_type FROM information_schema.columns WHERE "
        "table_schema = DATABASE() AND table_name = %s", (target.table,)))
    assert types["d"] == "decimal(38,10)" and types["dt"] == "datetime(6)", types
    assert types["b"] == "longblob" and types["s"] == "longtext", types
    kept = [n for n in NAMES if n not in ("ts", "vb", "u")]
    got = target.execute(f"SELECT {', '.join(f'`{n}`' for n in kept)} FROM {target.sql()} "
                         "ORDER BY id")
    want = [tuple(v for n, v in zip(NAMES, row, strict=True) if n in kept)
            for row in expected()]
    for g, w in zip(got, want, strict=True):
        for name, a, b in zip(kept, g, w, strict=True):
            if name in ("j", "arr", "m", "st") and a is not None:
                a = json.loads(a)
            assert a == b, (g[0], name, a, b)


@pytest.mark.parametrize(("mode", "column", "bad"), [
    ("append", "u", "not-a-uuid-but-secret-7731"),
    ("append", "j", "{not json, secret-7731"),
    ("upsert", "u", "not-a-uuid-but-secret-7731"),
])
def test_bad_value_fails_the_batch_naming_the_column_then_the_fix_writes_once(
    mode: str, column: str, bad: str, spark: Any, target: Target,
) -> None:
    from connectors.core.errors import BadInputError

    def frame(value: str) -> Any:
        data = [tuple(value if n == column and r[0] == 2 else v
                      for n, v in zip(NAMES, r, strict=True)) for r in rows()]
        return spark.createDataFrame(data, SCHEMA).repartition(2)

    with pytest.raises(BadInputError) as refused:
        _write(target, mode, frame(bad), 0)
    text = str(refused.value)
    assert f"'{column}'" in text or f"`{column}`" in text, text
    assert "secret-7731" not in text, text
    assert target.execute(f"SELECT COUNT(*) FROM {target.sql()}") == [(0,)]
    assert target.prepared() == [] and target.ledger_states().get(0) != "COMMITTED"
    _write(target, mode, frame(rows()[1][NAMES.index(column)]), 0)  # row 2's own value
    _exact(target)
