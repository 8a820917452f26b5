"""PostgresSink writes uuid, arrays, interval, enums, json/jsonb from maps and structs,
inet/cidr, time/timetz, citext and domains from a real Spark DataFrame (issue 38, item 1).

Each case writes with the sink (``append``: binary COPY; ``upsert``: ``INSERT ... SELECT
FROM unnest``) and reads every value back with psycopg: NULLs, empty arrays, NULL
elements, extremes. A malformed uuid and an unknown enum label each fail the batch with a
``BadInputError`` naming the column (not the value), commit nothing and leave no prepared
transaction; the same batch id with the input fixed then writes every row exactly once.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from ipaddress import ip_interface, ip_network
from typing import Any

import pytest

pytestmark = pytest.mark.integration

U_MAX = "ffffffff-ffff-ffff-ffff-ffffffffffff"
U1 = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
#: Spark's schema of the rows below and the table's columns, side by side.
SCHEMA = ", ".join([
    "id BIGINT", "u STRING", "ub BINARY", "ai ARRAY<INT>", "abi ARRAY<BIGINT>",
    "at ARRAY<STRING>", "av ARRAY<STRING>", "au ARRAY<STRING>", "ats ARRAY<TIMESTAMP>",
    "ad ARRAY<DATE>", "an ARRAY<DECIMAL(10,2)>", "ab ARRAY<BOOLEAN>", "af ARRAY<DOUBLE>",
    "iv INTERVAL DAY TO SECOND", "m STRING", "am ARRAY<STRING>", "j MAP<STRING,STRING>",
    "js STRUCT<x: INT, y: STRING>", "ja ARRAY<STRUCT<k: STRING>>", "ip STRING", "cr STRING",
    "tz STRING", "tm STRING", "ct STRING", "dm INT", "adm ARRAY<INT>",
])
DDL = ", ".join([
    "id bigint PRIMARY KEY", "u uuid", "ub uuid", "ai integer[]", "abi bigint[]",
    "at text[]", "av varchar(10)[]", "au uuid[]", "ats timestamptz[]", "ad date[]",
    "an numeric(10,2)[]", "ab boolean[]", "af double precision[]", "iv interval",
    "m {mood}", "am {mood}[]", "j jsonb", "js json", "ja jsonb", "ip inet", "cr cidr",
    "tz timetz", "tm time", "ct citext", "dm {pos}", "adm {pos}[]",
])
#: What psycopg reads back: enum, domain-array and citext columns cast to text (psycopg
#: knows no user types).
READ = ("id, u, ub, ai, abi, at, av, au, ats, ad, an, ab, af, iv, m::text, am::text[], j, js, "
        "ja, ip, cr, tz, tm, ct::text, dm, adm::int[]")
UTC = timezone.utc
TS = datetime(2026, 11, 27, 12, 30, 45, 123456, tzinfo=UTC)


def rows() -> list[tuple[Any, ...]]:
    """Three rows: full values and extremes, NULL elements and empty arrays, all NULL."""
    return [
        (1, U1, uuid.UUID(U_MAX).bytes, [-2**31, None, 2**31 - 1], [-2**63, 2**63 - 1],
         ["a", 'b"c', None, "", "{x,y}"], ["short", None], [U1, None, U_MAX],
         [TS, None], [date(1, 1, 1), date(9999, 12, 31)], [Decimal("12345678.90"), None],
         [True, False, None], [1.5, float("inf"), None], timedelta(days=106751, seconds=5,
                                                                 microseconds=7),
         "happy", ["sad", None, "happy"], {"k": "v", "q": "\"x\""}, (7, "z"),
         [("a",), ("b",)], "2001:db8::5/64", "10.0.0.0/8", "12:34:56.5+02:00",
         "23:59:59.999999", "MiXeD", 5, [1, None, 2]),
        (2, "{A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11}", None, [], [None], [], [None], [], [], [],
         [], [], [], timedelta(microseconds=-1), "sad", [], {}, (None, None), [],
         "192.168.0.1/24", "2001:db8::/32", "00:00:00-05:30", "00:00:00", "", 1, []),
        (3, None, None, None, None, None, None, None, None, None, None, None, None, None, None,
         None, None, None, None, None, None, None, None, None, None, None),
    ]


def expected() -> list[tuple[Any, ...]]:
    tz2 = timezone(timedelta(hours=2))
    tzm = timezone(-timedelta(hours=5, minutes=30))
    return [
        (1, uuid.UUID(U1), uuid.UUID(U_MAX), [-2**31, None, 2**31 - 1], [-2**63, 2**63 - 1],
         ["a", 'b"c', None, "", "{x,y}"], ["short", None], [uuid.UUID(U1), None,
                                                            uuid.UUID(U_MAX)],
         [TS, None], [date(1, 1, 1), date(9999, 12, 31)], [Decimal("12345678.90"), None],
         [True, False, None], [1.5, float("inf"), None],
         timedelta(days=106751, seconds=5, microseconds=7), "happy", ["sad", None, "happy"],
         {"k": "v", "q": "\"x\""}, {"x": 7, "y": "z"}, [{"k": "a"}, {"k": "b"}],
         ip_interface("2001:db8::5/64"), ip_network("10.0.0.0/8"),
         time(12, 34, 56, 500000, tzinfo=tz2), time(23, 59, 59, 999999), "MiXeD", 5,
         [1, None, 2]),
        (2, uuid.UUID(U1), None, [], [None], [], [None], [], [], [], [], [], [],
         timedelta(microseconds=-1), "sad", [], {}, {"x": None, "y": None}, [],
         ip_interface("192.168.0.1/24"), ip_network("2001:db8::/32"), time(0, 0, tzinfo=tzm),
         time(0, 0), "", 1, []),
        (3, *([None] * 25)),
    ]


@pytest.fixture
def pg(postgres_conninfo: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from integration.support._pg import DRIVER_PGOPTIONS, PgTarget

    monkeypatch.setenv("PGOPTIONS", DRIVER_PGOPTIONS)
    target = PgTarget(postgres_conninfo, prefix="types")
    names = {"mood": f"{target.table}_mood", "pos": f"{target.table}_pos"}
    target.execute(f"CREATE TYPE {names['mood']} AS ENUM ('sad', 'ok', 'happy')")
    target.execute(f"CREATE DOMAIN {names['pos']} AS integer CHECK (VALUE > 0)")
    _citext(target)
    target.create_table(DDL.format(**names))
    yield target
    target.cleanup()
    for kind, name in (("TYPE", names["mood"]), ("DOMAIN", names["pos"])):
        target.execute(f"DROP {kind} IF EXISTS {name} CASCADE")


def _citext(target: Any) -> None:
    """``citext`` exists in the database; absent from the server's installation it skips,
    except in CI (Debian's postgresql package ships it)."""
    import psycopg

    if not target.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'citext'"):
        if os.environ.get("CI") == "true":
            pytest.fail("the citext extension is not installed on the test server")
        pytest.skip("the server's PostgreSQL installation has no citext extension")
    # another worker may create it at the same moment
    with contextlib.suppress(psycopg.errors.UniqueViolation):
        target.execute("CREATE EXTENSION IF NOT EXISTS citext")


def _sink(pg: Any, mode: str, **kw: Any) -> Any:
    from connectors.postgres import PostgresSink

    keys = {"key_columns": ["id"]} if mode == "upsert" else {}
    return PostgresSink(pg.conninfo, pg.table, sink_id=pg.sink_id, ledger_table=pg.ledger,
                        mode=mode, **keys, **kw)


def _write(pg: Any, mode: str, df: Any, batch_id: int, **kw: Any) -> None:
    sink = _sink(pg, mode, **kw)
    try:
        sink(df, batch_id)
    finally:
        sink.close()


def _read(pg: Any) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in pg.execute(f'SELECT {READ} FROM "{pg.table}" ORDER BY id')]


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_every_type_round_trips_exactly(mode: str, spark: Any, pg: Any) -> None:
    df = spark.createDataFrame(rows(), SCHEMA).repartition(2)
    _write(pg, mode, df, 0)
    _write(pg, mode, df.repartition(3), 0)  # a replay: fingerprints match, nothing written
    got, want = _read(pg), expected()
    for g, w in zip(got, want, strict=True):
        for name, a, b in zip(READ.split(", "), g, w, strict=True):
            assert a == b, (mode, g[0], name, a, b)
    # Spark day-time intervals stay exact durations: microseconds, 0 days, 0 months.
    assert pg.execute(f'SELECT iv::text FROM "{pg.table}" WHERE id = 1') == [
        ("2562024:00:05.000007",)]
    assert pg.ledger_states() == {0: "COMMITTED"} and not pg.prepared()


