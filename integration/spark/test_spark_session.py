"""The session helper against real Spark with real jars (fetched by Maven once, then cached).

Needs Java, Maven (first run only) and network access to Maven Central for the first run.
The local-cluster test runs in a subprocess: one SparkContext per process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from connectors.spark import resolve_jars

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_delta_round_trip(spark: SparkSession, tmp_path: Path) -> None:
    from delta.tables import DeltaTable

    path = str(tmp_path / "delta_table")
    spark.range(5).write.format("delta").save(path)
    spark.range(5, 8).write.format("delta").mode("append").save(path)

    rows = spark.read.format("delta").load(path).orderBy("id").collect()
    assert [r.id for r in rows] == list(range(8))
    history = DeltaTable.forPath(spark, path).history().orderBy("version").collect()
    assert [(h.version, h.operation) for h in history] == [(0, "WRITE"), (1, "WRITE")]
    # Delta's catalog and SQL extension are on: path tables work in SQL.
    assert spark.sql(f"SELECT count(*) AS n FROM delta.`{path}`").first().n == 8  # type: ignore[union-attr]


def test_kafka_source_class_loads(spark: SparkSession) -> None:
    df = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", "127.0.0.1:1")
        .option("subscribe", "no-such-topic")
        .load()
    )
    assert df.isStreaming
    assert df.schema.fieldNames() == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
    ]


def test_kafka_sink_reaches_the_kafka_client(spark: SparkSession) -> None:
    """A write to a closed port fails in kafka-clients, not with a linkage error.

    The producer is built through spark-token-provider-kafka's KafkaConfigUpdater, so this
    also proves that jar (possibly an older release, see resolve_jars) links with Spark.
    """
    df = spark.createDataFrame([("k", "v")], "key string, value string")
    with pytest.raises(Exception) as info:  # Py4JJavaError or a captured Spark error
        (
            df.write.format("kafka")
            .option("kafka.bootstrap.servers", "127.0.0.1:1")
            .option("topic", "no-such-topic")
            .option("kafka.max.block.ms", "1500")
            .save()
        )
    message = str(info.value)
    assert "org.apache.kafka.common.errors.TimeoutException" in message
    for linkage in ("NoClassDefFoundError", "ClassNotFoundException", "NoSuchMethodError"):
        assert linkage not in message


LOCAL_CLUSTER_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time

    import pyarrow as pa

    from connectors.spark import get_session


    def executor_id():
        # Walk up from this Python worker to the JVM that started it: an executor JVM is
        # CoarseGrainedExecutorBackend ... --executor-id N; in local mode it is the driver.
        pid = os.getpid()
        while pid > 1:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\\0")
            if "--executor-id" in args:
                return args[args.index("--executor-id") + 1]
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        return "driver"


    def tag(batches):
        import connectors.core.errors as errors  # executors must import the package

        eid = executor_id()
        for batch in batches:
            time.sleep(0.3)  # keep both executors busy
            n = batch.num_rows
            yield pa.RecordBatch.from_pydict(
                {
                    "id": batch.column("id"),
                    "executor": pa.array([eid] * n),
                    "module": pa.array([errors.__file__] * n),
                }
            )


    spark = get_session(
        "local-cluster-test",
        master="local-cluster[2,1,1024]",
        conf={"spark.sql.warehouse.dir": sys.argv[2]},
    )
    sc = spark.sparkContext
    try:
        deadline = time.monotonic() + 120
        # getExecutorMemoryStatus counts the driver too
        while sc._jsc.sc().getExecutorMemoryStatus().size() < 3:
            assert time.monotonic() < deadline, "executors did not register"
            time.sleep(0.2)
        # Delta's classes run in the executors' tasks: the jars reached them via spark.jars.
        spark.range(10).repartition(2).write.format("delta").save(sys.argv[1])
        delta_rows = spark.read.format("delta").load(sys.argv[1]).count()
        out = (
            spark.range(0, 64, 1, 8)
            .mapInArrow(tag, "id long, executor string, module string")
            .collect()
        )
        print("RESULT " + json.dumps({
            "app_id": sc.applicationId,
            "delta_rows": delta_rows,
            "ids": sorted(r.id for r in out),
            "executors": sorted({r.executor for r in out}),
            "modules": sorted({r.module for r in out}),
        }))
    finally:
        spark.stop()
    """
)


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs Linux /proc")
def test_local_cluster_runs_map_in_arrow_on_executor_jvms(tmp_path: Path) -> None:
    import pyspark

    resolve_jars()  # fetch outside the subprocess's timeout if needed
    env = dict(os.environ)
    # Executors must find ``connectors`` through the helper's spark.executorEnv.PYTHONPATH
    # (or an installation), not through a PYTHONPATH inherited from here.
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [sys.executable, "-c", LOCAL_CLUSTER_SCRIPT, str(tmp_path / "d"), str(tmp_path / "w")],
        cwd=REPO_ROOT,  # the driver imports connectors from here
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-5000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    # local-cluster executors log under $SPARK_HOME/work/<app id>: remove this run's.
    spark_home = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)
    shutil.rmtree(spark_home / "work" / result["app_id"], ignore_errors=True)
    with contextlib.suppress(OSError):
        (spark_home / "work").rmdir()  # only when no other run's logs are left

    assert result["delta_rows"] == 10
    assert result["ids"] == list(range(64))
    assert result["executors"] == ["0", "1"]  # two executor JVMs, never the driver
    assert len(result["modules"]) == 1
    assert result["modules"][0].endswith(os.path.join("connectors", "core", "errors.py"))


STALE_JVM_SCRIPT = textwrap.dedent(
    """
    from pyspark.sql import SparkSession
    from connectors.core.errors import ConfigurationError
    from connectors.spark import get_session

    SparkSession.builder.master("local[1]").getOrCreate().stop()  # a JVM without our jars
    try:
        get_session("stale")
    except ConfigurationError as exc:
        print("RESULT", exc)
    else:
        print("RESULT no error")
    """
)


def test_a_jvm_started_without_the_jars_is_refused_with_the_fix() -> None:
    """PySpark keeps the JVM of a stopped session: a later get_session() would silently
    lack the Delta and Kafka classes. It must say so, and how to fix it."""
    resolve_jars()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", STALE_JVM_SCRIPT], cwd=REPO_ROOT, env=env,
        capture_output=True, text=True, timeout=300, check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-5000:]
    message = lines[-1]
    assert "no delta and no kafka classes" in message, message
    assert "new Python process" in message and "before creating any other SparkSession" in message
