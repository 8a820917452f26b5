"""A fan-out into PostgreSQL, Kafka and Delta Lake on real Spark (issue 41,
docs/fan-out.md): the driver (``examples/stream_fan_out.py``) SIGKILLed at each fan-out
crash point, at random moments, stopped gracefully in the fan-out phases, and fed bad
input for each target in turn, each time restarted on the same checkpoint. Each kill is
proved (SIGKILL exit, the crash log names the point, Spark's offset log has the batch and
its commit log does not); what the kill left is checked against the documented table (none
of the targets shows the batch before the decision's commits begin; after
``between_commits`` PostgreSQL does and the others do not yet); after the last restart each
target holds every input id exactly once (PostgreSQL rows, Kafka ``read_committed``
records, the Delta table's rows), nothing left prepared or open, and the three agree.

Driver starts cost the most here, so each test chains its events in one job: a run ends
at event 1 (a kill, a stop, a refused batch), its restart at event 2, ..., and only the
last run goes to the end."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors.core.states import CrashPoint
from examples.stream_to_files import make_input_files
from integration.support._driver import REPO, SEED, DriverRun, KillJob, reached, spark_batches
from integration.support._kafka import KafkaTarget
from integration.support._pg import DRIVER_PGOPTIONS, PgTarget, check_restart

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FILES, ROWS_PER_FILE = 3, 200
WIDE = os.environ.get("EOS_WIDE_MATRIX") == "1"
CRASH_BATCH = 1


class FanJob(KillJob):
    module = "examples.stream_fan_out"

    def __init__(self, root: Path, pg: PgTarget, kafka: KafkaTarget, *,
                 files: int = FILES, batches: int | None = None) -> None:
        self.fan_id = f"fan-{uuid.uuid4().hex[:8]}"
        super().__init__(root, sink_id=self.fan_id, cwd=REPO)
        self.pg, self.kafka = pg, kafka
        self.input, self.path = root / "in", root / "delta"
        #: ``batches``: the rate source, that many batches of ROWS_PER_FILE rows (may be
        #: changed between runs); else ``files`` JSON files of ROWS_PER_FILE rows.
        self.batches = batches
        self.files = 0 if batches is not None else make_input_files(
            self.input, files, ROWS_PER_FILE) // ROWS_PER_FILE
        #: more flags for the example (``--conf k=v``)
        self.extra: list[str] = []
        #: every run of the job, in order
        self.runs: list[DriverRun] = []

    @property
    def total(self) -> int:
        """The input's rows (ids ``0 .. total-1``)."""
        return (self.files if self.batches is None else self.batches) * ROWS_PER_FILE

    def args(self) -> list[str]:
        source = (["--source", "files", "--input", str(self.input)] if self.batches is None
                  else ["--source", "rate", "--batches", str(self.batches),
                        "--rows-per-batch", str(ROWS_PER_FILE)])
        return [*source,
                "--checkpoint", str(self.checkpoint), "--conninfo", self.pg.conninfo,
                "--bootstrap", self.kafka.bootstrap, "--table", self.pg.table,
                "--ledger-table", self.pg.ledger, "--topic", self.kafka.topic,
                "--path", str(self.path), "--sink-id", self.fan_id,
                "--pg-sink-id", self.pg.sink_id, "--kafka-sink-id", self.kafka.sink_id,
                "--delta-sink-id", self.delta_id, *self.extra]

    def run(self, *extra: str, **kwargs: Any) -> DriverRun:
        run = super().run(*extra, **kwargs)
        self.runs.append(run)
        return run

    @property
    def delta_id(self) -> str:
        return f"{self.fan_id}-delta"

    @property
    def target_ids(self) -> set[str]:
        return {self.pg.sink_id, self.kafka.sink_id, self.delta_id}

    def delta_ids(self) -> list[int]:
        from deltalake import DeltaTable

        if not (self.path / "_delta_log").exists():
            return []
        return [int(i) for i in
                DeltaTable(str(self.path)).to_pyarrow_table(columns=["id"]).column("id")
                .to_pylist()]

    def seen(self) -> dict[str, collections.Counter[int]]:
        return {"postgres": collections.Counter(self.pg.ids()),
                "kafka": collections.Counter(self.kafka.ids()),
                "delta": collections.Counter(self.delta_ids())}

    def holds(self) -> dict[str, int | None]:
        """Per target: how many whole batches it holds (ids ``0 .. n*ROWS_PER_FILE-1``,
        each once), or ``None`` if it holds anything else."""
        out: dict[str, int | None] = {}
        for name, counts in self.seen().items():
            n = counts.total() // ROWS_PER_FILE
            out[name] = n if counts == collections.Counter(range(n * ROWS_PER_FILE)) else None
        return out

    def assert_nothing_open(self) -> None:
        assert self.pg.prepared() == [], self.pg.prepared()
        self.kafka.assert_no_open_transactions()

    def assert_exact(self) -> None:
        want = collections.Counter(range(self.total))
        seen = self.seen()
        for name, counts in seen.items():
            assert counts == want, (name, sorted((counts - want).items())[:10],
                                    sorted((want - counts).items())[:10])
        self.assert_nothing_open()


