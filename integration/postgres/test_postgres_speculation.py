"""PostgresSink under Spark's own speculation, on a real standalone cluster.

The same set-up as ``test_speculation.py`` (two one-core workers on different loopback
hosts, so Spark launches speculative copies; a straggler stalls 25 s before its PREPARE),
with the PostgreSQL job, as a callable and in its DataSource form: exactly one prepared
transaction per partition is decided and committed, the loser's never, and nothing stays
prepared once a restart reconciled.
"""

from __future__ import annotations

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
from integration.support._standalone import StandaloneCluster

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
