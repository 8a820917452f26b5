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

from pathlib import Path

import pytest

from integration.postgres.test_postgres_kill import PgJob, pg_own  # noqa: F401 - the fixture
from integration.support._fixtures_services import NativePostgres
from integration.support._outage import ride_out, started_while_down
from integration.support._pg import PgTarget

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OUTAGES, EVERY = 4, 3
#: Seconds PostgreSQL stays down after the query asked for it (first contact).
DOWN_AFTER_FIRST_CONTACT = 10.0


def test_postgres_restarted_immediate_again_and_again_under_one_driver_run_is_exact(
    tmp_path: Path, pg_own: PgTarget, native_postgres: NativePostgres  # noqa: F811
) -> None:
    job = PgJob(tmp_path, pg_own, files=OUTAGES * EVERY + 4)

    def committed() -> int:
        return sum(1 for s in pg_own.ledger_states().values() if s == "COMMITTED")

    seen = ride_out(job, progress=committed, outages=OUTAGES, every=EVERY,
                    restart=lambda _: native_postgres.restart(mode="immediate", downtime=2.0))
    print(seen.report("PostgreSQL restarted (immediate)"))
    assert seen.run.returncode == 0, seen.run.tail()
    restarts = [m for m in seen.run.metrics() if m.get("batch_restarts")]
    assert restarts, "no batch met the restarting server (the outages came between batches?)"
    job.assert_exact()
    assert pg_own.prepared() == []


def test_a_query_started_while_postgresql_is_down_waits_for_it_then_is_exact(
    tmp_path: Path, pg_own: PgTarget, native_postgres: NativePostgres  # noqa: F811
) -> None:
    """The first contact of the driver (and of its sinks' settings) meets no server: that
    is a server that may be restarting, not a wrong setting (libpq's PQping says nothing
    answers): the batch waits within ``outage_timeout`` and lands once PostgreSQL is back.
    PostgreSQL is stopped before the driver starts and started 10 s after the query's
    first batch is in Spark's offset log (the sink is calling it by then)."""
    job = PgJob(tmp_path, pg_own, files=3)
    run, after = started_while_down(job, stop=lambda: native_postgres.stop(mode="immediate"),
                                    start=native_postgres.start,
                                    down_after=DOWN_AFTER_FIRST_CONTACT)
    assert run.returncode == 0, run.tail()
    first = run.batch_metrics(pg_own.sink_id, 0)
    assert int(first.get("batch_restarts", "0")) >= 1, run.tail()
    assert "TargetDownError" in run.output and "no PostgreSQL server answers" in run.output
    print(f"first contact with PostgreSQL down: the run ended {after:.1f} s "
          f"after its return; batch 0 ran {int(first['batch_restarts']) + 1} time(s)")
    job.assert_exact()
    assert pg_own.prepared() == []
