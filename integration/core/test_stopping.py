"""Stopping a running query, gracefully or plainly, in every phase of a batch (issue 24).

Each test runs one streaming job (rate source) into one sink and stops it once per batch,
each stop in the next phase of its plan, as a deploy would: a SIGTERM to the driver, which
installed ``connectors.stop_on_sigterm`` (``--on-sigterm graceful``) or turns it into a
plain ``query.stop()`` (``--on-sigterm plain``). Each restart is the next stop's run; the
last run goes to the end, and the target is checked row by row.

A stop must land *in* its phase: the phase's crash point is armed with a stall (the point
is held ``STALL_SECONDS``), and the SIGTERM is sent only once the crash log shows the point
reached for that batch (a stop that lands between batches would prove nothing). After each
stop:

- the driver exited 0 (the stop was handled, nothing crashed);
- nothing is left: no prepared transaction of the sink in ``pg_prepared_xacts``, every
  Kafka output and marker partition has its last stable offset at the high watermark, no
  Delta intent without its batch and every batch in the table whole;
- after a graceful stop, the batch in flight is in Spark's commit log and the next is not
  (it was refused before any side effect and is replayed by the restart).

DeltaSink on ``s3a://`` (the S3 service; ledger and lease as objects beside the tables, the
tables read back with delta-rs) is stopped gracefully too: each stop leaves the lease
object ``released``, so the restart takes it at once (no takeover after the expiry).

CI runs one stop per phase per sink (plain where the issue's report was: after the
prepare); ``EOS_WIDE_MATRIX=1`` runs each kind of stop at every phase, three times. A
driver start is most of a stop's cost, so CI stops no phase twice: DeltaSink's graceful
stop after the decision is the ``s3a://`` job's (whose checks after it are a superset of
the local job's: every sink's ledger whole, no intent, the lease released, the rows), not
the local job's too.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from connectors.sdk import CrashPoint
from integration.delta.test_delta_kill import APPEND, COLUMNS, MERGE, DeltaJob
from integration.delta.test_delta_s3 import S3DeltaJob
from integration.kafka.test_kafka_kill import KafkaJob
from integration.postgres.test_postgres_kill import PgJob, pg  # noqa: F401 - the pg fixture
from integration.support._delta import intent_batches, rate_rows, table_rows
from integration.support._driver import KillJob, spark_batches
from integration.support._kafka import KafkaTarget, target_fixture
from integration.support._pg import PgTarget

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WIDE = os.environ.get("EOS_WIDE_MATRIX") == "1"
STALL_SECONDS = 2.0
#: The first stop lands in batch 1 (batch 0 also creates tables and topics).
FIRST = 1
ROWS = 200
BT, BP, AP = CrashPoint.BEFORE_TASKS, CrashPoint.BEFORE_PRECOMMIT, CrashPoint.AFTER_PRECOMMIT
BD, AD = CrashPoint.BEFORE_DECISION, CrashPoint.AFTER_DECISION
BC, AC = CrashPoint.BETWEEN_COMMITS, CrashPoint.AFTER_COMMIT
G, P = "graceful", "plain"

#: One stop per phase per sink: before the tasks, in the tasks, after the prepare, at the
#: decision, after it, during the commits (where the family has it).
PG_CI = [(G, BT), (G, BP), (P, AP), (G, BD), (G, AD), (G, BC)]
KAFKA_CI = [(G, BT), (P, BP), (G, AP), (G, BD), (G, AC)]
#: DeltaSink's graceful stop after the decision: S3_DELTA_PLAN (on s3a://) in CI.
DELTA_CI = [(G, BT), (P, BD)]


def wide(points: list[CrashPoint]) -> list[tuple[str, CrashPoint]]:
    """Each kind of stop at every point, three times."""
    return [(kind, p) for kind in (G, P) for p in points for _ in range(3)]


PG_PLAN = wide([BT, BP, AP, BD, AD, BC]) if WIDE else PG_CI
KAFKA_PLAN = wide([BT, BP, AP, BD, AC]) if WIDE else KAFKA_CI
DELTA_PLAN = wide([BT, BD, AD, AC]) if WIDE else DELTA_CI
#: On s3a://, graceful stops: after the decision (CI: DeltaSink's one stop there);
#: every phase once (wide).
S3_DELTA_PLAN = [(G, p) for p in (BT, BD, AD, AC)] if WIDE else [(G, AD)]


@dataclass
class Stopped:
    """What one stop left: its kind, point and batch, and Spark's checkpoint after it."""

    kind: str
    point: CrashPoint
    batch: int
    offsets: set[int]
    commits: set[int]


