"""Rows reduced to one per key, the same way in every sink that upserts.

A batch may hold several rows of one key; an upsert must apply one of them, and the same
one on every replay of the batch, whatever order the rows arrive in. The rule: order the
rows by every column (ascending, NULLs as Arrow sorts them) and keep the last row of each
key, the greatest row by value.

Example::

    >>> import pyarrow as pa
    >>> t = pa.table({"id": [1, 2, 1, 1], "v": ["b", "x", "c", "a"]})
    >>> last_row_per_key(t, ["id"]).sort_by("id").to_pylist()
    [{'id': 1, 'v': 'c'}, {'id': 2, 'v': 'x'}]
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["last_row_per_key"]

_ROW = "__connectors_row"


def last_row_per_key(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """One row per distinct value of ``keys``: the greatest by value (see the module)."""
    if table.num_rows == 0:
        return table
    order = [(c, "ascending") for c in table.column_names]
    table = table.take(pc.sort_indices(table, sort_keys=order))
    table = table.append_column(_ROW, pa.array(range(table.num_rows), pa.int64()))
    last = table.group_by(list(keys), use_threads=False).aggregate([(_ROW, "max")])
    return table.take(last[f"{_ROW}_max"]).drop_columns([_ROW])
