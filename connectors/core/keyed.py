"""Rows reduced to one per key, the same way in every sink that upserts.

A batch may hold several rows of one key; an upsert must apply one of them, and the same
one on every replay of the batch, whatever order the rows arrive in. The rule: order the
rows by every column (ascending, NULLs as Arrow sorts them) and keep the last row of each
key, the greatest row by value. Arrow cannot sort lists and maps (nor structs holding
them): such a column orders by each value's JSON text (compact, entries in their order),
a deterministic order too.

Example::

    >>> import pyarrow as pa
    >>> t = pa.table({"id": [1, 2, 1, 1], "v": ["b", "x", "c", "a"]})
    >>> last_row_per_key(t, ["id"]).sort_by("id").to_pylist()
    [{'id': 1, 'v': 'c'}, {'id': 2, 'v': 'x'}]
    >>> t = pa.table({"id": [1, 1, 2], "tags": [["b"], ["a", "z"], None]})
    >>> last_row_per_key(t, ["id"]).sort_by("id").to_pylist()
    [{'id': 1, 'tags': ['b']}, {'id': 2, 'tags': None}]
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["last_row_per_key", "sortable"]

_ROW = "__connectors_row"


def last_row_per_key(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """One row per distinct value of ``keys``: the greatest by value (see the module)."""
    if table.num_rows == 0:
        return table
    order = [(c, "ascending") for c in table.column_names]
    table = table.take(pc.sort_indices(sortable(table), sort_keys=order))
    table = table.append_column(_ROW, pa.array(range(table.num_rows), pa.int64()))
    last = table.group_by(list(keys), use_threads=False).aggregate([(_ROW, "max")])
    return table.take(last[f"{_ROW}_max"]).drop_columns([_ROW])


def _unsortable(t: pa.DataType) -> bool:
    """Types Arrow's sort refuses: lists and maps, and structs holding one."""
    if pa.types.is_struct(t):
        return any(_unsortable(t.field(i).type) for i in range(t.num_fields))
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t)
                or pa.types.is_fixed_size_list(t) or pa.types.is_list_view(t)
                or pa.types.is_large_list_view(t))


def _json_text(column: pa.ChunkedArray) -> pa.Array:
    """Each value's compact JSON text (None stays NULL), as a sort key."""
    return pa.array([None if v is None else json.dumps(v, separators=(",", ":"), default=str)
                     for v in column.to_pylist()], pa.string())


def sortable(table: pa.Table) -> pa.Table:
    """``table`` with every column Arrow cannot sort replaced by its JSON text (to order
    rows by, then take from the original)."""
    for i, field in enumerate(table.schema):
        if _unsortable(field.type):
            table = table.set_column(i, field.name, _json_text(table.column(i)))
    return table
