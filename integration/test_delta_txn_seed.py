"""DeltaSink answers Delta 4.4.0's next ``txnVersion`` lookup from the commit's checksum
(``connectors.delta._sink._seed_txn_lookup``) instead of a state reconstruction. It is an
optimisation only: Delta must still skip every replayed (app id, version), for the sink and
for a direct writer, and nothing is seeded where Delta's own answer could differ (a txn
retention is configured)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from connectors.delta import DeltaSink
from connectors.delta._sink import _seed_txn_lookup
from integration._delta import tagged_commits

pytestmark = pytest.mark.integration


def rows(spark: SparkSession, start: int, n: int = 100) -> DataFrame:
    return spark.range(start, start + n, 1, 2).select(
        F.col("id"), F.concat(F.lit("n-"), F.col("id").cast("string")).alias("name"))


def ids(spark: SparkSession, path: Path) -> list[int]:
    return sorted(r[0] for r in spark.read.format("delta").load(str(path)).collect())


def test_seeded_lookup_still_skips_replays(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "t"
    sink = DeltaSink(str(path), sink_id="seed", create_table=True)
    for b in range(3):
        sink(rows(spark, 100 * b), b)
    # The sink seeded the post-commit snapshot: a second seed finds it known.
    assert not _seed_txn_lookup(spark, str(path), "seed", 2)
    snapshot = spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(
        spark._jsparkSession, str(path)).unsafeVolatileSnapshot()
    assert not snapshot._computedStateTriggered(), "the lookup ran a state reconstruction"
    assert snapshot.transactions().get("seed").get() == 2

    # A direct write of an already committed (app id, version) is skipped by Delta...
    for version in (1, 2):
        (rows(spark, 9000).write.format("delta").mode("append").option("txnAppId", "seed")
         .option("txnVersion", str(version)).save(str(path)))
    # ...and so is a replay through a new sink (a restarted driver), while a new batch lands.
    again = DeltaSink(str(path), sink_id="seed")
    again(rows(spark, 200), 2)
    again(rows(spark, 300), 3)
    assert ids(spark, path) == list(range(400))
    commits = tagged_commits(path, "seed")
    assert sorted(commits) == [0, 1, 2, 3] and all(len(v) == 1 for v in commits.values())


def txn_write(spark: SparkSession, path: Path, start: int, version: int) -> None:
    (rows(spark, start).write.format("delta").mode("append").option("txnAppId", "app")
     .option("txnVersion", str(version)).save(str(path)))


@pytest.mark.parametrize("retention", [False, True])
def test_nothing_is_seeded_with_a_txn_retention(
    spark: SparkSession, tmp_path: Path, retention: bool
) -> None:
    path = tmp_path / "r"
    rows(spark, 0).write.format("delta").save(str(path))
    if retention:
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
                  "('delta.setTransactionRetentionDuration' = 'interval 30 days')")
    txn_write(spark, path, 100, 0)
    # Without a retention the post-commit snapshot is seeded; with one, Delta keeps its
    # own answer (its reconstruction drops expired ids).
    assert _seed_txn_lookup(spark, str(path), "app", 0) is not retention
    txn_write(spark, path, 100, 0)  # a replay: skipped either way
    txn_write(spark, path, 200, 1)
    assert ids(spark, path) == list(range(300))