@pytest.fixture
def targets(postgres_conninfo: str, kafka_bootstrap: str,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[PgTarget, KafkaTarget]]:
    """A PostgreSQL table (``id`` NOT NULL) and a Kafka topic (1 MB records), removed after."""
    monkeypatch.setenv("PGOPTIONS", DRIVER_PGOPTIONS)
    pg = PgTarget(postgres_conninfo, prefix="fan")
    pg.create_table()
    kafka = KafkaTarget(kafka_bootstrap, "fan")
    kafka.create()
    yield pg, kafka
    pg.cleanup()
    kafka.cleanup()


# ---- kills and stops ------------------------------------------------------------------

#: CI kills at the two points that leave the most to settle (a decision nothing committed
#: yet; PostgreSQL committed, Kafka and Delta not); EOS_WIDE_MATRIX=1 adds the other two
#: (the in-process tests of test_fanout_targets.py run all four on every run).
POINTS = [CrashPoint.AFTER_DECISION, CrashPoint.BETWEEN_COMMITS] + (
    [CrashPoint.BEFORE_DECISION, CrashPoint.AFTER_COMMIT] if WIDE else [])
#: SIGKILLs at random moments: one in CI, three wide.
RANDOM_KILLS = 3 if WIDE else 1
#: While a random kill is pending the rate source has more batches than a run can write.
UNBOUNDED = 10_000


def _killed_at(job: FanJob, point: CrashPoint, batch: int) -> DriverRun:
    """One run SIGKILLed at the fan-out's ``point`` of ``batch``, proved (the exit, the
    crash log, Spark's offset and commit logs); each target holds what the point stands
    for: the batches before, and ``batch`` too where its commit came before the point."""
    run = job.run(crash=f"{point.value}:sink={job.fan_id}:batch={batch}")
    where = f"SIGKILL at {point.value}, batch {batch}"
    assert run.returncode == -9, f"{where}: exit {run.returncode}\n{run.tail()}"
    assert job.reached(point, batch), (where, reached(job.crash_log))
    offsets, commits = spark_batches(job.checkpoint)
    assert batch in offsets and batch not in commits, (where, offsets, commits)
    pg_has = point in (CrashPoint.BETWEEN_COMMITS, CrashPoint.AFTER_COMMIT)
    others_have = point is CrashPoint.AFTER_COMMIT
    want = {"postgres": batch + pg_has, "kafka": batch + others_have,
            "delta": batch + others_have}
    assert job.holds() == want, (where, job.holds())  # the documented table
    return run


