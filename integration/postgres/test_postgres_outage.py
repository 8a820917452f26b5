"""PostgreSQL restarted under a running streaming query (issue 40, item 0): the query rides
it out.

One driver run of ``examples.stream_to_postgres`` (a file source, one file per batch) writes
while PostgreSQL is restarted in ``immediate`` mode (a crash: no checkpoint, every session
cut, prepared transactions kept) several times, each after the job committed a few more
batches. Nothing restarts the job: a batch that meets the restarting server (its tasks'
COPY cut, the driver's ledger read or commit refused) runs again as a new driver run with
backoff, within the sink's ``outage_timeout``. The run ends by itself with exit 0, every row
is in the table once, every batch COMMITTED, nothing left prepared. The seconds from the
server's return to the next committed batch are printed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.postgres.test_postgres_kill import PgJob
from integration.support._outage import ride_out
from integration.support._pg import DRIVER_PGOPTIONS, PgTarget

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OUTAGES, EVERY = 4, 3


@pytest.fixture
def pg(postgres_conninfo: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[PgTarget]:
    monkeypatch.setenv("EOS_POSTGRES_CONNINFO", postgres_conninfo)  # the driver reads it
    monkeypatch.setenv("PGOPTIONS", DRIVER_PGOPTIONS)
    target = PgTarget(postgres_conninfo, prefix="outage")
    target.create_table()
    yield target
    target.cleanup()


def test_postgres_restarted_immediate_again_and_again_under_one_driver_run_is_exact(
    tmp_path: Path, pg: PgTarget, native_postgres: Any
) -> None:
    job = PgJob(tmp_path, pg, files=OUTAGES * EVERY + 4)

    def committed() -> int:
        return sum(1 for s in pg.ledger_states().values() if s == "COMMITTED")

    seen = ride_out(job, progress=committed, outages=OUTAGES, every=EVERY,
                    restart=lambda _: native_postgres.restart(mode="immediate", downtime=2.0))
    print(seen.report("PostgreSQL restarted (immediate)"))
    assert seen.run.returncode == 0, seen.run.tail()
    restarts = [m for m in seen.run.metrics() if m.get("batch_restarts")]
    assert restarts, "no batch met the restarting server (the outages came between batches?)"
    job.assert_exact()
    assert pg.prepared() == []