@pytest.mark.parametrize(("mode", "column", "bad", "good"), [
    ("append", "u", "not-a-uuid-but-secret-7731", U1),
    ("append", "m", "secret-label-7731", "ok"),
    ("upsert", "u", "not-a-uuid-but-secret-7731", U1),
    ("upsert", "am", "secret-label-7731", "ok"),
])
def test_bad_value_fails_the_batch_naming_the_column_then_the_fix_writes_once(
    mode: str, column: str, bad: str, good: str, spark: Any, pg: Any,
) -> None:
    from connectors.core.errors import BadInputError

    def frame(value: str) -> Any:
        data = [list(r) for r in rows()]
        index = [f.split(" ")[0] for f in SCHEMA.split(", ")].index(column)
        data[1][index] = [value] if column == "am" else value
        return spark.createDataFrame([tuple(r) for r in data], SCHEMA).repartition(2)

    with pytest.raises(BadInputError) as info:
        _write(pg, mode, frame(bad), 0)
    text = str(info.value)
    assert f"column '{column}'" in text and "secret" not in text, text
    assert pg.count() == 0 and 0 not in pg.ledger_states() and not pg.prepared()
    with pytest.raises(BadInputError, match="secret"):  # the value only when asked for
        _write(pg, mode, frame(bad), 0, values_in_errors=True)
    _write(pg, mode, frame(good), 0)
    assert sorted(pg.ids()) == [1, 2, 3] and pg.count() == 3
    assert pg.ledger_states() == {0: "COMMITTED"} and not pg.prepared()


