"""A cluster the way users deploy (issue 51, item 4): a standalone master and two workers as
separate processes, the job submitted with ``spark-submit --master spark://...``, the
library and its native clients shipped as a packed environment.

The environment is built on the submitting host as Spark's Python package management page
describes: a virtual environment with the wheel (``[postgres]``: psycopg, pgpq, pyarrow,
pandas, numpy; no pyspark, the cluster has its own), packed by ``venv-pack`` and shipped
with ``--archives env.tar.gz#environment``, ``spark.pyspark.python`` pointing into it. The
job (``submitted_job.py``, outside this repository) reports where its executors' Python
runs and which ``connectors`` they import: both lie in the unpacked archive, so the
executors use only what was shipped. Then, in one chain of two submissions:

1. the driver SIGKILLed once batch 1's decision is durable;
2. the job submitted again; in it, every executor JVM SIGKILLed while a task of batch 2
   holds its prepared transaction (the task stalls after its PREPARE), Spark relaunching
   them and retrying the tasks; the submission runs to its end.

The table then holds every id exactly once, the ledger every batch COMMITTED, and nothing
of the sink is left prepared (the killed attempt's transaction, never decided, is rolled
back by the batch's sweep).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyspark
import pytest

from connectors.core.states import CrashPoint
from connectors.testing.kill import DriverRun, point_reached, run_driver
from integration.support._pg import PgTarget
from integration.support._standalone import StandaloneCluster, conf_args, kill_executors_once
from integration.support._wheel import installed, package_wheel, user_venv

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOB = Path(__file__).with_name("submitted_job.py")
BATCHES, ROWS = 4, 500


@dataclass(frozen=True)
class Packed:
    env: Path  # the environment on the submitting host (the driver's Python)
    archive: Path  # venv-pack's archive of it, shipped to the executors


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    work = tmp_path_factory.mktemp("packed")
    wheel = package_wheel(work)
    python = user_venv(work / "env", [f"{wheel}[postgres]", "venv-pack>=0.2"])
    names = installed(python)
    assert "spark-exactly-once" in names and "pyspark" not in names, sorted(names)
    archive = work / "env.tar.gz"
    subprocess.run([str(work / "env" / "bin" / "venv-pack"), "-p", str(work / "env"),
                    "-o", str(archive)], check=True, timeout=600, capture_output=True)
    return Packed(work / "env", archive)


@pytest.fixture
def pg(postgres_conninfo: str) -> Iterator[PgTarget]:
    target = PgTarget(postgres_conninfo, prefix="submit")
    yield target
    target.cleanup()


class Submission:
    """``spark-submit`` of :data:`JOB` to ``cluster`` with ``packed``, run by
    :func:`run_driver` (its process group killed on a crash point or by the test)."""

    def __init__(self, cluster: StandaloneCluster, packed: Packed, pg: PgTarget,
                 root: Path) -> None:
        self.cluster, self.packed, self.pg, self.root = cluster, packed, pg, root
        self.outside = root / "outside"  # the driver's working directory: not this repository
        self.outside.mkdir(parents=True)
        self.job = self.outside / JOB.name
        shutil.copy(JOB, self.job)
        self.checkpoint = root / "checkpoint"
        self.crash_log = root / "crash.log"
        self.report = root / "report.json"

    def command(self, executor_env: dict[str, str]) -> list[str]:
        spark_submit = Path(pyspark.__file__).resolve().parent / "bin" / "spark-submit"
        nothing = self.root / "no-pythonpath"  # executors get no path of this repository
        nothing.mkdir(exist_ok=True)
        conf = {
            "spark.pyspark.python": "./environment/bin/python",
            "spark.pyspark.driver.python": str(self.packed.env / "bin" / "python"),
            "spark.sql.shuffle.partitions": "2",
            "spark.ui.enabled": "false",
            **{f"spark.executorEnv.{k}": v for k, v in executor_env.items()},
        }
        return [str(spark_submit), "--master", self.cluster.master_url,
                "--archives", f"{self.packed.archive}#environment",
                *self.cluster.driver_conf(pythonpath=nothing), *conf_args(conf), str(self.job)]

    def run(self, batches: int = BATCHES, *, crash: str | None = None,
            executor_env: dict[str, str] | None = None, timeout: float = 420) -> DriverRun:
        args = ["--conninfo", self.pg.conninfo, "--table", self.pg.table,
                "--ledger-table", self.pg.ledger,
                "--sink-id", self.pg.sink_id, "--checkpoint", str(self.checkpoint),
                "--batches", str(batches), "--rows-per-batch", str(ROWS),
                "--report", str(self.report)]
        env = {"PYSPARK_PYTHON": "./environment/bin/python",
               "PYSPARK_DRIVER_PYTHON": str(self.packed.env / "bin" / "python")}
        return run_driver(args, command=self.command(executor_env or {}), crash=crash,
                          crash_log=self.crash_log, root=self.outside, env=env,
                          timeout=timeout)


def test_submitted_with_a_packed_environment_driver_and_executors_killed_then_exact(
    cluster: StandaloneCluster, packed: Packed, pg: PgTarget, tmp_path: Path
) -> None:
    sub = Submission(cluster, packed, pg, tmp_path)

    # 1. The driver SIGKILLed once batch 1's decision is durable.
    first = sub.run(crash=f"{CrashPoint.AFTER_DECISION.value}:batch=1:sink={pg.sink_id}")
    assert point_reached(sub.crash_log, CrashPoint.AFTER_DECISION, pg.sink_id, 1), (
        f"{first.tail()}\n{cluster.executor_logs()}")
    assert first.returncode != 0, first.tail()
    report = json.loads(sub.report.read_text())
    assert report["master"] == cluster.master_url
    assert report["driver"][0] == str(packed.env / "bin" / "python")
    executors = report["executors"]
    assert executors, report
    for executable, module in executors:
        # .../work/app-<id>/<executor>/environment/bin/python: the unpacked archive
        assert executable.endswith("/environment/bin/python"), executors
        assert str(cluster.work_dir) in executable, executors
        assert module.startswith(executable.rsplit("/bin/python", 1)[0] + "/lib/"), executors
    cluster.wait_apps_gone()

    # 2. Submitted again; every executor JVM SIGKILLed while batch 2's task 0 holds its
    # prepared transaction.
    once = tmp_path / "stall-once"
    stall = (f"{CrashPoint.AFTER_PRECOMMIT.value}:batch=2:partition=0:action=stall:"
             f"seconds=40:once={once}")
    killer, killed = kill_executors_once(cluster, once)
    second = sub.run(executor_env={"CONNECTORS_TEST_MODE": "1", "CONNECTORS_CRASH_AT": stall,
                                   "CONNECTORS_CRASH_LOG": str(sub.crash_log)})
    killer.join(timeout=10)
    assert once.exists(), f"the task never stalled:\n{second.tail()}\n{cluster.executor_logs()}"
    assert killed, "no executor JVM was found to kill"
    assert second.returncode == 0, f"{second.tail()}\n{cluster.executor_logs()}"
    assert "lost" in second.output.lower(), second.tail()  # Spark saw its executors die
    pg.assert_exact(BATCHES * ROWS)
    states = pg.ledger_states()
    assert states == dict.fromkeys(range(BATCHES), "COMMITTED"), states
    assert pg.prepared() == []
