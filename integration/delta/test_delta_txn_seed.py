"""On its ``delta_txn_id=True`` path DeltaSink answers Delta 4.4.0's next ``txnVersion``
lookup from the commit's checksum (``connectors.delta._txn_seed``) instead of a state
reconstruction. It is an optimisation only: Delta must still skip every replayed (app id,
version), for the sink and for a direct writer, and nothing is seeded where Delta's own
answer could differ (a txn retention is configured). The accelerator runs only on the
verified classes and not with ``CONNECTORS_ACCELERATORS=off``; without it the sink warns
and says so in its metrics. The default path writes no txn id and touches none of this."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from connectors.delta import DeltaSink, _txn_seed
from connectors.delta._txn_seed import ACCELERATORS_ENV, seed_problem, seed_txn_lookup
from integration.support._delta import tagged_commits, txn_version

pytestmark = pytest.mark.integration


def rows(spark: SparkSession, start: int, n: int = 100) -> DataFrame:
    return spark.range(start, start + n, 1, 2).select(
        F.col("id"), F.concat(F.lit("n-"), F.col("id").cast("string")).alias("name"))


def ids(spark: SparkSession, path: Path) -> list[int]:
    return sorted(r[0] for r in spark.read.format("delta").load(str(path)).collect())


def verified_delta(spark: SparkSession) -> None:
    """The accelerator is allow-listed for Delta 4.4.0's classes: on Spark 3.5 (Delta 3.3)
    it is refused by design, which is no failure of these tests' subject (skipped there,
    naming why); on Spark 4 a refusal is a failure."""
    import pyspark

    problem = seed_problem(spark)
    if problem is not None and int(pyspark.__version__.split(".", 1)[0]) < 4:
        pytest.skip(f"pyspark {pyspark.__version__}: {problem}")
    assert problem is None, "not the verified Delta 4.4.0 classes"


@pytest.fixture
def accelerators_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the accelerator itself: a CI lane's CONNECTORS_ACCELERATORS=off
    is lifted for them (its effect is tested below, with the switch set)."""
    monkeypatch.delenv(ACCELERATORS_ENV, raising=False)


def test_seeded_lookup_still_skips_replays(
    spark: SparkSession, tmp_path: Path, accelerators_on: None
) -> None:
    verified_delta(spark)
    path = tmp_path / "t"
    sink = DeltaSink(str(path), sink_id="seed", create_table=True, delta_txn_id=True)
    for b in range(3):
        sink(rows(spark, 100 * b), b)
        assert sink.last_metrics is not None
        assert sink.last_metrics.extra.get("delta_path_txn_seed") == 1, sink.last_metrics
    # The sink seeded the post-commit snapshot: a second seed finds it known.
    assert not seed_txn_lookup(spark, str(path), "seed", 2)
    jvm = spark._jvm
    assert jvm is not None
    snapshot = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(
        spark._jsparkSession, str(path)).unsafeVolatileSnapshot()
    assert not snapshot._computedStateTriggered(), "the lookup ran a state reconstruction"
    assert snapshot.transactions().get("seed").get() == 2

    # A direct write of an already committed (app id, version) is skipped by Delta...
    for version in (1, 2):
        (rows(spark, 9000).write.format("delta").mode("append").option("txnAppId", "seed")
         .option("txnVersion", str(version)).save(str(path)))
    # ...and so is a replay through a new sink (a restarted driver), while a new batch lands.
    again = DeltaSink(str(path), sink_id="seed", delta_txn_id=True)
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
    spark: SparkSession, tmp_path: Path, retention: bool, accelerators_on: None
) -> None:
    verified_delta(spark)
    path = tmp_path / "r"
    rows(spark, 0).write.format("delta").save(str(path))
    if retention:
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
                  "('delta.setTransactionRetentionDuration' = 'interval 30 days')")
    txn_write(spark, path, 100, 0)
    # Without a retention the post-commit snapshot is seeded; with one, Delta keeps its
    # own answer (its reconstruction drops expired ids).
    assert seed_txn_lookup(spark, str(path), "app", 0) is not retention
    txn_write(spark, path, 100, 0)  # a replay: skipped either way
    txn_write(spark, path, 200, 1)
    assert ids(spark, path) == list(range(300))


def _no_fast_path(spark: SparkSession, path: Path, caplog: pytest.LogCaptureFixture,
                  why: str, **options: object) -> None:
    """A delta_txn_id sink without the accelerator: one WARNING naming the cost and the
    reason, metrics saying ``txn``, Delta's own lookup still exact."""
    caplog.set_level(logging.INFO, logger="connectors")
    sink = DeltaSink(str(path), sink_id="slow", create_table=True, delta_txn_id=True,
                     **options)  # type: ignore[arg-type]
    for b in range(3):
        sink(rows(spark, 100 * b), b)
        assert sink.last_metrics is not None
        assert sink.last_metrics.extra.get("delta_path_txn") == 1, sink.last_metrics.extra
        assert "delta_path_txn_seed" not in sink.last_metrics.extra
    sink(rows(spark, 200), 2)  # a replay
    sink.close()
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "no fast path" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert why in warnings[0] and "1.9-2.2x a plain append" in warnings[0], warnings[0]
    jvm = spark._jvm
    assert jvm is not None
    snapshot = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(
        spark._jsparkSession, str(path)).unsafeVolatileSnapshot()
    assert snapshot._computedStateTriggered(), "Delta answered the lookup without its state?"
    assert ids(spark, path) == list(range(300)) and txn_version(path, "slow") == 2


def test_accelerators_off_falls_back_to_delta_with_a_warning(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ACCELERATORS_ENV, "off")
    assert seed_problem(spark) == f"{ACCELERATORS_ENV}=off"
    _no_fast_path(spark, tmp_path / "off", caplog, f"{ACCELERATORS_ENV}=off")


def test_a_digest_mismatch_falls_back_to_delta_with_a_warning(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch, accelerators_on: None,
) -> None:
    """The real check: the allow-list no longer matches the loaded class's bytes."""
    name = next(iter(_txn_seed.VERIFIED_CLASSES))
    monkeypatch.setitem(_txn_seed.VERIFIED_CLASSES, name, "0" * 64)
    monkeypatch.setattr(_txn_seed, "_tools", {})  # the JVM's verdict is cached: ask again
    problem = seed_problem(spark)
    assert problem is not None and "SHA-256 differs" in problem and name in problem
    _no_fast_path(spark, tmp_path / "mismatch", caplog, "SHA-256 differs")
    monkeypatch.undo()
    _txn_seed._tools.clear()


def test_txn_seed_false_turns_it_off_for_one_sink(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    accelerators_on: None,
) -> None:
    _no_fast_path(spark, tmp_path / "false", caplog, "txn_seed=False", txn_seed=False)


def test_the_default_path_writes_no_txn_id(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "tag"
    sink = DeltaSink(str(path), sink_id="tag", create_table=True)
    for b in range(3):
        sink(rows(spark, 100 * b), b)
        assert sink.last_metrics is not None
        assert sink.last_metrics.extra.get("delta_path_tag") == 1
    sink(rows(spark, 200), 2)  # a replay: nothing written
    sink.close()
    assert txn_version(path, "tag") is None
    assert ids(spark, path) == list(range(300))
    assert sorted(tagged_commits(path, "tag")) == [0, 1, 2]