def test_the_issue_table_from_spark_expressions(spark: Any, pg: Any) -> None:
    """uuid(), array<int>, array<string>, INTERVAL '1' DAY and map<string,string>: written."""
    table = f"{pg.table}_issue"
    pg.create_table("id bigint, u uuid, ai integer[], at text[], iv interval, m jsonb",
                    name=table)
    try:
        df = spark.range(4, numPartitions=2).selectExpr(
            "id", "uuid() AS u", "array(CAST(id AS INT), NULL) AS ai",
            "array(CAST(id AS STRING)) AS at", "INTERVAL '1' DAY * id AS iv",
            "map('k', CAST(id AS STRING)) AS m").localCheckpoint()
        made = {r["id"]: r["u"] for r in df.collect()}
        from connectors.postgres import PostgresSink

        sink = PostgresSink(pg.conninfo, table, sink_id=pg.sink_id, ledger_table=pg.ledger)
        sink(df, 0)
        sink.close()
        got = pg.execute(f'SELECT id, u, ai, at, iv, m FROM "{table}" ORDER BY id')
        assert [tuple(r) for r in got] == [
            (i, uuid.UUID(made[i]), [i, None], [str(i)], timedelta(days=i), {"k": str(i)})
            for i in range(4)]
    finally:
        pg.cleanup(table)


def test_create_table_maps_lists_durations_and_maps(spark: Any, pg: Any) -> None:
    from connectors.postgres import PostgresSink

    table = f"{pg.table}_made"
    df = spark.range(2).selectExpr(
        "id", "array(CAST(id AS INT)) AS ai", "array('x') AS at", "INTERVAL '2' HOUR AS iv",
        "map('k', 1) AS m", "named_struct('a', id) AS s")
    try:
        sink = PostgresSink(pg.conninfo, table, sink_id=pg.sink_id, ledger_table=pg.ledger,
                            create_table=True)
        sink(df, 0)
        sink.close()
        types = pg.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = quote_ident(%s)::regclass AND attnum > 0 ORDER BY attnum",
            [table])
        assert dict(types) == {"id": "bigint", "ai": "integer[]", "at": "text[]",
                               "iv": "interval", "m": "jsonb", "s": "jsonb"}
        assert pg.execute(f'SELECT ai, at, iv, m, s FROM "{table}" WHERE id = 1') == [
            ([1], ["x"], timedelta(hours=2), {"k": 1}, {"a": 1})]
    finally:
        pg.cleanup(table)


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_native_arrays_and_a_domain_check(mode: str, spark: Any, pg: Any) -> None:
    """The arrays pgpq encodes itself (its element OID is the column's) that the round trip
    above does not cover; a domain's CHECK refusing a value is a BadInputError."""
    from connectors.core.errors import BadInputError

    table = f"{pg.table}_native"
    pos = f"{pg.table}_pos"
    pg.execute(f"CREATE DOMAIN {pos}2 AS {pos} CHECK (VALUE < 100)")  # a domain's domain
    pg.create_table(f"id bigint PRIMARY KEY, s smallint[], r real[], b bytea[], t timestamp[], "
                    f"d {pos}2", name=table)
    ts = datetime(2026, 1, 2, 3, 4, 5, 6)
    data = [(1, [-32768, None, 32767], [1.5, None], [b"\x00\xff", None, b""], [ts, None], 1),
            (2, [], [], [], [], None)]
    schema = ("id BIGINT, s ARRAY<SMALLINT>, r ARRAY<FLOAT>, b ARRAY<BINARY>, "
              "t ARRAY<TIMESTAMP_NTZ>, d INT")
    try:
        from connectors.postgres import PostgresSink

        keys = {"key_columns": ["id"]} if mode == "upsert" else {}
        sink = PostgresSink(pg.conninfo, table, sink_id=pg.sink_id, ledger_table=pg.ledger,
                            mode=mode, **keys)
        with pytest.raises(BadInputError, match="constraint"):
            sink(spark.createDataFrame([*data, (3, [], [], [], [], 0)], schema), 0)
        assert pg.count(table) == 0 and not pg.prepared()
        sink(spark.createDataFrame(data, schema), 0)
        # The same batch again, otherwise partitioned: the tasks hashed the arrays with
        # numpy (a flat schema) and the replay's fingerprint matches; nothing is written.
        sink(spark.createDataFrame(data, schema).repartition(3), 0)
        sink.close()
        got = pg.execute(f'SELECT id, s, r, b, t, d FROM "{table}" ORDER BY id')
        assert [tuple(r) for r in got] == [(*r,) for r in data]
    finally:
        pg.cleanup(table)
        pg.execute(f"DROP DOMAIN IF EXISTS {pos}2")
