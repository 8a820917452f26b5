"""PostgresSink under Spark's own speculation, on a real standalone cluster.

The same set-up as ``test_speculation.py`` (two one-core workers on different loopback
hosts, so Spark launches speculative copies; a straggler stalls 25 s before its PREPARE),
with the PostgreSQL job, as a callable and in its DataSource form: exactly one prepared
transaction per partition is decided and committed, the loser's never, and nothing stays
prepared once a restart reconciled. And the chaos soak's executor failure: every executor
JVM SIGKILLed while a task holds its prepared transaction.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from connectors.core.naming import TransactionId
from integration.core.test_speculation import (
    STALLED_BATCH,
    _add_input_file,
    run_with_a_straggler,
)
from integration.postgres.test_postgres_datasource import DataSourceJob
from integration.postgres.test_postgres_kill import FILES, PgJob
from integration.support._pg import DRIVER_PGOPTIONS, PgTarget
from integration.support._standalone import (
    StandaloneCluster,
    executor_env_conf,
    kill_executors_once,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def pg(postgres_conninfo: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[PgTarget]:
    monkeypatch.setenv("EOS_POSTGRES_CONNINFO", postgres_conninfo)
    monkeypatch.setenv("PGOPTIONS", DRIVER_PGOPTIONS)
    target = PgTarget(postgres_conninfo, prefix="spec")
    target.create_table()
    yield target
    target.cleanup()


@pytest.mark.parametrize("form", ["callable", "datasource"])
def test_speculative_attempts_prepare_but_only_the_accepted_one_commits(
    cluster: StandaloneCluster, pg: PgTarget, tmp_path: Path, form: str
) -> None:
    """In the DataSource form the commit worker decides the messages of the attempts
    Spark accepted; the loser's transaction is never decided either."""
    job = PgJob(tmp_path, pg) if form == "callable" else DataSourceJob(tmp_path, pg)
    _run, attempts = run_with_a_straggler(job, cluster, PGOPTIONS=DRIVER_PGOPTIONS)
    listing = "\n".join(map(str, attempts))
    part0 = [a for a in attempts if a.batch == STALLED_BATCH and a.index == 0]
    assert any(a.speculative for a in part0), f"no speculative copy of the straggler:\n{listing}"

    # The decision of the stalled batch: one transaction per partition, each from an
    # attempt Spark accepted; the losing attempt of partition 0 is never decided.
    decided = [TransactionId.parse(t) for t in pg.decided_transactions(STALLED_BATCH)]
    assert all(t is not None for t in decided)
    accepted = {a.task_id for a in attempts if a.batch == STALLED_BATCH and a.reason == "Success"}
    decided_attempts = {t.task_attempt_id for t in decided if t is not None}
    assert decided_attempts <= accepted, f"{decided_attempts} vs accepted {accepted}:\n{listing}"
    assert len(decided) == len({a.index for a in attempts if a.batch == STALLED_BATCH})

    # A straggler may prepare after the last sweep: a restart that runs one more batch
    # reconciles it (rolled back: no decision lists it), then the table is exact.
    cluster.wait_apps_gone()
    _add_input_file(job)
    final = job.run()
    assert final.returncode == 0, final.tail()
    assert STALLED_BATCH in pg.ledger_states() and FILES in pg.ledger_states()
    job.assert_exact()
    assert pg.prepared() == []


#: The executor kill below runs in wide runs only: CI's default run has the same kill (every
#: executor JVM SIGKILLed while a task holds its prepared transaction, then exact and
#: nothing prepared) in integration/spark/test_cluster_submit.py, on a job submitted with
#: spark-submit and a packed environment (CI's time budget: one proof, not two).
WIDE = os.environ.get("EOS_WIDE_MATRIX") == "1"


@pytest.mark.skipif(not WIDE, reason="EOS_WIDE_MATRIX=1 only (CI's time budget): CI's "
                    "default run kills every executor JVM while a task holds its prepared "
                    "transaction in integration/spark/test_cluster_submit.py")
def test_executor_jvms_sigkilled_while_a_task_holds_its_prepared_transaction_then_exact(
    cluster: StandaloneCluster, pg: PgTarget, tmp_path: Path
) -> None:
    """The chaos soak's executor failure as a test of its own: the task of partition 0 in
    batch 1 stalls (once) right after its PREPARE; then every executor JVM of the cluster
    is SIGKILLed. The master starts new executors, Spark runs the lost tasks again, the
    batch is decided from the attempts it accepted; the orphaned attempt's prepared
    transaction is never decided and is rolled back (at the latest by the restart's
    reconciliation). Exact, nothing left prepared."""
    job = PgJob(tmp_path, pg)
    once = tmp_path / "stall-once"
    stall = f"after_precommit:batch=1:partition=0:action=stall:seconds=40:once={once}"
    killer, killed = kill_executors_once(cluster, once, timeout=240)
    run = job.run(
        "--master", cluster.master_url, *cluster.driver_conf(),
        *executor_env_conf(CONNECTORS_TEST_MODE="1", CONNECTORS_CRASH_AT=stall,
                           CONNECTORS_CRASH_LOG=str(job.crash_log), PGOPTIONS=DRIVER_PGOPTIONS),
        timeout=300,
    )
    killer.join(timeout=10)
    assert once.exists(), f"the task never stalled:\n{run.tail()}\n{cluster.executor_logs()}"
    assert killed, "no executor JVM was found to kill"
    assert run.returncode == 0, f"{run.tail()}\n{cluster.executor_logs()}"
    assert "executor" in run.output.lower() and "lost" in run.output.lower(), run.tail()
    decided = {str(t) for t in pg.decided_transactions(1)}
    assert decided and not decided & {str(t) for t in pg.prepared()}, (decided, pg.prepared())
    # The orphaned attempt may prepare after the run's last sweep: a restart that runs one
    # more batch reconciles it (rolled back: no decision lists it), then the table is exact.
    cluster.wait_apps_gone()
    _add_input_file(job)
    final = job.run()
    assert final.returncode == 0, final.tail()
    job.assert_exact()
    assert pg.prepared() == []
