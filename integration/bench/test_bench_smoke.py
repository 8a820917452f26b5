"""The benchmarks' ``--smoke`` modes as smoke tests: each runs whole, against the test
services, and checks its own results (rows written, nothing twice, nothing left prepared or
open); no speed is asserted, nor judged by the benchmark (machines are noisy;
benchmarks/README.md has the measured figures and how to reproduce them).

``--smoke`` is the smallest run through every path a benchmark has: every contender or
variant it compares (delta_bench's S3 run too), its result checks and its chart, with a few
thousand rows, 1 round and no warm-up beyond a sink's first batch; ``--quick`` (a short
benchmark, the documented figures' mode) stays as it was. Driver starts per test: one Spark
session each for postgres_bench, kafka_bench (one value size, 100 B: the one with the skewed
run), delta_bench and fanout_bench; kafka_produce_bench runs no Spark (its C loop is
compiled with the machine's gcc); connect_overhead runs each of its four sinks' examples
classic and over Spark Connect (a JVM each, a local server's for Connect: 8, as in
``--quick``, with 2 batches each instead of 15). connect_overhead's smoke run is
``EOS_WIDE_MATRIX=1`` only (``scripts/test --wide``): 170 s of CI's test time on
2026-11-29 for what test_connect proves under Spark Connect with every sink already (CI's
budget; its figures in benchmarks/README.md come from its full runs). iceberg_bench's smoke
run is integration/iceberg/test_iceberg_bench_smoke.py, in the spark41 lane: Iceberg has no
runtime for this lane's Spark.

They run in ``scripts/test``'s one pytest run, beside the other tests (CI's former bench lane
ran them alone, after everything: 578 s of wall time that 2 workers now share). Their charts
go to the test's directory, not over the committed ones. The chaos soak is not here: each
failure kind it injects has its own kill or outage test (benchmarks/README.md lists them),
and its campaigns are recorded in benchmarks/README.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from integration.support._driver import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: benchmark -> whether it draws a chart (``--chart``)
BENCHMARKS = {
    "postgres_bench": True,
    "kafka_bench": True,
    "kafka_produce_bench": False,
    "delta_bench": True,
    "fanout_bench": False,
    "connect_overhead": True,
}
TIMEOUT_S = 600


WIDE = os.environ.get("EOS_WIDE_MATRIX") == "1"
#: Smoke runs for scripts/test --wide only (the module docstring says why).
WIDE_ONLY = pytest.mark.skipif(not WIDE, reason="EOS_WIDE_MATRIX=1 only (scripts/test --wide): "
                               "CI's time budget; test_connect proves every sink under Connect")


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=[pytest.mark.connect_local, WIDE_ONLY]
                 if name == "connect_overhead" else [])
    for name in BENCHMARKS])
def test_benchmark_smoke_mode_runs_and_checks_its_results(
    name: str, tmp_path: Path, postgres_conninfo: str, kafka_bootstrap: str,
    s3_service: object,
) -> None:
    args = [sys.executable, "-m", f"benchmarks.{name}", "--smoke"]
    if BENCHMARKS[name]:
        args += ["--chart", str(tmp_path / f"{name}.png")]
    env = dict(os.environ, EOS_POSTGRES_CONNINFO=postgres_conninfo,
               EOS_KAFKA_BOOTSTRAP=kafka_bootstrap)
    env.pop("CONNECTORS_CRASH_AT", None)
    # its own process group: a timeout takes its JVMs (and a Connect server) down with it
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        pytest.fail(f"benchmarks.{name} --smoke ran over {TIMEOUT_S} s:\n{out[-6000:]}")
    print(out[-3000:])  # the tables, in the test's captured output
    assert proc.returncode == 0, f"benchmarks.{name} --smoke failed:\n{out[-8000:]}"
    assert "this run judges nothing" in out, "no word that the smoke run judges nothing"
    if BENCHMARKS[name]:
        assert (tmp_path / f"{name}.png").stat().st_size > 0, "no chart drawn"


def test_mariadb_load_smoke_mode_round_trips_every_type_and_probes_strictness(
        mariadb_url: str) -> None:
    """``benchmarks.mariadb_load --smoke`` (issue 54's driver choice, with PyMySQL, the one
    driver of the test set): every Arrow type loaded by LOAD DATA LOCAL INFILE from the
    encoder's bytes and read back value for value, and every bad value a warning as
    connectors/mariadb/_strict.py documents; it exits 1 on any difference."""
    from urllib.parse import unquote, urlsplit

    url = urlsplit(mariadb_url)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.mariadb_load", "--smoke",
                           "--driver", "pymysql", "--host", str(url.hostname), "--port",
                           str(url.port), "--user", unquote(url.username or ""), "--database",
                           url.path.lstrip("/")], cwd=REPO,
                          env=dict(os.environ, EOS_MARIADB_PASSWORD=unquote(url.password or "")),
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    assert out.count("(as documented)") >= 7, out[-4000:]


def test_mariadb_bench_smoke_mode_writes_every_contender_exactly(
        mariadb_url: str, tmp_path: Path) -> None:
    """``benchmarks.mariadb_bench --smoke`` (issue 54's speed item): MariaDBSink, the plain
    LOAD DATA and Spark's JDBC writer with Connector/J 3.5.11 (bulk protocol) and 2.7.15
    (``rewriteBatchedStatements``), one Spark each, every write checked against Spark's
    sums (it exits 1 on a difference), nothing left prepared, the chart drawn."""
    chart = tmp_path / "mariadb_bench.png"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.mariadb_bench", "--smoke",
                           "--chart", str(chart)], cwd=REPO,
                          env=dict(os.environ, EOS_MARIADB_URL=mariadb_url),
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    assert "this run judges nothing" in out, out[-4000:]
    assert out.count("exact; XA branches left prepared: 0") == 2, out[-4000:]
    assert chart.stat().st_size > 0, "no chart drawn"
