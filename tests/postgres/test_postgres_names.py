"""Names that bite, PostgreSQL side (no server): table names parsed and quoted, identifiers
PostgreSQL would truncate refused, key columns, column-name errors (issue 37)."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest

from connectors import BadInputError, ConfigurationError
from connectors.core.naming import TransactionId
from connectors.postgres import PostgresSink
from connectors.postgres._config import TableName
from connectors.postgres._gid import gid_of
from connectors.postgres._ledger_sql import decide_statement, ledger_ddl, prune_statement
from connectors.postgres._names import key_column_names, split_table_name
from connectors.postgres._types import Column, check_column_names, plan_write

INJECTION = 'x"; drop table y; --'


class TestTableNameParse:
    @pytest.mark.parametrize(("text", "parts"), [
        ("events", ("public", "events")),
        ("Events", ("public", "Events")),  # case kept: always quoted
        ("select.order", ("select", "order")),  # keywords are just names
        ("my schema.a b", ("my schema", "a b")),
        ("Größe.Täble", ("Größe", "Täble")),
        ('"My Schema"."Täble ""x"""', ("My Schema", 'Täble "x"')),
        ('"my.schema".events', ("my.schema", "events")),
        ('public."a.b"', ("public", "a.b")),
        ('"a.b"', ("public", "a.b")),
        ('""""', ("public", '"')),
        (INJECTION, ("public", INJECTION)),  # a bare part is taken as written
        (f"s.{INJECTION}", ("s", INJECTION)),
    ])
    def test_string_forms(self, text: str, parts: tuple[str, str]) -> None:
        assert split_table_name(text) == parts
        name = TableName.parse(text)
        assert (name.schema, name.name) == parts
        assert TableName.parse(str(name)) == name  # str() reads back

    def test_tuple_is_taken_exactly(self) -> None:
        name = TableName.parse(("my.schema", 'a"."b'))
        assert (name.schema, name.name) == ("my.schema", 'a"."b')
        assert TableName.parse(str(name)) == name

    @pytest.mark.parametrize(("text", "message"), [
        ("a.b.c", "3 dot-separated parts.*quote that part.*tuple"),
        ('"a.b', "no closing"),
        ('"a"b.c', "must be followed by '.'"),
        ("a.", "empty schema or table name"),
        (".a", "empty schema or table name"),
        ('""', "empty schema or table name"),
        ("", "must be 'name'"),
        ("a\x00b", "NUL"),
        ("t" * 64, "64 bytes long.*truncates"),
        ("ä" * 32, "64 bytes long"),  # bytes, not characters
    ])
    def test_refused_with_the_fix(self, text: str, message: str) -> None:
        with pytest.raises(ConfigurationError, match=message):
            TableName.parse(text)

    def test_63_bytes_is_fine(self) -> None:
        assert TableName.parse("t" * 63).name == "t" * 63

    def test_quoting_in_sql(self) -> None:
        name = TableName.parse('"My Schema"."Täble ""x"""')
        assert name.sql().as_string(None) == '"My Schema"."Täble ""x"""'
        assert TableName.parse(INJECTION).sql("_aborts").as_string(None) == (
            '"public"."x""; drop table y; --_aborts"')


class TestLedgerTable:
    def test_the_ledger_name_leaves_room_for_its_suffixes(self) -> None:
        PostgresSink("postgresql://db/x", "t", sink_id="s", ledger_table="l" * 48)
        with pytest.raises(ConfigurationError, match=r"ledger_table name.*appends up to 15"):
            PostgresSink("postgresql://db/x", "t", sink_id="s", ledger_table="l" * 49)

    def test_every_ledger_statement_quotes_the_name(self) -> None:
        table = TableName.parse(("select", INJECTION))
        quoted = '"select"."x""; drop table y; --'
        statements = [s for group in ledger_ddl(table).values() for s in group]
        statements += [decide_statement(table), prune_statement(table)]
        for statement in statements:
            text = statement.as_string(None)
            assert quoted in text
            rest = text.replace(quoted, "").replace('"x""; drop table y; --_receipts_batch"', "")
            assert "drop" not in rest.lower()


class TestKeyColumns:
    def test_one_string_is_one_column(self) -> None:
        assert key_column_names("user id") == ("user id",)
        sink = PostgresSink("postgresql://db/x", "t", sink_id="s", mode="upsert",
                            key_columns="order")
        assert sink.options.key_columns == ("order",)

    def test_odd_names_are_kept(self) -> None:
        assert key_column_names(["order", "Größe", "a b", INJECTION]) == (
            "order", "Größe", "a b", INJECTION)

    @pytest.mark.parametrize(("keys", "message"), [
        (["a", "a"], "repeats"), ([""], "non-empty"), (["k" * 64], "truncates"),
        ([1], "non-empty string"),
    ])
    def test_refused(self, keys: list[object], message: str) -> None:
        with pytest.raises(ConfigurationError, match=message):
            key_column_names(keys)  # type: ignore[arg-type]


class TestColumnNames:
    def test_long_or_nul_column_names_are_refused_before_the_table_is_touched(self) -> None:
        check_column_names(pa.schema([("Größe", pa.int64()), (INJECTION, pa.int64())]), "t")
        with pytest.raises(BadInputError, match="truncates names to 63 bytes"):
            check_column_names(pa.schema([("c" * 64, pa.int64())]), "t")
        with pytest.raises(BadInputError, match="NUL"):
            check_column_names(pa.schema([("a\x00", pa.int64())]), "t")

    def test_a_case_mismatch_says_so(self) -> None:
        columns = [Column("camelcase", "int8", "bigint", False, False)]
        with pytest.raises(BadInputError, match=r"the table has 'camelcase'.*folds"):
            plan_write("public.t", pa.schema([("CamelCase", pa.int64())]), columns)

    def test_odd_names_plan(self) -> None:
        names = ["order", "Größe", "a b", "CamelCase", INJECTION]
        columns = [Column(n, "int8", "bigint", False, False) for n in names]
        plan = plan_write("public.t", pa.schema([(n, pa.int64()) for n in names]), columns)
        assert plan.columns == tuple(names)


class TestSinkIdAndGid:
    @pytest.mark.parametrize("sink_id", ["a'b", "a|b", "a b", "Größe", "a.b", "-a", "'; drop",
                                         "a" * 41])
    def test_odd_sink_ids_are_refused_naming_the_rule(self, sink_id: str) -> None:
        with pytest.raises(ConfigurationError, match=r"invalid sink_id.*A-Z, a-z, 0-9"):
            PostgresSink("postgresql://db/x", "t", sink_id=sink_id)

    def test_the_gid_is_base64_and_a_literal(self) -> None:
        tid = TransactionId("A" + "z_-9" * 9 + "Z", "0123abcd", 7, 12)
        gid = gid_of(tid)
        assert re.fullmatch(r"[0-9]+_[A-Za-z0-9+/=]+_[A-Za-z0-9+/=]+", gid)
