"""IcebergSink's change streams (SQL MERGE) on real Spark (4.1) and a real Iceberg table, and
a FanOut of IcebergSink and PostgresSink, with drivers SIGKILLed at the crash points and at
random moments, restarted from the same checkpoint.

The driver is ``integration.iceberg._iceberg_cdc`` (a deterministic change stream from
Spark's rate source: several changes per key per batch, deletes of existing and unknown
keys, a delete then a re-insert). After the last run the Iceberg table, read back with
pyiceberg (never Spark), equals a plain application of the whole input row by row (the last
change of each key, deleted keys absent: ``expected_merge``), with exactly one tagged
snapshot per batch and no intent left; with the fan-out PostgreSQL's table equals it too and
nothing is left prepared.

A MERGE whose update is guarded (``update_when="s.seq > t.seq"``) gives the same rows when
applied twice, so the rows alone cannot show a batch committed twice: the snapshots can,
and every check counts them.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors.sdk import CrashPoint
from integration.delta._delta_cdc import expected_merge
from integration.iceberg._iceberg_cdc import ICEBERG_SINK
from integration.iceberg._support import (
    change_rows,
    intents,
    ledger_batches,
    maintain,
    snapshot_tags,
)
from integration.support._driver import (
    REPO,
    SEED,
    DriverRun,
    KillJob,
    kill_at_each,
    kill_at_random,
    reached,
    spark_batches,
)
from integration.support._pg import DRIVER_PGOPTIONS, PgTarget

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.iceberg]

R = 60  # rows (changes) per batch
TABLE = "changes"
PG_DDL = ("id bigint PRIMARY KEY, seq bigint NOT NULL, name text, amount double precision, "
          "bucket bigint")


class CdcJob(KillJob):
    module = "integration.iceberg._iceberg_cdc"

    def __init__(self, root: Path, batches: int, pg: PgTarget | None = None,
                 extra: list[str] | None = None) -> None:
        self.fan_id = f"{pg.sink_id}-fan" if pg is not None else ""
        super().__init__(root, sink_id=self.fan_id or ICEBERG_SINK, cwd=REPO)
        self.warehouse = root / "wh"
        self.batches = batches
        self.pg = pg
        self.runs = 0
        self.extra = list(extra or [])

    def args(self) -> list[str]:
        pg = ["--pg-conninfo", self.pg.conninfo, "--pg-table", self.pg.table, "--pg-ledger",
              self.pg.ledger, "--pg-sink-id", self.pg.sink_id, "--fan-id", self.fan_id] \
            if self.pg is not None else []
        return ["--checkpoint", str(self.checkpoint), "--warehouse", str(self.warehouse),
                "--batches", str(self.batches), "--rows-per-batch", str(R), *pg, *self.extra]

    def run(self, *extra: str, **kwargs: Any) -> DriverRun:
        """One run; its output kept as ``run-<n>.log`` beside the checkpoint (for a failure's
        post-mortem: pytest keeps the last runs' directories)."""
        run = super().run(*extra, **kwargs)
        self.runs += 1
        (self.root / f"run-{self.runs}.log").write_text(run.output)
        return run

    def tags(self) -> dict[int, int]:
        return snapshot_tags(self.warehouse, ICEBERG_SINK, TABLE)

    def want(self, batches: int | None = None) -> list[tuple[Any, ...]]:
        """The table after the first ``batches`` (default: all) batches' changes."""
        n = self.batches if batches is None else batches
        state = expected_merge(range(n * R), R)
        return sorted((r[0], r[2], r[3], r[4], r[5]) for r in state.values())

    def pg_rows(self) -> list[tuple[Any, ...]]:
        assert self.pg is not None
        return sorted(tuple(r) for r in self.pg.rows("id, seq, name, amount, bucket"))

    def assert_exact(self) -> None:
        want = self.want()
        got = change_rows(self.warehouse, TABLE)
        missing = collections.Counter(want) - collections.Counter(got)
        extra = collections.Counter(got) - collections.Counter(want)
        assert not missing and not extra, ("the Iceberg table differs from the input's "
                                           "changes applied in order", missing, extra)
        assert self.tags() == dict.fromkeys(range(self.batches), 1), self.tags()
        assert intents(self.warehouse, ICEBERG_SINK, TABLE) == []
        if self.pg is None:  # (a fan-out's decisions are in PostgreSQL's ledger)
            assert ledger_batches(self.warehouse, ICEBERG_SINK, TABLE) == \
                list(range(self.batches))
            return
        assert self.pg_rows() == want, "PostgreSQL's table differs from the input's changes"
        assert self.pg.prepared() == [], self.pg.prepared()


# The points of the family in the order a restarted driver meets them.
PLAN = [
    (CrashPoint.BEFORE_DECISION, ICEBERG_SINK, 1),
    (CrashPoint.AFTER_DECISION, ICEBERG_SINK, 2),
    (CrashPoint.AFTER_COMMIT, ICEBERG_SINK, 3),
]


def test_merge_killed_at_every_crash_point_then_at_random(tmp_path: Path) -> None:
    """One job: SIGKILLed at before_decision (batch 1: intent, no commit), after_decision
    (batch 2: the table's MERGE committed, the ledger not) and after_commit (batch 3), each
    restart settling the kill before it; then a job of six batches killed at a random
    moment while the driver writes. Each kill is proved and what the table holds checked
    against its point; after the last run: exact, one tagged snapshot per batch."""
    job = CdcJob(tmp_path, batches=5)

    def after_kill(point: CrashPoint, sink: str, batch: int, run: DriverRun) -> None:
        tags = job.tags()
        assert (batch in tags) == (point is not CrashPoint.BEFORE_DECISION), (point, tags)
        assert all(n == 1 for n in tags.values()), tags

    runs = kill_at_each(job, PLAN, after_kill=after_kill)
    assert "batch 2: the table's snapshots say committed" in runs[2].output, runs[2].tail()
    job.assert_exact()
    # A job of its own: the rate source's runner lets Spark finish the first batch past
    # --batches without writing it, so a checkpoint cannot be fed more batches later.
    rnd = CdcJob(tmp_path / "random", batches=6)
    kill_at_random(rnd, progress=lambda: len(rnd.tags()), runs=1, seed=SEED)
    rnd.assert_exact()


@pytest.fixture
def pg(postgres_conninfo: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[PgTarget]:
    monkeypatch.setenv("PGOPTIONS", DRIVER_PGOPTIONS)
    target = PgTarget(postgres_conninfo, prefix="icecdc")
    target.create_table(PG_DDL)
    yield target
    target.cleanup()


def test_fan_out_with_postgres_killed_after_decision_and_between_commits(
        tmp_path: Path, pg: PgTarget) -> None:
    """A FanOut of IcebergSink (MERGE) and PostgresSink (mode="changes") on the same change
    stream: SIGKILLed at the fan-out's after_decision (batch 1: decided, nothing committed)
    and between_commits (batch 2: PostgreSQL committed, Iceberg not), then fed a NULL in a
    column only Iceberg's table requires (refused before the decision: neither target has
    the batch), then fixed: both tables end equal to the input's changes applied in order,
    one tagged snapshot per batch, nothing prepared. (Random kills of a fan-out:
    integration/fanout/test_fanout_kill.py.)"""
    job = CdcJob(tmp_path, batches=5, pg=pg)
    # Iceberg requires bucket; PostgreSQL does not (its column is nullable).
    maintain(job.warehouse, "CREATE NAMESPACE IF NOT EXISTS lake.db",
             f"CREATE TABLE lake.db.{TABLE} (id BIGINT, seq BIGINT, name STRING, "
             "amount DOUBLE, bucket BIGINT NOT NULL) USING iceberg")
    for point, batch in ((CrashPoint.AFTER_DECISION, 1), (CrashPoint.BETWEEN_COMMITS, 2)):
        run = job.run(crash=f"{point.value}:batch={batch}:sink={job.fan_id}")
        assert run.returncode == -9, run.tail()
        assert job.reached(point, batch), reached(job.crash_log)
        offsets, commits = spark_batches(job.checkpoint)
        assert batch in offsets and batch not in commits, (offsets, commits)
        tags = job.tags()
        assert batch not in tags, (point, tags)  # Iceberg commits after PostgreSQL
        assert all(n == 1 for n in tags.values()), tags
        # PostgreSQL holds the batch exactly when the kill came after its commit
        holds = batch + (point is CrashPoint.BETWEEN_COMMITS)
        assert job.pg_rows() == job.want(holds), (point, batch)
    # Bad input for Iceberg alone in batch 3: refused before the fan-out decides, so
    # neither target has it; after the fix the restart delivers it (and the rest) to both.
    bad = job.run("--null-bucket-at", "3")
    assert bad.returncode != 0, bad.tail()
    assert "BadInputError" in bad.output and "column 'bucket'" in bad.output, bad.tail()
    assert "c-239" not in bad.output, "no row value in the error"
    assert sorted(job.tags()) == [0, 1, 2] and job.pg_rows() == job.want(3), job.tags()
    assert pg.prepared() == []
    assert job.run().returncode == 0
    job.assert_exact()


def test_stopped_gracefully_and_plainly_then_exact(tmp_path: Path) -> None:
    """A deploy's SIGTERM while a batch holds at a point (``connectors.stop_on_sigterm``):
    gracefully before its tasks and after its MERGE committed (the batch in flight lands,
    is recorded, and nothing after it runs), plainly before the decision (the batch in flight
    may be cut: at most its intent is left, settled by the restart). After each stop the
    table holds whole batches, each once; the last run ends exact."""
    from integration.core.test_stopping import G, P, Stopped, batches_for, stop_chain

    plan = [(G, CrashPoint.BEFORE_TASKS), (G, CrashPoint.AFTER_DECISION),
            (P, CrashPoint.BEFORE_DECISION)]
    job = CdcJob(tmp_path, batches=batches_for(plan))

    def nothing_left(stopped: Stopped) -> None:
        where = f"{stopped.kind} stop at {stopped.point.value}, batch {stopped.batch}"
        tags = job.tags()
        assert all(n == 1 for n in tags.values()), (where, tags)
        done = len(tags)
        assert sorted(tags) == list(range(done)), (where, tags)
        assert change_rows(job.warehouse, TABLE) == job.want(done), where
        left = intents(job.warehouse, ICEBERG_SINK, TABLE)
        if stopped.kind == G:
            assert done == stopped.batch + 1 and left == [], (where, tags, left)
            assert ledger_batches(job.warehouse, ICEBERG_SINK, TABLE) == list(range(done))
        else:
            assert set(left) <= {stopped.batch}, (where, left)

    stop_chain(job, ICEBERG_SINK, plan, nothing_left)
    job.assert_exact()


@pytest.mark.connect_local
def test_under_spark_connect_the_worker_killed_after_decision_then_exact(tmp_path: Path) -> None:
    """The job as a Spark Connect client of a local Connect server: ``foreachBatch`` and the
    sink's driver side (the MERGE, its tag in session confs, the ledger) run in the server's
    Python worker, which SIGKILLs itself after batch 1's MERGE committed (the client ends
    with the query's error); the restart, on a new server, settles batch 1 from the table's
    snapshots. Exact, one tagged snapshot per batch; the sink ran in the worker."""

    def failed_in_the_worker(run: DriverRun) -> None:
        assert run.returncode not in (0, -9), run.tail()

    job = CdcJob(tmp_path, batches=4, extra=["--connect", "--query-name", "iceberg-cdc"])
    runs = kill_at_each(job, [(CrashPoint.AFTER_DECISION, ICEBERG_SINK, 1)],
                        killed=failed_in_the_worker)
    assert sorted(job.tags()) == [0, 1, 2, 3]
    job.assert_exact()
    assert "Streaming ForeachBatch worker" in runs[-1].output, runs[-1].tail()