def test_killed_at_each_fan_out_point_at_random_and_stopped_in_turn_then_exact_in_all_three(
        tmp_path: Path, targets: tuple[PgTarget, KafkaTarget]) -> None:
    """One job (rate source), one driver run per event, each restart settling the one
    before:

    - SIGKILLed at ``after_decision`` of batch 1, then (its restart) at
      ``between_commits`` of batch 2 (all four points with ``EOS_WIDE_MATRIX=1``): each
      kill proved, and what it left checked against docs/fan-out.md's table;
    - SIGKILLed a random 0-1.5 s after the fan-out decided a new batch (its ledger, in
      PostgreSQL, counts decisions): wherever it lands (a target's commit, between two, a
      task), the rest of the chain ends exact (one kill in CI, three wide);
    - a deploy's SIGTERM (``connectors.stop_on_sigterm``) while a batch holds at
      ``before_decision`` (a stall), then in the next run at ``between_commits``: the batch
      in flight lands in all three, the next is refused before any side effect; after each
      stop the three hold the same whole batches, nothing prepared or open;
    - the last run goes to the end: every id exactly once in each target, nothing
      prepared or open. The first run's batch 0 (nothing to settle) and the last run
      logged each target's metrics.
    """
    from integration.core.test_stopping import G, Stopped, batches_for, stop_chain

    pg, kafka = targets
    # (batches enough for every kill: a point never reached ends the run, not the wait)
    job = FanJob(tmp_path, pg, kafka, batches=len(POINTS) + 2)
    for batch, point in enumerate(POINTS, start=1):
        _killed_at(job, point, batch)
    # Batch 0 ran clean in the first run, committed by each target.
    clean = job.runs[0].metrics(batch=0)
    assert {m["sink_id"] for m in clean} == job.target_ids, job.runs[0].tail()
    assert {m["outcome"] for m in clean} == {"committed"}, clean

    from psycopg import OperationalError, sql

    decisions = [0]

    def decided() -> int:
        # (a PostgreSQL restarting under the test: the last count stands)
        with contextlib.suppress(OperationalError):
            decisions[0] = len(pg.execute(
                sql.SQL("SELECT batch_id FROM {} WHERE sink_id = %s")
                .format(sql.Identifier(pg.ledger)), [job.fan_id]))
        return decisions[0]

    rng = random.Random(SEED)
    job.batches = UNBOUNDED
    for i in range(RANDOM_KILLS):
        before = decided()
        run = job.run(kill_after=rng.uniform(0.0, 1.5),
                      kill_when=lambda before=before: decided() > before)
        # (the rate source has UNBOUNDED batches: only the kill ends the run)
        assert run.returncode == -9, f"random kill {i}: exit {run.returncode}\n{run.tail()}"

    offsets, _ = spark_batches(job.checkpoint)
    first = max(offsets) + 1  # the first batch the restart plans anew
    plan = [(G, CrashPoint.BEFORE_DECISION), (G, CrashPoint.BETWEEN_COMMITS)]
    job.batches = batches_for(plan, first)

    def agree(stopped: Stopped) -> None:
        whole = stopped.batch + 1
        assert job.holds() == {"postgres": whole, "kafka": whole, "delta": whole}, (
            stopped, job.holds())
        job.assert_nothing_open()

    stops = stop_chain(job, job.fan_id, plan, agree, first=first)
    assert [s.batch for s in stops] == [first, first + 1]
    job.assert_exact()
    final = job.runs[-1]
    assert {m["sink_id"] for m in final.metrics()} == job.target_ids, final.tail()


# ---- bad input ------------------------------------------------------------------------

def _rewrite_row(job: FanJob, file: int, **change: Any) -> tuple[Path, str]:
    """Give row 3 of input file ``file`` ``change``; the file and its good text, for the
    fix."""
    bad = job.input / f"part-{file:05d}.json"
    good = bad.read_text()
    lines = good.splitlines()
    lines[3] = json.dumps({**json.loads(lines[3]), **change})
    bad.write_text("\n".join(lines) + "\n")
    return bad, good


def _refused_nowhere(job: FanJob, run: DriverRun, text: str, sink_id: str,
                     batches_before: int) -> None:
    """``run`` ended with a ``BadInputError`` saying ``text`` and naming ``sink_id``; the
    refused batch's rows are in none of the three, the batches before it in all; nothing
    prepared or open."""
    assert run.returncode != 0, run.tail()
    errors = [line for line in run.output.splitlines() if "BadInputError" in line]
    assert any(text in line for line in errors), (text, errors[:5], run.tail())
    assert sink_id in run.output, run.tail()
    offsets, commits = spark_batches(job.checkpoint)
    assert batches_before in offsets and batches_before not in commits, (offsets, commits)
    want = {"postgres": batches_before, "kafka": batches_before, "delta": batches_before}
    assert job.holds() == want, (text, job.holds())
    job.assert_nothing_open()


