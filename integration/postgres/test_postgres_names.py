"""Names that bite, against a real PostgreSQL (issue 37): schema, table, column and ledger
names with quotes, spaces, Unicode, upper case and SQL keywords land exactly; a name crafted
to inject SQL injects nothing (the canary table it tries to drop survives, and no table
appears but the ones asked for); the CLI takes the same names and refuses a crafted
``--sink-id`` before any query.

Batches are :class:`~connectors.testing.LocalBatch` (the tasks' Arrow path, no Spark) and one
Spark DataFrame written with ``sink(df, 0)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
from psycopg import sql

from connectors.postgres import PostgresSink
from connectors.testing import LocalBatch
from integration.cli.test_cli_postgres import cli
from integration.support._pg import DRIVER_PGOPTIONS, connect, fresh_database, token

pytestmark = pytest.mark.integration

COLUMNS = ("order", "Größe", "a b", "CamelCase")


@dataclass
class Names:
    """One test's odd names (each with a random token) and the canary an injection would
    drop."""

    conninfo: str
    tok: str

    @property
    def schema(self) -> str:
        return f"My Schema {self.tok}"

    @property
    def table(self) -> tuple[str, str]:
        return (self.schema, f'Täble "x" {self.tok}')

    @property
    def canary(self) -> str:
        return f"canary_{self.tok}"

    @property
    def injection(self) -> str:
        return f'x"; drop table {self.canary}; --'

    @property
    def ledger(self) -> str:  # the SQL-quoted string form, keyword schema
        return f'"select"."Lédger ""{self.tok}"""'

    def execute(self, query: Any, params: Any = None) -> list[tuple[Any, ...]]:
        with connect(self.conninfo) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def tables(self) -> set[tuple[str, str]]:
        """Every table of the server whose schema or name holds the token."""
        return {(s, t) for s, t in self.execute(
            "SELECT schemaname, tablename FROM pg_tables WHERE schemaname LIKE %(p)s "
            "OR tablename LIKE %(p)s", {"p": f"%{self.tok}%"})}

    def rows(self, table: tuple[str, str], columns: tuple[str, ...]) -> list[tuple[Any, ...]]:
        return self.execute(sql.SQL("SELECT {} FROM {} ORDER BY 1").format(
            sql.SQL(", ").join(map(sql.Identifier, columns)), sql.Identifier(*table)))


@pytest.fixture
def names(postgres_conninfo: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Names]:
    monkeypatch.setenv("PGOPTIONS", DRIVER_PGOPTIONS)
    # A database of its own: `status` lists the sinks of every prepared transaction in the
    # database, and the kill tests that run side by side leave theirs in the shared one
    # (CI on 2026-11-29: `status` exited 1 on another test's transaction in doubt).
    tok = token()
    with fresh_database(postgres_conninfo, f"eos_names_db_{tok.lower()}") as own:
        yield from _names(Names(own, tok))


def _names(n: Names) -> Iterator[Names]:
    n.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(n.schema)))
    n.execute('CREATE SCHEMA IF NOT EXISTS "select"')  # shared by every run: never dropped
    n.execute(sql.SQL("CREATE TABLE {} (id int)").format(sql.Identifier(n.canary)))
    try:
        yield n
    finally:
        n.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(n.schema)))
        n.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(n.canary)))
        for schema, table in n.tables():
            n.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(schema, table)))


def psql_tables(conninfo: str) -> list[tuple[str, str]]:
    """The tables of the database ``conninfo`` names, outside PostgreSQL's own schemas."""
    with connect(conninfo) as conn:
        return conn.execute(
            "SELECT schemaname, tablename FROM pg_tables WHERE schemaname NOT IN "
            "('pg_catalog', 'information_schema')").fetchall()


def odd_rows(ids: range, names: Names, *, tag: str = "v") -> pa.Table:
    return pa.table({
        "order": pa.array(list(ids), pa.int64()),
        "Größe": pa.array([f"{tag}-{i}" for i in ids]),
        "a b": pa.array([i * 0.5 for i in ids]),
        "CamelCase": pa.array([i % 7 for i in ids], pa.int32()),
        names.injection: pa.array([f"'; drop table {names.canary}; --{i}" for i in ids]),
    })


def expected(ids: range, names: Names, *, tag: str = "v") -> list[tuple[Any, ...]]:
    return [(i, f"{tag}-{i}", i * 0.5, i % 7, f"'; drop table {names.canary}; --{i}")
            for i in ids]


