"""Names that bite, on real Delta (the shared in-process ``spark`` session; issue 37).

- A table path with spaces and Unicode; columns in upper case, with Unicode, a dot and a
  backtick (Delta allows them without column mapping): appended and replayed (the replay
  check reads the commit's files by these names). Delta's MERGE fails on a column name with
  a backtick (``UPDATE SET *`` does not escape it): refused before the write, naming the
  fix; without it, merged on keys with a dot and Unicode (the key condition and the per-key
  dedup quote them).
- Column names with a space or ``,;{}()=``: Delta takes them only in a table with column
  mapping. Without it the batch is refused with an error that names the fix, and nothing
  is committed; in a table created with ``delta.columnMapping.mode = 'name'`` they append
  and merge.

Batch-job calls ``sink(df, batch_id)`` on tables under ``tmp_path``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from connectors.core.errors import BadInputError
from connectors.delta import DeltaSink

pytestmark = pytest.mark.integration

ODD = "`order` long, `Größe` string, `CamelCase` int, `x``y` string, `a.b` long"
SPACED = "`order` long, `a b` string, `k=v;{x}(y),z` int"


def rows(spark: Any, schema: str, data: list[tuple[Any, ...]]) -> Any:
    return spark.createDataFrame(data, schema).repartition(2)


def table(spark: Any, path: Path) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in spark.read.format("delta").load(str(path)).collect())


def odd(ids: range, tag: str = "v") -> list[tuple[Any, ...]]:
    return [(i, f"{tag}-ä{i}", i % 3, f"k`{i % 5}", i % 5) for i in ids]


def test_odd_paths_and_column_names_append_replay_and_merge(
    spark: Any, tmp_path: Path
) -> None:
    path = tmp_path / "My Täble ü (x)"
    sink = DeltaSink(str(path), sink_id="Names-Odd", create_table=True)
    sink(rows(spark, ODD, odd(range(20))), 0)
    sink(rows(spark, ODD, odd(range(20, 30))), 1)
    sink(rows(spark, ODD, odd(range(20, 30))), 1)  # a replay: checked against its files
    assert table(spark, path) == sorted(odd(range(30)))
    assert [f.name for f in spark.read.format("delta").load(str(path)).schema.fields] == [
        "order", "Größe", "CamelCase", "x`y", "a.b"]
    upsert = DeltaSink(str(path), sink_id="Names-Merge", merge_on=["Größe", "a.b"])
    source = [(100 + i, f"v-ä{i % 4}", 9, f"k`{i % 5}", i % 4) for i in range(10)]
    with pytest.raises(BadInputError,
                       match=r"'x`y' of the batch or the table hold a backtick.*MERGE.*rename"):
        upsert(rows(spark, ODD, source), 0)
    assert table(spark, path) == sorted(odd(range(30)))
    # Without backticks: MERGE on a Unicode and a dot key into a new table; duplicate keys
    # in the source are deduplicated (the greatest row wins).
    schema = ODD.replace(", `x``y` string", "")
    merged_path = tmp_path / "merged Täble"
    DeltaSink(str(merged_path), sink_id="Names-Odd", create_table=True)(
        rows(spark, schema, [r[:3] + r[4:] for r in odd(range(30))]), 0)
    upsert = DeltaSink(str(merged_path), sink_id="Names-Merge", merge_on=["Größe", "a.b"])
    source = [r[:3] + r[4:] for r in source]
    upsert(rows(spark, schema, source), 0)
    by_key: dict[tuple[str, int], tuple[Any, ...]] = {}
    for r in sorted(source):
        by_key[(r[1], r[3])] = r  # the greatest `order` per key
    merged = table(spark, merged_path)
    assert sorted(r for r in merged if r[2] == 9) == sorted(by_key.values())
    assert len(merged) == 30  # the 4 keys matched rows of the table: updated, none added


def test_names_delta_needs_column_mapping_for(spark: Any, tmp_path: Path) -> None:
    data = [(i, f"s-{i}", i % 4) for i in range(12)]
    plain = tmp_path / "plain"
    sink = DeltaSink(str(plain), sink_id="names-plain", create_table=True)
    with pytest.raises(BadInputError) as err:
        sink(rows(spark, SPACED, data), 0)
    text = str(err.value)
    for needle in ("column mapping", "withColumnRenamed", "delta.columnMapping.mode",
                   "a b"):
        assert needle in text, (needle, text)
    assert not (plain / "_delta_log").exists() or table(spark, plain) == []
    # A table with column mapping takes them: append, then merge on the spaced key.
    mapped = tmp_path / "mapped table"
    escaped = str(mapped).replace("`", "``")
    spark.sql(f"CREATE TABLE delta.`{escaped}` ({SPACED.replace(' long', ' bigint')}) "
              "USING delta TBLPROPERTIES ('delta.columnMapping.mode' = 'name', "
              "'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5')")
    sink = DeltaSink(str(mapped), sink_id="names-mapped")
    sink(rows(spark, SPACED, data), 0)
    sink(rows(spark, SPACED, data), 0)  # replay
    assert table(spark, mapped) == sorted(data)
    upsert = DeltaSink(str(mapped), sink_id="names-mapped-merge", merge_on=["a b"])
    upsert(rows(spark, SPACED, [(99, "s-3", 7), (98, "new", 1)]), 0)
    want = {r[1]: r for r in data}
    want["s-3"], want["new"] = (99, "s-3", 7), (98, "new", 1)
    assert table(spark, mapped) == sorted(want.values())
