"""``last_row_per_key``: one row per key, the greatest by value, the same on every order of
the rows; lists, maps and structs holding them (which Arrow cannot sort) included."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest

from connectors.core.keyed import last_row_per_key

NESTED = [
    ("list", pa.list_(pa.int64()), [[1, 2], [1, 3], None, []]),
    ("large_list", pa.large_list(pa.string()), [["a"], ["b", None], [], None]),
    ("map", pa.map_(pa.string(), pa.int32()), [[("k", 1)], [("k", 2)], [], None]),
    ("struct_of_list", pa.struct([("xs", pa.list_(pa.int8()))]),
     [{"xs": [1]}, {"xs": [2]}, {"xs": None}, None]),
]


@pytest.mark.parametrize(("kind", "type_", "values"), NESTED, ids=[n[0] for n in NESTED])
def test_nested_columns_pick_the_same_row_whatever_the_order(
        kind: str, type_: pa.DataType, values: list[object]) -> None:
    rows = [{"id": 1, "v": v, "n": i % 2} for i, v in enumerate(values)]
    rows.append({"id": 2, "v": values[0], "n": 0})
    picks = set()
    for order in itertools.permutations(range(len(rows))):
        table = pa.Table.from_pylist([rows[i] for i in order], pa.schema(
            [("id", pa.int64()), ("v", type_), ("n", pa.int64())]))
        got = last_row_per_key(table, ["id"]).sort_by("id").to_pylist()
        assert [r["id"] for r in got] == [1, 2]
        picks.add(repr(got))
    assert len(picks) == 1, picks  # deterministic: one answer for every order


def test_a_sortable_column_still_orders_by_value() -> None:
    table = pa.table({"id": [1, 1, 1], "v": [3, 10, 2], "tags": [["z"], ["a"], ["y"]]})
    assert last_row_per_key(table, ["id"]).to_pylist() == [{"id": 1, "v": 10, "tags": ["a"]}]
