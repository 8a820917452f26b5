"""IcebergSink passes the conformance kit, on real Iceberg tables and a real Spark session.

The kit's in-process engine (:class:`~connectors.testing.LocalBatch`) carries the rows as a
DataFrame of the integration tests' SparkSession (``spark=``; marked ``iceberg_session``, it
gets Iceberg's runtime jar and SQL extension), which IcebergSink writes itself (its family
commits on the driver: no tasks of its own). Each harness is a fresh table in a Hadoop
catalog ``conf`` on this module's warehouse, read back with pyiceberg (never Spark).
Nothing is "left open" by an Iceberg sink but the intents of batches its ledger does not
record: ``lingering_transactions`` counts those.
"""

from __future__ import annotations

import itertools
import secrets
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from connectors.core.batch import BatchInput
from connectors.iceberg import IcebergSink
from connectors.testing import LocalBatch, SinkConformanceTests, SinkHarness

pytestmark = [pytest.mark.integration, pytest.mark.iceberg, pytest.mark.iceberg_session]
_counter = itertools.count()
_RUN = secrets.token_hex(3)
CATALOG = "conf"


class IcebergHarness(SinkHarness):
    def __init__(self, spark: SparkSession, warehouse: Path) -> None:
        n = next(_counter)
        self.spark = spark
        self.name = f"t{_RUN}_{n}"
        self.table = f"{CATALOG}.db.{self.name}"
        self.location = warehouse / "db" / self.name
        self.sink_id = f"conf-{_RUN}-{n}"

    def new_sink(self, **overrides: Any) -> IcebergSink:
        options: dict[str, Any] = {"sink_id": self.sink_id, "create_table": True}
        options.update(overrides)
        return IcebergSink(self.table, **options)

    def make_batch(self, table: pa.Table, *, partitions: int, **options: Any) -> BatchInput:
        return LocalBatch(table, partitions=partitions, spark=self.spark, **options)

    def committed_rows(self) -> list[tuple[Any, ...]]:
        from pyiceberg.table import StaticTable

        hint = self.location / "metadata" / "version-hint.text"
        if not hint.exists():
            return []
        meta = self.location / "metadata" / f"v{int(hint.read_text().strip())}.metadata.json"
        arrow = StaticTable.from_metadata(str(meta)).scan().to_arrow()
        return list(zip(*[arrow.column(c).to_pylist() for c in ("batch", "seq", "payload")],
                        strict=True))

    def lingering_transactions(self) -> int:
        root = self.location / "_connectors"
        return sum(1 for _ in root.glob("*/intents/*.json")) if root.exists() else 0


