"""The wheel where the platform brings Spark (issue 51, item 1): pyspark importable from a
path but no pip distribution, as on Databricks or a cluster image with ``$SPARK_HOME``.

The package's wheel goes into a clean virtual environment with the extras a user names
(``[postgres,kafka,delta]``, none named for Spark): pip must install neither pyspark nor
delta-spark. Then:

- with nothing on the path, the Spark-facing sinks refuse to be built (and
  ``connectors.spark``'s names to load) with an error that names the supported range and
  how to get a pyspark;
- with the platform's pyspark and py4j on ``PYTHONPATH`` only (their package directories,
  no ``.dist-info``: ``importlib.metadata`` knows no pyspark), a PostgresSink batch job and
  a DeltaSink batch job run through ``get_session`` and land exactly once, each run twice
  (a retried job: nothing twice), Delta's Python API coming from Delta's own jar; the
  operator's CLI, run without any pyspark, finds nothing of the sink left prepared.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
from pathlib import Path

import psycopg
import pyspark
import pytest

from connectors.spark._require import SPARK_RANGE
from integration.support._wheel import clean_environ, installed, package_wheel, user_venv

pytestmark = pytest.mark.integration

REFUSED = textwrap.dedent("""
    import json, sys
    from connectors import DeltaSink, KafkaSink
    from connectors.core.errors import DependencyError
    out = {}
    for name, build in (("KafkaSink", lambda: KafkaSink("t", {"bootstrap.servers": "x:1"},
                                                        sink_id="k")),
                        ("DeltaSink", lambda: DeltaSink("/tmp/t", sink_id="d")),
                        ("get_session", lambda: __import__("connectors.spark").spark.get_session)):
        try:
            build()
            out[name] = "built"
        except DependencyError as exc:
            out[name] = str(exc)
    out["pyspark_loaded"] = "pyspark" in sys.modules
    print("REFUSED " + json.dumps(out))
""")

JOB = textwrap.dedent("""
    import importlib.metadata, json, sys
    try:
        importlib.metadata.version("pyspark")
        dist = True
    except importlib.metadata.PackageNotFoundError:
        dist = False
    import pyspark
    from connectors import DeltaSink, PostgresSink
    from connectors.spark import get_session

    conninfo, table, delta_path, tag = sys.argv[1:5]
    spark = get_session("provided", components=["delta"])
    import delta
    rows = spark.range(0, 500).selectExpr("id", "concat('n', id) AS name")
    pg = PostgresSink(conninfo, table, sink_id=f"provided-pg-{tag}", create_table=True)
    dl = DeltaSink(delta_path, sink_id=f"provided-delta-{tag}", create_table=True)
    for sink in (pg, dl):
        sink(rows, 0)  # a batch job's run 0
        sink(rows, 0)  # run 0 again (a retried job): nothing twice
        sink.close()
    ids = sorted(r.id for r in spark.read.format("delta").load(delta_path).collect())
    print("JOB " + json.dumps({
        "pyspark_distribution": dist, "pyspark": pyspark.__version__,
        "pyspark_file": pyspark.__file__, "delta_file": delta.__file__,
        "delta_ids": ids == list(range(500)), "delta_rows": len(ids)}))
    spark.stop()
""")


def _provided(tmp_path: Path) -> Path:
    """A directory holding pyspark and py4j as a platform provides them: the packages
    only, no distribution metadata."""
    import py4j

    root = tmp_path / "platform-python"
    root.mkdir()
    for module in (pyspark, py4j):
        package = Path(module.__file__).resolve().parent
        (root / package.name).symlink_to(package, target_is_directory=True)
    return root


def test_the_wheel_runs_on_a_platforms_pyspark_and_refuses_clearly_without_one(
    tmp_path: Path, postgres_conninfo: str
) -> None:
    wheel = package_wheel(tmp_path)
    env_dir = tmp_path / "env"
    python = user_venv(env_dir, [f"{wheel}[postgres,kafka,delta]"])
    clean = clean_environ()
    names = installed(python)
    assert "spark-exactly-once" in names
    assert not {"pyspark", "delta-spark", "py4j"} & names, sorted(names)

    outside = tmp_path / "outside"  # not the repository: the installed wheel is imported
    outside.mkdir()

    # No pyspark anywhere: a clear refusal, and the operator's CLI still answers.
    refused = subprocess.run([str(python), "-c", REFUSED], cwd=outside, env=clean,
                             capture_output=True, text=True, timeout=300, check=True)
    (line,) = [ln for ln in refused.stdout.splitlines() if ln.startswith("REFUSED ")]
    found = json.loads(line.removeprefix("REFUSED "))
    assert found.pop("pyspark_loaded") is False
    for name, message in found.items():
        assert SPARK_RANGE in message, (name, message)
        assert "pip install 'spark-exactly-once[spark]'" in message, (name, message)
        assert "no pyspark module can be imported" in message, (name, message)
    # The platform's pyspark, on PYTHONPATH only: both sinks run, exactly once.
    tag = f"{int(time.time())}_{os.getpid()}"
    table = f"public.provided_{tag}"
    job = outside / "job.py"
    job.write_text(JOB)
    run_env = dict(clean, PYTHONPATH=str(_provided(tmp_path)),
                   SPARK_LOCAL_DIRS=str(tmp_path / "scratch"))
    run = subprocess.run([str(python), str(job), postgres_conninfo, table,
                          str(tmp_path / "delta-table"), tag], cwd=outside, env=run_env,
                         capture_output=True, text=True, timeout=900, check=False)
    assert run.returncode == 0, run.stderr[-4000:]
    (line,) = [ln for ln in run.stdout.splitlines() if ln.startswith("JOB ")]
    got = json.loads(line.removeprefix("JOB "))
    assert got["pyspark_distribution"] is False  # importable, but no pip distribution
    assert got["pyspark"] == pyspark.__version__
    assert got["pyspark_file"].startswith(str(tmp_path / "platform-python"))
    assert got["delta_file"].endswith(".jar/delta/__init__.py"), got["delta_file"]
    assert got["delta_ids"] is True and got["delta_rows"] == 500
    with psycopg.connect(postgres_conninfo, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute(f"SELECT id FROM {table} ORDER BY id")]
    assert ids == list(range(500))
    # Nothing left prepared, as the operator's CLI sees it (run without any pyspark).
    status = subprocess.run([str(env_dir / "bin" / "connectors"), "status", "--postgres",
                             postgres_conninfo, "--sink-id", f"provided-pg-{tag}", "--json"],
                            cwd=outside, env=clean, capture_output=True, text=True,
                            timeout=120, check=False)
    assert status.returncode == 0, status.stderr
    (entry,) = json.loads(status.stdout)
    assert entry["lingering"] == [], entry
