"""``connectors submit-args`` on a real ``spark-submit``: the job builds its own session (no
``get_session``), the master is the command line's, and the components arrive through the
printed ``--packages``/``--conf`` line alone (Spark's Ivy fetches them from Maven Central,
then keeps them in its cache)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

JOB = textwrap.dedent("""
    import json
    import sys

    from pyspark.sql import SparkSession

    from connectors.delta import DeltaSink

    table = sys.argv[1]
    spark = SparkSession.builder.appName("submit-args").getOrCreate()  # the user's own
    conf = spark.sparkContext.getConf()
    sink = DeltaSink(table, sink_id="submitted", create_table=True)
    rows = spark.range(0, 100).toDF("id")
    sink(rows, 0)  # a batch job's run 0
    sink(rows, 0)  # run 0 again (a retried job): nothing twice
    sink.close()
    print("JOB " + json.dumps({"master": conf.get("spark.master"),
                               "packages": conf.get("spark.jars.packages", ""),
                               "jars": conf.get("spark.jars", "")}))
    spark.stop()
""")


def test_a_spark_submit_job_gets_delta_from_the_printed_line_alone(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_DIRS=str(tmp_path / "scratch"))
    printed = subprocess.run(
        [sys.executable, "-m", "connectors", "submit-args", "--components", "delta", "--json"],
        env=env, capture_output=True, text=True, timeout=600, check=True)
    args = json.loads(printed.stdout)
    assert args[0] == "--packages" and args[1].startswith("io.delta:delta-spark_")
    assert "--master" not in args

    job = tmp_path / "job.py"
    job.write_text(JOB)
    table = tmp_path / "table"
    submit = Path(sys.executable).parent / "spark-submit"
    run = subprocess.run([str(submit), "--master", "local[2]", *args, str(job), str(table)],
                         env=env, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, (run.stdout + run.stderr)[-5000:]
    (line,) = [ln for ln in run.stdout.splitlines() if ln.startswith("JOB ")]
    seen = json.loads(line[4:])
    assert seen["master"] == "local[2]"  # the command line's, not a helper's
    # spark-submit's Ivy resolved the coordinates into jars of its own cache: none of ours
    jars = seen["jars"].split(",")
    assert any("delta-spark_" in j for j in jars), jars
    assert not any(".cache/connectors" in j for j in jars), jars

    from deltalake import DeltaTable

    ids = DeltaTable(str(table)).to_pyarrow_table().column("id").to_pylist()
    assert sorted(ids) == list(range(100))  # row by row: every id once