@pytest.fixture(scope="module")
def warehouse(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The catalog ``conf`` (a Hadoop catalog) on a fresh warehouse, set on the session at
    run time (a catalog's confs are read when it is first used)."""
    root = tmp_path_factory.mktemp("iceberg-conformance")
    prefix = f"spark.sql.catalog.{CATALOG}"
    for key, value in ((prefix, "org.apache.iceberg.spark.SparkCatalog"),
                       (f"{prefix}.type", "hadoop"), (f"{prefix}.warehouse", str(root))):
        spark.conf.set(key, value)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CATALOG}.db")
    return root


class TestIcebergSinkConformance(SinkConformanceTests):
    @pytest.fixture(autouse=True)
    def _target(self, spark: SparkSession, warehouse: Path) -> None:
        self.spark, self.warehouse = spark, warehouse

    def make_harness(self) -> SinkHarness:
        return IcebergHarness(self.spark, self.warehouse)


def test_a_merge_with_bad_input_is_refused_before_anything_commits(
        spark: SparkSession, warehouse: Path) -> None:
    """A change stream into a table that requires ``name``: a condition naming a column
    neither side has, a key the batch lacks, then a NULL ``name`` in a row the MERGE would
    insert; each a ``BadInputError`` naming the problem (never a row's values), no snapshot
    committed; after the fix the batch lands once."""
    from connectors.core.errors import BadInputError

    table = f"{CATALOG}.db.bad_{_RUN}"
    spark.sql(f"CREATE TABLE {table} (id BIGINT, name STRING NOT NULL, seq BIGINT) "
              "USING iceberg")

    def snapshots() -> int:
        return int(spark.sql(f"SELECT count(*) FROM {table}.snapshots").first()[0])

    def sink(**options: Any) -> IcebergSink:
        return IcebergSink(table, sink_id=f"bad-{_RUN}", merge_on=["id"],
                           sequence_column="seq", **options)

    good = spark.createDataFrame([(1, "a", 1), (2, "b", 1)], "id BIGINT, name STRING, seq BIGINT")
    with pytest.raises(BadInputError, match="update_when") as err:
        sink(update_when="s.seq > t.nope").run_batch(good, 0)
    assert "nope" in str(err.value)
    with pytest.raises(BadInputError, match="merge_on column"):
        sink().run_batch(good.drop("id"), 0)
    nulls = spark.createDataFrame([(1, "secret-name", 1), (2, None, 1)],
                                  "id BIGINT, name STRING, seq BIGINT")
    with pytest.raises(BadInputError, match="'name'") as err:
        sink().run_batch(nulls, 0)
    assert "secret-name" not in str(err.value)
    assert snapshots() == 0, "nothing committed"
    fixed = sink()
    fixed.run_batch(good, 0)
    fixed.run_batch(good, 0)  # the same batch again: a replay, nothing written
    rows = sorted(tuple(r) for r in spark.table(table).collect())
    assert rows == [(1, "a", 1), (2, "b", 1)] and snapshots() == 1


def test_a_table_another_writer_alters_during_a_run_is_checked_afresh(
        spark: SparkSession, warehouse: Path) -> None:
    """The sink keeps the table's schema within a run (no catalog read per batch). Another
    writer adds a column the next batch brings: the kept schema would refuse it, a fresh
    read lets it through. It then drops a column the batch still has: the kept schema lets
    the batch through, Iceberg's writer refuses it, a ``BadInputError`` names the fix and
    nothing commits; the fixed batch lands once."""
    from connectors.core.errors import BadInputError

    table = f"{CATALOG}.db.altered_{_RUN}"
    spark.sql(f"CREATE TABLE {table} (id BIGINT, name STRING) USING iceberg")
    sink = IcebergSink(table, sink_id=f"altered-{_RUN}")

    def tags() -> list[str]:
        return [r[0] for r in spark.sql(
            f"SELECT summary['connectors.batch'] FROM {table}.snapshots "
            f"WHERE summary['connectors.sink'] = 'altered-{_RUN}' ORDER BY committed_at"
        ).collect()]

    sink(spark.createDataFrame([(1, "a")], "id BIGINT, name STRING"), 0)
    spark.sql(f"ALTER TABLE {table} ADD COLUMN amount DOUBLE")  # another writer
    sink(spark.createDataFrame([(2, "b", 2.0)], "id BIGINT, name STRING, amount DOUBLE"), 1)
    spark.sql(f"ALTER TABLE {table} DROP COLUMN name")  # another writer, again
    stale = spark.createDataFrame([(3, "secret-c", 3.0)], "id BIGINT, name STRING, amount DOUBLE")
    with pytest.raises(BadInputError, match="do not fit the Iceberg table") as err:
        sink(stale, 2)
    assert "secret-c" not in str(err.value) and "Nothing was committed" in str(err.value)
    assert tags() == ["0", "1"], "the refused batch committed nothing"
    sink(stale.drop("name"), 2)
    sink(stale.drop("name"), 2)  # the same batch again: a replay, nothing written
    rows = sorted(tuple(r) for r in spark.table(table).collect())
    assert rows == [(1, None), (2, 2.0), (3, 3.0)] and tags() == ["0", "1", "2"]
