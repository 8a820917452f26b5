"""Two streaming queries in one SparkSession, each MERGE-ing into its own Delta table at the
same time: no cross-talk through Delta's session-wide txn confs (delta-io/delta #3934), nor
through the ``userMetadata`` conf that tags every commit (on both commit paths).

Delta makes MERGE idempotent only through ``spark.databricks.delta.write.txnAppId`` /
``txnVersion`` session confs. If both queries set them on one shared session, one query's
MERGE can commit under the other's app id and version (then the other's batch is silently
skipped) or carry the wrong version. ``DeltaSink`` sets them on ``batch_df.sparkSession``,
each query's own clone. The test runs both queries concurrently (it checks that their
MERGEs really overlapped in time), then checks each table row by row and that each table's
log holds exactly its own sink's app id with one commit per batch.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from connectors.delta import DeltaSink, LocalDeltaLog
from connectors.delta._writer import CONF_TXN_APP_ID, CONF_TXN_VERSION
from integration.support._delta import table_rows, tagged_commits

pytestmark = pytest.mark.integration

BATCHES, ROWS = 6, 120


class Stream:
    """One rate-micro-batch query MERGE-ing rows keyed ``id % mod`` through a DeltaSink."""

    def __init__(self, spark: SparkSession, root: Path, name: str, mod: int,
                 txn: bool) -> None:
        self.name, self.mod = name, mod
        self.path = root / name
        self.sink = DeltaSink(str(self.path), sink_id=name, merge_on=["key"], create_table=True,
                              delta_txn_id=txn)
        self.done = threading.Event()
        self.spans: list[tuple[float, float]] = []
        df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", ROWS)
              .option("numPartitions", 2).option("startTimestamp", 0).load())
        self.query = (df.writeStream.foreachBatch(self.write)
                      .option("checkpointLocation", str(root / f"ckpt-{name}"))
                      .trigger(processingTime="50 milliseconds").start())

    def write(self, batch_df: DataFrame, batch_id: int) -> None:
        if batch_id >= BATCHES:
            self.done.set()
            return
        rows = batch_df.select(
            F.col("value").alias("id"),
            (F.col("value") % F.lit(self.mod)).alias("key"),
            F.concat(F.lit(f"{self.name}-"), F.col("value").cast("string")).alias("name"),
        )
        start = time.monotonic()
        self.sink(rows, batch_id)
        self.spans.append((start, time.monotonic()))

    def expected(self) -> list[tuple[Any, ...]]:
        best: dict[int, int] = {}
        for i in range(BATCHES * ROWS):
            best[i % self.mod] = max(best.get(i % self.mod, -1), i)
        return sorted((k, i, f"{self.name}-{i}") for k, i in best.items())


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


@pytest.mark.parametrize("txn", [False, True], ids=["tag", "txn"])
def test_two_queries_merging_concurrently_do_not_cross(
    spark: SparkSession, tmp_path: Path, txn: bool
) -> None:
    """Both commit paths set session confs for a MERGE: the ``userMetadata`` tag (which the
    tag path's recovery relies on), and on the txn path Delta's txn confs."""
    one = Stream(spark, tmp_path, "q-one", 7, txn)
    two = Stream(spark, tmp_path, "q-two", 11, txn)
    try:
        deadline = time.monotonic() + 300
        for s in (one, two):
            while not s.done.wait(0.2):
                assert s.query.isActive, s.query.exception()
                assert time.monotonic() < deadline, "queries did not finish in time"
    finally:
        for s in (one, two):
            s.query.stop()
            s.sink.close()
    assert len(one.spans) == len(two.spans) == BATCHES
    assert _overlap(one.spans, two.spans) > 0, "the two queries' MERGEs never overlapped"
    for s, other in ((one, two), (two, one)):
        assert table_rows(spark, s.path, ["key", "id", "name"]) == s.expected()
        commits = tagged_commits(s.path, s.name)
        assert sorted(commits) == list(range(BATCHES)), commits
        assert all(len(v) == 1 for v in commits.values()), commits
        assert not tagged_commits(s.path, other.name), "a commit tagged by the other query"
        # Delta's own txn record: exactly this table's app id, at the last batch (none on
        # the tag path).
        want = {s.name: BATCHES - 1} if txn else {}
        assert LocalDeltaLog(s.path).read().versions == want
    # The shared session never carried the confs.
    assert spark.conf.get(CONF_TXN_APP_ID, None) is None
    assert spark.conf.get(CONF_TXN_VERSION, None) is None
