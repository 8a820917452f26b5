"""The components' jars and settings for a session or ``spark-submit`` line of the user's
(:mod:`connectors.spark.jars._submit`): no master, no tuning, the coordinates on the class
path (a substitution included). A stamped jar cache stands in for Maven (none is run)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pyspark
import pytest
from pyspark.sql import SparkSession

import connectors.spark as cs
from connectors.spark.jars import _components, submit_line

SPARK = pyspark.__version__
SCALA = _components._scala_binary_version(_components.pyspark_home() / "jars")  # 2.12 on 3.5
KAFKA = f"org.apache.spark:spark-sql-kafka-0-10_{SCALA}:{SPARK}"
# Delta's line for this Spark (3.3 on 3.5, 4.4 on 4.x): one release asked, one substituted
LINE = "4.4" if _components.version_tuple(SPARK) >= (4,) else "3.3"
WANT, SUB = f"{LINE}.1", f"{LINE}.0"
DELTA_KEY = f"io.delta:{_components._delta_artifact_id(WANT, SPARK, SCALA)}"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Kafka and Delta (x.y.1 asked, x.y.0 substituted) resolved already; no Maven on PATH."""
    for var in ("EOS_MVN", "EOS_MAVEN_REPO", "SPARK_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("EOS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("EOS_DELTA_VERSION", WANT)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # any Maven call would fail
    jars = tmp_path / "cache" / "jars"
    kafka = jars / f"kafka-{SPARK}_{SCALA}"
    kafka.mkdir(parents=True)
    (kafka / "spark-sql-kafka.jar").write_bytes(b"jar")
    (kafka / ".complete.json").write_text(json.dumps({"jars": ["spark-sql-kafka.jar"]}))
    delta = jars / f"delta-{WANT}-spark{SPARK}_{SCALA}"
    delta.mkdir()
    (delta / "delta-spark.jar").write_bytes(b"jar")
    (delta / ".complete.json").write_text(json.dumps({
        "jars": ["delta-spark.jar"], "substituted": {DELTA_KEY: SUB},
        "substituted_from": {DELTA_KEY: WANT}}))
    return jars


def test_packages_name_the_coordinates_on_the_class_path_and_deltas_settings(
        cache: Path) -> None:
    conf = cs.spark_conf(["delta", "kafka"], packages=True)
    assert conf == {
        "spark.jars.packages": f"{DELTA_KEY}:{SUB},{KAFKA}",  # the substitution, not WANT
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    }
    # nothing of get_session's local defaults: the cluster's master and tuning are the user's
    assert not any(k in conf for k in ("spark.master", "spark.app.name", "spark.ui.enabled",
                                       "spark.sql.shuffle.partitions"))


def test_jars_are_the_cached_local_paths(cache: Path) -> None:
    assert cs.spark_conf(["kafka"]) == {
        "spark.jars": str(cache / f"kafka-{SPARK}_{SCALA}" / "spark-sql-kafka.jar")}
    assert cs.spark_conf([]) == {}


def test_submit_args_and_the_printed_line(cache: Path) -> None:
    args = cs.submit_args(["delta", "kafka"])
    assert args == ["--packages", f"{DELTA_KEY}:{SUB},{KAFKA}",
                    "--conf", "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension",
                    "--conf", "spark.sql.catalog.spark_catalog="
                    "org.apache.spark.sql.delta.catalog.DeltaCatalog"]
    assert shlex.split(submit_line(["delta", "kafka"])) == args
    jars = cs.submit_args("kafka", packages=False)
    assert jars == ["--jars", str(cache / f"kafka-{SPARK}_{SCALA}" / "spark-sql-kafka.jar")]


def test_configure_keeps_the_users_master_and_settings(cache: Path) -> None:
    builder = SparkSession.builder.master("spark://cluster:7077")
    builder = builder.config("spark.executor.cores", "4")
    try:
        out = cs.configure(builder, ["delta"], packages=True)
        options = {k: str(v) for k, v in out._options.items()}
        assert options["spark.master"] == "spark://cluster:7077"
        assert options["spark.executor.cores"] == "4"
        assert options["spark.jars.packages"] == f"{DELTA_KEY}:{SUB}"
        assert options["spark.sql.catalog.spark_catalog"].endswith("DeltaCatalog")
    finally:
        builder._options.clear()  # the builder is a process-wide singleton


def test_the_cli_prints_the_line_and_the_json(
        cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from connectors.cli import DEFAULT_SPARK_COMPONENTS, main

    assert DEFAULT_SPARK_COMPONENTS == cs.DEFAULT_COMPONENTS
    assert main(["submit-args"]) == 0
    line = capsys.readouterr().out.strip()
    assert shlex.split(line) == cs.submit_args(["delta", "kafka"])
    assert main(["submit-args", "--components", "kafka", "--jars", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        "--jars", str(cache / f"kafka-{SPARK}_{SCALA}" / "spark-sql-kafka.jar")]
    assert main(["submit-args", "--components", "nope"]) == 2
    assert "Unknown Spark component 'nope'" in capsys.readouterr().err