def test_bad_input_for_each_target_in_turn_commits_the_batch_nowhere_then_exact(
        tmp_path: Path, targets: tuple[PgTarget, KafkaTarget]) -> None:
    """One job (files source, one file per batch), one driver run per bad input; each run
    ends naming the target that refused and why, the refused batch in none of the three
    (its checks run before the decision; PostgreSQL's prepared part is rolled back) and
    nothing prepared or open. The operator fixes it and restarts; the restart replays the
    fixed batch and meets the next bad one:

    0. the Delta table exists with ``amount`` a string where the query has a double
       (Delta's schema check, after PostgreSQL prepared): the fix recreates the table with
       the query's schema, its ``name`` NOT NULL and a CHECK ``amount >= 0``;
    1. a row without an id, for PostgreSQL's NOT NULL ``id``: refused in its tasks;
    2. a 2 MB name for a topic of 1 MB records: refused by Kafka's check of every record,
       though PostgreSQL and Delta would take it;
    3. a row without a name and 4. one with a negative amount: PostgreSQL takes either,
       Delta's writer would refuse them only in its commit, after the decision; the
       fan-out runs Delta's value checks before it instead;

    then each file is fixed (same name: Spark's offset log lists it) and the last run is
    exact in all three."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    pg, kafka = targets
    job = FanJob(tmp_path, pg, kafka, files=6)
    bad = [_rewrite_row(job, 1, id=None), _rewrite_row(job, 2, name="x" * 2_000_000),
           _rewrite_row(job, 3, name=None), _rewrite_row(job, 4, amount=-1.0)]
    # The file source takes the files in order of modification time: keep the names' order.
    now = time.time()
    for n in range(job.files):
        os.utime(job.input / f"part-{n:05d}.json", (now - 100 + n, now - 100 + n))

    def table(amount: pa.DataType, name_nullable: bool) -> pa.Table:
        return pa.schema([pa.field("id", pa.int64()),
                          pa.field("name", pa.string(), name_nullable),
                          pa.field("amount", amount),
                          pa.field("ts", pa.timestamp("us", tz="UTC"))]).empty_table()

    write_deltalake(str(job.path), table(pa.string(), True))
    _refused_nowhere(job, job.run(), "amount", job.delta_id, 0)
    shutil.rmtree(job.path)  # the fix: the query's schema (and the operator's constraints)
    write_deltalake(str(job.path), table(pa.float64(), False))
    DeltaTable(str(job.path)).alter.add_constraint({"amount_not_negative": "amount >= 0"})

    refusals = [("NOT NULL", pg.sink_id, []),
                # The example splits files at 16 kB (several tasks per batch): 124 tasks for
                # the 2 MB file, more than the server's max_prepared_transactions (a
                # ConfigurationError that says so).
                ("larger than", kafka.sink_id,
                 ["--conf", "spark.sql.files.maxPartitionBytes=4m"]),
                ("NOT NULL column 'name'", job.delta_id, []),
                ("CHECK constraint amount_not_negative", job.delta_id, [])]
    for batch, ((path, good), (text, sink_id, conf)) in enumerate(zip(bad, refusals,
                                                                       strict=True), start=1):
        _refused_nowhere(job, job.run(*conf), text, sink_id, batch)
        path.write_text(good)  # the fix
    check_restart(job.run())
    job.assert_exact()


# ---- Spark Connect --------------------------------------------------------------------

class ConnectFanJob(FanJob):
    """The fan-out job as a Spark Connect client: the fan-out runs in the server's
    foreachBatch worker (pickled there with its sinks), bound to the query by its name."""

    def args(self) -> list[str]:
        return [*super().args(), "--connect", "--query-name", "fan-orders"]


@pytest.mark.connect_local
def test_under_spark_connect_the_worker_killed_after_the_decision_then_exact(
        tmp_path: Path, targets: tuple[PgTarget, KafkaTarget]) -> None:
    pg, kafka = targets
    job = ConnectFanJob(tmp_path, pg, kafka)
    first = job.run(crash=f"{CrashPoint.AFTER_DECISION.value}:sink={job.fan_id}:"
                          f"batch={CRASH_BATCH}")
    assert first.returncode != 0, first.tail()
    assert job.reached(CrashPoint.AFTER_DECISION, CRASH_BATCH), reached(job.crash_log)
    shown = {name: counts.total() // ROWS_PER_FILE for name, counts in job.seen().items()}
    assert shown == {"postgres": 1, "kafka": 1, "delta": 1}, shown
    second = job.run()
    check_restart(second)
    job.assert_exact()
    # The worker published each target's figures into the session for the client.
    for sink_id in job.target_ids:
        assert f"last metrics of sink {sink_id}: {{" in second.output, second.tail()