def test_odd_names_append_exactly_and_inject_nothing(names: Names) -> None:
    before = names.tables()
    assert (("public", names.canary)) in before
    columns = (*COLUMNS, names.injection)
    names.execute(sql.SQL('CREATE TABLE {} ("order" bigint, "Größe" text, "a b" double '
                          'precision, "CamelCase" integer, {} text)').format(
        sql.Identifier(*names.table), sql.Identifier(names.injection)))
    # The string form of the same table (a part with a dot or a quote: SQL-quoted).
    table = '"{}"."{}"'.format(*(p.replace('"', '""') for p in names.table))
    sink = PostgresSink(names.conninfo, table, sink_id=f"Names_{names.tok}-A",
                        ledger_table=names.ledger)
    try:
        sink.write_batch(LocalBatch(odd_rows(range(40), names), partitions=3), 0)
        sink.write_batch(LocalBatch(odd_rows(range(40, 90), names), partitions=2,
                                    fail_first_attempt=[1]), 1)
        sink.write_batch(LocalBatch(odd_rows(range(40, 90), names), partitions=2), 1)  # replay
    finally:
        sink.close()
    assert names.rows(names.table, columns) == expected(range(90), names)
    ledger = ("select", f'Lédger "{names.tok}"')
    assert names.execute(sql.SQL("SELECT batch_id, state FROM {} ORDER BY 1").format(
        sql.Identifier(*ledger))) == [(0, "COMMITTED"), (1, "COMMITTED")]
    made = {names.table} | {(ledger[0], ledger[1] + s)
                            for s in ("", "_aborts", "_bindings", "_receipts")}
    assert names.tables() == before | made  # the canary is still there, nothing else new
    # The CLI reads the same ledger by its string form, and refuses a crafted sink id.
    code, data, err = cli("status", "--postgres", names.conninfo, "--ledger-table",
                          names.ledger)
    assert code == 0, err
    assert [s["sink_id"] for s in data] == [f"Names_{names.tok}-A"]
    assert data[0]["last_committed"] == 1
    code, data, err = cli("status", "--postgres", names.conninfo, "--ledger-table",
                          names.ledger, "--sink-id", f"x'; drop table {names.canary}; --")
    assert code != 0 and "invalid sink_id" in err, (code, data, err)
    # No such ledger: no sinks. In a database of its own: `status` also lists the sinks of
    # every prepared transaction in the database, and other tests run side by side.
    with fresh_database(names.conninfo, f"eos_names_{names.tok.lower()}") as empty:
        code, data, err = cli("status", "--postgres", empty, "--ledger-table",
                              f"public.{names.injection}")
        assert code == 0 and data == [], (code, data, err)
        assert psql_tables(empty) == []
    assert names.tables() == before | made


def test_odd_names_upsert_and_create_table(names: Names) -> None:
    before = names.tables()
    keys = ["order", "Größe"]
    # create_table=True with the injection as the table's name, in the keyword schema.
    table = ("select", f"{names.injection} {names.tok}")
    sink = PostgresSink(names.conninfo, table, sink_id=f"names-{names.tok}-B",
                        mode="upsert", key_columns=keys, create_table=True,
                        ledger_table=("select", f"{names.injection} {names.tok}L"))
    try:
        sink.write_batch(LocalBatch(odd_rows(range(30), names), partitions=2), 0)
        changed = odd_rows(range(20, 40), names).set_column(
            2, "a b", pa.array([-1.0] * 20))
        sink.write_batch(LocalBatch(changed, partitions=3), 1)
    finally:
        sink.close()
    want = expected(range(40), names)
    want = [(*r[:2], -1.0 if r[0] >= 20 else r[2], *r[3:]) for r in want]
    assert names.rows(table, (*COLUMNS, names.injection)) == want
    pk = names.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary "
        "ORDER BY a.attnum", [sql.Identifier(*table).as_string(None)])
    assert [r[0] for r in pk] == keys
    assert ("public", names.canary) in names.tables()
    assert {t for t in names.tables() - before if t[1] != table[1]} == {
        ("select", f"{names.injection} {names.tok}L{s}")
        for s in ("", "_aborts", "_bindings", "_receipts")}


def test_a_spark_dataframe_with_odd_column_names(names: Names, spark: Any) -> None:
    table = (names.schema, "CamelCase Täble")
    df = spark.createDataFrame(
        [(i, f"v-{i}", i * 0.5, i % 7, f"'; drop table {names.canary}; --{i}")
         for i in range(25)],
        f"`order` long, `Größe` string, `a b` double, `CamelCase` int, "
        f"`{names.injection.replace('`', '``')}` string").repartition(2)
    sink = PostgresSink(names.conninfo, table, sink_id=f"names-{names.tok}-C",
                        create_table=True, ledger_table=("select", f"ledger {names.tok}"))
    try:
        sink(df, 0)
    finally:
        sink.close()
    assert names.rows(table, (*COLUMNS, names.injection)) == expected(range(25), names)
    assert ("public", names.canary) in names.tables()