def stop_chain(job: KillJob, sink_id: str, plan: list[tuple[str, CrashPoint]],
               nothing_left: Callable[[Stopped], None], *,
               extra: tuple[str, ...] = (), first: int = FIRST) -> list[Stopped]:
    """Stop ``job`` once per batch, from batch ``first``, each stop at the next ``(kind,
    point)`` of ``plan``; check each stop; then run the job to its end. (``first``: a job
    that ran, or was killed, before: the first batch its checkpoint has not planned.)"""
    stops = []
    for i, (kind, point) in enumerate(plan):
        batch = first + i
        spec = (f"{point.value}:batch={batch}:sink={sink_id}:action=stall:"
                f"seconds={STALL_SECONDS}:once={job.root / f'stall-{i}'}")

        def landed(point: CrashPoint = point, batch: int = batch) -> bool:
            return job.reached(point, batch, sink_id=sink_id)

        run = job.run(*extra, "--on-sigterm", kind, crash=spec, kill_after=0.0,
                      kill_when=landed, kill_signal=signal.SIGTERM)
        where = f"{kind} stop at {point.value}, batch {batch}"
        assert landed(), f"{where}: the point was not reached\n{run.tail()}"
        assert run.returncode == 0, f"{where}: exit {run.returncode}\n{run.tail()}"
        offsets, commits = spark_batches(job.checkpoint)
        stopped = Stopped(kind, point, batch, offsets, commits)
        if kind == G:
            assert batch in commits, f"{where}: the batch in flight was not committed"
            assert batch + 1 not in commits, f"{where}: a batch after the stop ran\n{run.tail()}"
        nothing_left(stopped)
        stops.append(stopped)
    final = job.run(*extra)
    assert final.returncode == 0, final.tail()
    return stops


def batches_for(plan: list[tuple[str, CrashPoint]], first: int = FIRST) -> int:
    """Batches of the job: one per stop from ``first``, one after the last stop."""
    return first + len(plan) + 1


# ---- PostgreSQL ---------------------------------------------------------------------------

def pg_job(root: Path, target: PgTarget, plan: list[tuple[str, CrashPoint]]) -> PgJob:
    job = PgJob(root, target, source="rate")
    job.batches, job.rows_per_batch = batches_for(plan), ROWS
    job.total = job.batches * ROWS
    return job


def pg_nothing_left(target: PgTarget) -> Callable[[Stopped], None]:
    def check(stopped: Stopped) -> None:
        assert target.prepared() == [], (
            f"{stopped.kind} stop at {stopped.point.value}: prepared transactions left: "
            f"{target.prepared()}")
    return check


def test_postgres_stopped_in_every_phase_leaves_nothing_and_restarts_exactly(
        tmp_path: Path, pg: PgTarget) -> None:  # noqa: F811 - the pg fixture
    job = pg_job(tmp_path, pg, PG_PLAN)
    stop_chain(job, pg.sink_id, PG_PLAN, pg_nothing_left(pg))
    job.assert_exact()
    assert pg.prepared() == []


# ---- Kafka --------------------------------------------------------------------------------
kafka = target_fixture("stop")


def test_kafka_stopped_in_every_phase_leaves_nothing_and_restarts_exactly(
        tmp_path: Path, kafka: KafkaTarget) -> None:
    job = KafkaJob(tmp_path, kafka, source="rate")
    job.batches, job.rows_per_batch = batches_for(KAFKA_PLAN), ROWS
    job.total = job.batches * ROWS

    def nothing_left(stopped: Stopped) -> None:
        kafka.assert_no_open_transactions()

    stop_chain(job, kafka.sink_id, KAFKA_PLAN, nothing_left)
    job.assert_exact()


# ---- Delta --------------------------------------------------------------------------------
def test_delta_stopped_in_every_phase_leaves_nothing_and_restarts_exactly(
        tmp_path: Path, spark: Any) -> None:
    batches = batches_for(DELTA_PLAN)
    job = DeltaJob(tmp_path, source="rate", rows=ROWS, batches=batches)

    def nothing_left(stopped: Stopped) -> None:
        # A plain stop may interrupt the Delta commit after its intent (the tag path's
        # record that the history must be asked): the next start settles it. Nothing is
        # open in Delta either way.
        intents = intent_batches(job.a, APPEND)
        assert intents == [] if stopped.kind == G else set(intents) <= {stopped.batch}, intents
        # Whole batches only: the table holds batches 0..n-1 for some n, nothing partial.
        got = table_rows(spark, job.a, COLUMNS[:3])
        assert len(got) % ROWS == 0, f"a partial batch: {len(got)} rows"
        assert got == rate_rows(len(got)), "the table differs from whole batches"
        if stopped.kind == G:
            assert len(got) == (stopped.batch + 1) * ROWS

    stop_chain(job, APPEND, DELTA_PLAN, nothing_left)
    job.assert_exact(spark)


def test_delta_on_s3a_stopped_gracefully_releases_the_lease_and_restarts_exactly(
        tmp_path: Path, s3_service: Any) -> None:
    job = S3DeltaJob(tmp_path, s3_service, source="rate", rows=ROWS,
                     batches=batches_for(S3_DELTA_PLAN))
    t = job.tables

    def nothing_left(stopped: Stopped) -> None:
        where = f"graceful stop at {stopped.point.value}, batch {stopped.batch}"
        for uri, sink in ((job.a, APPEND), (job.b, MERGE)):  # the batch finished in both
            ledger = t.ledger_batches(uri, sink)
            assert sorted(ledger) == list(range(stopped.batch + 1)), (where, sink, ledger)
            assert all(ledger.values()) and t.intent_batches(uri, sink) == [], (where, sink)
            lease = t.lease(uri, sink)
            assert lease is not None and lease["released"] is True, (where, sink, lease)
        got = t.rows(job.a, COLUMNS[:3])
        assert got == rate_rows((stopped.batch + 1) * ROWS), f"{where}: table a differs"

    stop_chain(job, APPEND, S3_DELTA_PLAN, nothing_left)
    assert len(job.runs) == len(S3_DELTA_PLAN) + 1
    late = [r for r in job.runs if "taking over the lease" in r.output]
    assert not late, f"a restart waited out a lease:\n{late[0].tail()}"
    job.assert_exact()
