"""``MariaDBSink(mode="changes")`` without a server: the options, the driver's table plan
(the op and sequence columns written only when the table has them, the keys, the deleted
keys' load), the task side's SQL and split. The SQL runs in
integration/mariadb/test_mariadb_changes.py."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from connectors.core.changes import stage
from connectors.core.errors import BadInputError, ConfigurationError
from connectors.mariadb._changes import delete_sql, deletes_table_sql, split
from connectors.mariadb._config import Address, MariaDBOptions, TableName
from connectors.mariadb._sink import MariaDBSink
from connectors.mariadb._tables import plan_table

URL = "mariadb://app:pw@db:3306/shop"
SCHEMA = pa.schema([("id", pa.int64()), ("op", pa.string()), ("seq", pa.int64()),
                    ("name", pa.string())])


def sink(**kw: Any) -> MariaDBSink:
    base: dict[str, Any] = {"sink_id": "s", "mode": "changes", "key_columns": ["id"],
                            "op_column": "op", "sequence_column": "seq"}
    base.update(kw)
    return MariaDBSink(URL, "t", **base)


class TestOptions:
    def test_changes_mode_is_accepted(self) -> None:
        s = sink()
        assert (s.options.mode, s.options.op_column, s.options.sequence_column) == (
            "changes", "op", "seq")
        assert "mode='changes'" in repr(s)

    @pytest.mark.parametrize("kw,needle", [
        # the generic checks (tests/core/test_changes.py), through MariaDBOptions
        ({"key_columns": None}, "mode='changes' needs key_columns"),
        ({"op_column": "id"}, "op_column 'id' is one of key_columns"),
        ({"mode": "upsert", "sequence_column": None}, "op_column only apply to mode='changes'"),
        # MariaDB's names
        ({"op_column": ""}, "op_column must be a non-empty string"),
        ({"sequence_column": "a\x00b"}, "no NUL"),
        ({"sequence_column": "x" * 65}, "1 to 64 characters"),
    ])
    def test_bad_changes_options_name_the_fix(self, kw: dict[str, Any], needle: str) -> None:
        with pytest.raises(ConfigurationError, match=needle):
            sink(**kw)

    def test_unknown_mode_lists_the_modes(self) -> None:
        with pytest.raises(ConfigurationError, match="'changes'"):
            MariaDBOptions(table=TableName("d", "t"), ledger_table=TableName("d", "l"),
                           mode="cdc")  # type: ignore[arg-type]


class FakeDb:
    """The driver's connection as ``plan_table`` uses it: information_schema rows."""

    def __init__(self, columns: list[tuple[str, str, bool]], unique: list[tuple[str, str]],
                 ) -> None:
        self.address = Address(URL)
        self.columns, self.unique = columns, unique
        self.statements: list[str] = []

    def fetch(self, doing: str, statement: str, params: Any = (), **ids: Any) -> list[Any]:
        self.statements.append(statement)
        if "information_schema.columns" in statement:
            return [(n, t, t, "YES" if nullable else "NO", None, "")
                    for n, t, nullable in self.columns]
        if "information_schema.statistics" in statement:
            return self.unique
        if statement.startswith("CREATE TABLE"):
            self.columns = [("id", "bigint", False), ("seq", "bigint", True),
                            ("name", "longtext", True)]
        return []


def plan(db: FakeDb, **kw: Any) -> Any:
    s = sink(**kw)
    return plan_table(db, s.options, SCHEMA, sink_id="s")  # type: ignore[arg-type]


TABLE = [("ID", "bigint", False), ("name", "varchar", False)]


class TestTablePlan:
    def test_op_and_seq_written_only_when_the_table_has_them_any_case(self) -> None:
        p = plan(FakeDb(TABLE, [("PRIMARY", "ID")]))
        assert p.columns == ("id", "name") and p.keys == ("id",)
        assert p.key_load is not None and p.key_load.names == ["id"]
        p = plan(FakeDb([*TABLE, ("SEQ", "bigint", True), ("Op", "varchar", True)],
                        [("PRIMARY", "id")]))
        assert p.columns == ("id", "op", "seq", "name")

    def test_a_key_no_unique_index_covers_is_refused(self) -> None:
        with pytest.raises(BadInputError, match=r"mode='changes' would insert duplicates"):
            plan(FakeDb(TABLE, [("u", "id"), ("u", "name")]))

    def test_op_and_sequence_columns_are_checked_before_the_table_is_read(self) -> None:
        db = FakeDb(TABLE, [("PRIMARY", "id")])
        with pytest.raises(BadInputError, match=r"'ts'.*nothing was committed"):
            plan(db, sequence_column="ts")
        assert db.statements == []

    def test_create_table_makes_the_sequence_column_not_the_op_column(self) -> None:
        db = FakeDb([], [("PRIMARY", "id")])
        p = plan(db, create_table=True)
        create = next(s for s in db.statements if s.startswith("CREATE TABLE"))
        assert "`seq` BIGINT" in create and "`op`" not in create
        assert "PRIMARY KEY (`id`)" in create
        assert p.columns == ("id", "seq", "name")


def test_the_sql_of_the_deletes() -> None:
    target, stage_table = TableName("shop", "t"), TableName("shop", "connectors_deletes")
    assert deletes_table_sql(target, stage_table, ["a", "b`c"]) == (
        "CREATE TEMPORARY TABLE `shop`.`connectors_deletes` SELECT `a`, `b``c` FROM "
        "`shop`.`t` LIMIT 0")
    assert delete_sql(target, stage_table, ["a", "b"]) == (
        "DELETE t FROM `shop`.`t` AS t JOIN `shop`.`connectors_deletes` AS s ON "
        "t.`a` = s.`a` AND t.`b` = s.`b`")


def test_split_ignores_the_written_op_column_in_ties() -> None:
    """With the op column written, a tie is still broken by the other columns then the
    delete flag (``"u"`` > ``"d"`` as text must not make the upsert win)."""
    options = sink().options
    raw = pa.RecordBatch.from_pylist(
        [{"id": 1, "op": "u", "seq": 5, "name": "a"}, {"id": 1, "op": "d", "seq": 5,
                                                       "name": "a"},
         {"id": 2, "op": "c", "seq": 1, "name": "x"}], schema=SCHEMA)
    columns = ("id", "op", "seq", "name")
    staged = stage(raw, raw.select(list(columns)), options)
    upserts, deletes = split([staged], options, columns, ("id",))
    assert deletes.to_pylist() == [{"id": 1}]
    assert upserts.to_pylist() == [{"id": 2, "op": "c", "seq": 1, "name": "x"}]
