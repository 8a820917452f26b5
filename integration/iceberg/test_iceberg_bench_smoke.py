"""``benchmarks/iceberg_bench.py --smoke`` as a smoke test, where the Iceberg tests run (CI:
the spark41 lane; on a Spark without an Iceberg runtime this directory is not collected).

The smallest run through every contender (the plain append, IcebergSink, the plain MERGE, the
plain MERGE from the batch reduced to one row per key, IcebergSink(merge_on=...)), each
table's check (row count and sum of ids: the bench exits 1 on a lost or duplicated row), the
replay of a recorded batch (its outcome must be ``replayed``) and the chart: one Spark driver,
1 round of 1 batch of 2,000 rows after each table's batch 0. No speed is asserted, nor judged
by the benchmark (benchmarks/README.md has the measured figures and how to reproduce them).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from integration.support._driver import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.iceberg]

TIMEOUT_S = 600
CONTENDERS = ("plain", "iceberg-sink", "plain-merge", "plain-merge-dedup", "iceberg-sink-merge")


def test_iceberg_bench_smoke_mode_runs_and_checks_its_results(tmp_path: Path) -> None:
    chart = tmp_path / "iceberg_bench.png"
    args = [sys.executable, "-m", "benchmarks.iceberg_bench", "--smoke", "--chart", str(chart)]
    env = dict(os.environ)
    env.pop("CONNECTORS_CRASH_AT", None)
    # its own process group: a timeout takes its JVM down with it
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        pytest.fail(f"benchmarks.iceberg_bench --smoke ran over {TIMEOUT_S} s:\n{out[-6000:]}")
    print(out[-4000:])  # the tables, in the test's captured output
    assert proc.returncode == 0, f"benchmarks.iceberg_bench --smoke failed:\n{out[-8000:]}"
    assert "this run judges nothing" in out, "no word that the smoke run judges nothing"
    assert "not judged (--smoke)" in out
    assert "every table checked after every round (rows, sum of ids): exact" in out
    assert "once per crash: the replay of a recorded" in out, "the replay did not run"
    for name in CONTENDERS:
        assert f"| {name} " in out, f"contender {name} missing from the table"
    assert chart.stat().st_size > 0, "no chart drawn"
