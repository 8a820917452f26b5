"""MariaDBSink's upsert on a real server (tasks in-process, ``LocalBatch``): per key the
greatest row by value wins within a batch, a later batch's row wins across batches, whatever
partition the rows arrive in; ``create_table`` makes the keys the primary key; a table whose
unique indexes do not cover exactly the keys, or a batch without a key column, is refused
before any task runs; a NULL for a NOT NULL column is refused by the staging load's
warning. Row by row, nothing left prepared."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from connectors.core.errors import BadInputError
from connectors.mariadb._config import Address, TableName
from connectors.mariadb._sink import MariaDBSink
from connectors.testing import LocalBatch
from integration.mariadb.test_mariadb_conformance import _rows

pytestmark = [pytest.mark.integration]

LEDGER = "eos_conformance"


@pytest.fixture
def env(mariadb_url: str) -> Iterator[dict[str, Any]]:
    address = Address(mariadb_url)
    table = TableName(address.database, f"ups_{uuid.uuid4().hex[:10]}")
    yield {"url": mariadb_url, "address": address, "table": table,
           "sink_id": f"ups-{uuid.uuid4().hex[:8]}"}
    _rows(address, f"DROP TABLE IF EXISTS {table.sql()}")


def sink(env: dict[str, Any], **options: Any) -> MariaDBSink:
    return MariaDBSink(env["url"], env["table"].name, sink_id=env["sink_id"], mode="upsert",
                       key_columns=["id"], ledger_table=LEDGER, **options)


def rows(ids: list[int], names: list[str | None], amounts: list[float]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "name": pa.array(names, pa.string()),
                     "amount": pa.array(amounts, pa.float64())})


def table_rows(env: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in _rows(env["address"],
                                    f"SELECT id, name, amount FROM {env['table'].sql()} "
                                    "ORDER BY id")]


def test_the_greatest_row_of_a_key_wins_and_a_later_batch_wins_across_batches(
        env: dict[str, Any]) -> None:
    s = sink(env, create_table=True)
    try:
        # key 1 three times across partitions: ("b", 2.0) is the greatest row by value
        s.write_batch(LocalBatch(rows([1, 2, 1, 1, 3], ["a", "x", "b", "a", "z"],
                                      [9.0, 1.0, 2.0, 1.0, 3.0]), partitions=3), 0)
        assert table_rows(env) == [(1, "b", 2.0), (2, "x", 1.0), (3, "z", 3.0)]
        s.write_batch(LocalBatch(rows([2, 4], ["y", "w"], [5.0, 4.0]), partitions=2), 1)
        s.write_batch(LocalBatch(rows([2, 4], ["y", "w"], [5.0, 4.0]), partitions=2), 1)
    finally:
        s.close()
    assert table_rows(env) == [(1, "b", 2.0), (2, "y", 5.0), (3, "z", 3.0), (4, "w", 4.0)]
    t = env["table"]
    keys = _rows(env["address"], "SELECT column_name FROM information_schema.statistics "
                 f"WHERE table_schema = '{t.database}' AND table_name = '{t.name}' AND "
                 "index_name = 'PRIMARY'")
    assert [k[0] for k in keys] == ["id"], "create_table made the key the primary key"
    prepared = [r for r in _rows(env["address"], "XA RECOVER") if env["sink_id"].encode()
                in (r[3] if isinstance(r[3], bytes) else str(r[3]).encode())]
    assert prepared == []


def test_keys_no_unique_index_covers_and_a_missing_key_are_refused_before_any_task(
        env: dict[str, Any]) -> None:
    _rows(env["address"], f"CREATE TABLE {env['table'].sql()} (id BIGINT NOT NULL, name "
                          "VARCHAR(20) NOT NULL, amount DOUBLE, UNIQUE KEY (id, name))")
    s = sink(env)
    try:
        with pytest.raises(BadInputError, match="covers exactly the key columns id"):
            s.write_batch(LocalBatch(rows([1], ["a"], [1.0]), partitions=1), 0)
        _rows(env["address"], f"ALTER TABLE {env['table'].sql()} ADD UNIQUE KEY (id)")
        with pytest.raises(BadInputError, match=r"column\(s\) id"):
            s.write_batch(LocalBatch(pa.table({"name": ["a"], "amount": [1.0]}),
                                     partitions=1), 0)
        nulls = rows([1, 2], ["a", None], [1.0, 2.0])
        with pytest.raises(BadInputError, match="column 'name'") as err:
            s.write_batch(LocalBatch(nulls, partitions=1), 0)
        assert "NOT NULL" in str(err.value) or "1263" in str(err.value)
        assert table_rows(env) == []
        s.write_batch(LocalBatch(rows([1, 2], ["a", "b"], [1.0, 2.0]), partitions=2), 0)
    finally:
        s.close()
    assert table_rows(env) == [(1, "a", 1.0), (2, "b", 2.0)]
