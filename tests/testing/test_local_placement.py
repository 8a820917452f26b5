"""``LocalBatch.slotted(key=...)``: the in-process placement the conformance kit uses keeps
the rule of the Spark batch input: every row of a key in one slot, each input partition's
rows in their order there, keyless rows by content."""

from __future__ import annotations

import pyarrow as pa

from connectors.testing.local import LocalBatch

SCHEMA = pa.schema([("key", pa.string()), ("p", pa.int64()), ("seq", pa.int64())])


def _batch(partitions: int, rows: int, keys: int) -> LocalBatch:
    parts = []
    for p in range(partitions):
        data = [{"key": f"k{i % keys}" if i % 5 else None, "p": p, "seq": i}
                for i in range(rows)]
        parts.append([pa.RecordBatch.from_pylist(data, schema=SCHEMA)])
    return LocalBatch(parts)


def _slots(batch: LocalBatch) -> list[list[dict[str, object]]]:
    return [pa.Table.from_batches(part, schema=SCHEMA).to_pylist()
            for part in batch._partitions]


def test_every_key_in_one_slot_in_input_partition_order() -> None:
    slots = _slots(_batch(4, 200, 7).slotted(3, key="key"))
    where: dict[object, set[int]] = {}
    for i, rows in enumerate(slots):
        last: dict[tuple[object, object], int] = {}
        for row in rows:
            if row["key"] is not None:
                where.setdefault(row["key"], set()).add(i)
                group = (row["key"], row["p"])
                assert int(row["seq"]) > last.get(group, -1), (i, row)  # type: ignore[call-overload]
                last[group] = int(row["seq"])  # type: ignore[call-overload]
    assert len(where) == 7 and all(len(s) == 1 for s in where.values()), where
    assert len({min(s) for s in where.values()}) > 1  # keys spread over slots
    assert sum(len(rows) for rows in slots) == 800


def test_keyless_rows_by_content_and_placement_independent_of_input_partitioning() -> None:
    one = _batch(1, 400, 7)
    table = one.to_arrow()
    other = LocalBatch(table, partitions=3)
    a = [sorted(map(repr, rows)) for rows in _slots(one.slotted(3, key="key"))]
    b = [sorted(map(repr, rows)) for rows in _slots(other.slotted(3, key="key"))]
    assert a == b
    keyless = [sum(1 for r in rows if r["key"] is None)
               for rows in _slots(one.slotted(3, key="key"))]
    assert sum(keyless) == 80 and sum(1 for n in keyless if n) > 1, keyless


def test_without_key_column_the_content_placement_is_unchanged() -> None:
    batch = _batch(2, 100, 3)
    assert _slots(batch.slotted(3)) == _slots(batch.slotted(3, key="absent"))
