"""A fan-out into PostgreSQL, Kafka and Delta Lake on real Spark (issue 41,
docs/fan-out.md): the driver (``examples/stream_fan_out.py``) SIGKILLed at each fan-out
crash point, then restarted on the same checkpoint. Each kill is proved (SIGKILL exit, the
crash log names the point, Spark's offset log has the batch and its commit log does not);
what the kill left is checked against the documented table (none of the targets shows the
batch before the decision's commits begin; after ``between_commits`` PostgreSQL does and
the others do not yet); after the restart each target holds every input id exactly once
(PostgreSQL rows, Kafka ``read_committed`` records, the Delta table's rows), nothing left
prepared or open, and the three agree."""

from __future__ import annotations

import collections
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors.core.protocol import CrashPoint
from examples.stream_to_files import make_input_files
from integration.support._driver import REPO, KillJob, reached, spark_batches
from integration.support._kafka import KafkaTarget
from integration.support._pg import DRIVER_PGOPTIONS, PgTarget, check_restart

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FILES, ROWS_PER_FILE = 3, 200
WIDE = os.environ.get("EOS_WIDE_MATRIX") == "1"
CRASH_BATCH = 1


class FanJob(KillJob):
    module = "examples.stream_fan_out"

    def __init__(self, root: Path, pg: PgTarget, kafka: KafkaTarget,
                 batches: int | None = None) -> None:
        self.fan_id = f"fan-{uuid.uuid4().hex[:8]}"
        super().__init__(root, sink_id=self.fan_id, cwd=REPO)
        self.pg, self.kafka = pg, kafka
        self.input, self.path = root / "in", root / "delta"
        #: ``batches``: the rate source, that many batches of ROWS_PER_FILE rows.
        self.batches = batches
        #: more flags for the example (``--conf k=v``)
        self.extra: list[str] = []
        if batches is None:
            self.total = make_input_files(self.input, FILES, ROWS_PER_FILE)
        else:
            self.total = batches * ROWS_PER_FILE

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
                "--delta-sink-id", f"{self.fan_id}-delta", *self.extra]

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

    def assert_exact(self) -> None:
        want = collections.Counter(range(self.total))
        seen = self.seen()
        for name, counts in seen.items():
            assert counts == want, (name, sorted((counts - want).items())[:10],
                                    sorted((want - counts).items())[:10])
        assert self.pg.prepared() == []
        self.kafka.assert_no_open_transactions()


@pytest.fixture
def job(tmp_path: Path, postgres_conninfo: str, kafka_bootstrap: str,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[FanJob]:
    monkeypatch.setenv("PGOPTIONS", DRIVER_PGOPTIONS)
    pg = PgTarget(postgres_conninfo, prefix="fan")
    pg.create_table()
    kafka = KafkaTarget(kafka_bootstrap, "fan")
    kafka.create()
    yield FanJob(tmp_path, pg, kafka)
    pg.cleanup()
    kafka.cleanup()


#: CI kills at the two points that leave the most to settle (a decision nothing committed
#: yet; PostgreSQL committed, Kafka and Delta not); EOS_WIDE_MATRIX=1 adds the other two
#: (the in-process tests of test_fanout_targets.py run all four on every run).
POINTS = [CrashPoint.AFTER_DECISION, CrashPoint.BETWEEN_COMMITS] + (
    [CrashPoint.BEFORE_DECISION, CrashPoint.AFTER_COMMIT] if WIDE else [])


@pytest.mark.parametrize("point", POINTS, ids=lambda p: p.value)
def test_driver_sigkilled_at_each_fan_out_point_then_restart_is_exact_in_all_three(
        job: FanJob, point: CrashPoint) -> None:
    first = job.run(crash=f"{point.value}:sink={job.fan_id}:batch={CRASH_BATCH}")
    assert first.returncode == -9, first.tail()
    assert job.reached(point, CRASH_BATCH), reached(job.crash_log)
    offsets, commits = spark_batches(job.checkpoint)
    assert CRASH_BATCH in offsets and CRASH_BATCH not in commits, (offsets, commits)
    shown = {name: counts.total() // ROWS_PER_FILE for name, counts in job.seen().items()}
    if point in (CrashPoint.BEFORE_DECISION, CrashPoint.AFTER_DECISION):
        assert shown == {"postgres": 1, "kafka": 1, "delta": 1}, shown  # batch 1 nowhere
    elif point is CrashPoint.BETWEEN_COMMITS:
        assert shown == {"postgres": 2, "kafka": 1, "delta": 1}, shown  # the window
    else:
        assert shown == {"postgres": 2, "kafka": 2, "delta": 2}, shown
    second = job.run()
    check_restart(second)
    job.assert_exact()


def test_a_query_into_all_three_is_exact(job: FanJob) -> None:
    run = job.run()
    check_restart(run)
    job.assert_exact()
    metrics: dict[str, Any] = {m["sink_id"]: m for m in run.metrics()}
    assert set(metrics) == {job.pg.sink_id, job.kafka.sink_id, f"{job.fan_id}-delta"}


def test_stopped_gracefully_in_the_fan_out_phases_then_exact_in_all_three(
        tmp_path: Path, postgres_conninfo: str, kafka_bootstrap: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A deploy's SIGTERM (``connectors.stop_on_sigterm``) lands while a batch holds at a
    fan-out point (a stall): the batch in flight lands in all three, the next is refused
    before any side effect; after each stop the three show the same rows, nothing is left
    prepared or open; the last run goes to the end, exact in all three."""
    from integration.core.test_stopping import FIRST, G, Stopped, batches_for, stop_chain

    monkeypatch.setenv("PGOPTIONS", DRIVER_PGOPTIONS)
    pg = PgTarget(postgres_conninfo, prefix="fanstop")
    pg.create_table()
    kafka = KafkaTarget(kafka_bootstrap, "fanstop")
    kafka.create()
    plan = [(G, CrashPoint.BEFORE_DECISION), (G, CrashPoint.BETWEEN_COMMITS)]
    try:
        job = FanJob(tmp_path, pg, kafka, batches=batches_for(plan))

        def agree(stopped: Stopped) -> None:
            seen = job.seen()
            want = collections.Counter(range((stopped.batch + 1) * ROWS_PER_FILE))
            assert {n: c == want for n, c in seen.items()} == {
                "postgres": True, "kafka": True, "delta": True}, (stopped, seen)
            assert pg.prepared() == []
            kafka.assert_no_open_transactions()

        stops = stop_chain(job, job.fan_id, plan, agree)
        assert [s.batch for s in stops] == [FIRST, FIRST + 1]
        job.assert_exact()
    finally:
        pg.cleanup()
        kafka.cleanup()


def test_a_null_into_postgresqls_not_null_column_commits_the_batch_nowhere_then_exact(
        job: FanJob) -> None:
    """A file holds a row without an id; PostgreSQL's ``id`` is NOT NULL: its tasks
    refuse the batch before the fan-out decides, so Kafka and Delta never get it either, and
    the query ends naming PostgreSQL's target and the column. The operator fixes the file
    (same name: Spark's offset log lists it) and restarts: exact in all three."""
    bad, good = _rewrite_row(job, id=None)
    first = job.run()
    assert first.returncode != 0, first.tail()
    assert "BadInputError" in first.output and "NOT NULL" in first.output, first.tail()
    assert job.pg.sink_id in first.output, first.tail()
    _refused_nowhere(job, good, FILES - 1)
    bad.write_text(good)  # the fix
    second = job.run()
    check_restart(second)
    job.assert_exact()


def _rewrite_row(job: FanJob, **change: Any) -> tuple[Path, str]:
    """Give row 3 of the newest input file (the last batch) ``change``; the file and its
    good text, for the fix."""
    bad = job.input / f"part-{FILES - 1:05d}.json"
    good = bad.read_text()
    lines = good.splitlines()
    lines[3] = json.dumps({**json.loads(lines[3]), **change})
    bad.write_text("\n".join(lines) + "\n")
    return bad, good


def _refused_nowhere(job: FanJob, good: str, batches_before: int) -> None:
    """The refused batch's rows are in none of the three, the batches before it in all;
    nothing prepared or open."""
    refused = {json.loads(line)["id"] for line in good.splitlines()}
    seen = job.seen()
    for name, counts in seen.items():
        assert counts.total() == batches_before * ROWS_PER_FILE, (name, counts.total())
        assert not refused & set(counts), name
    assert seen["postgres"] == seen["kafka"] == seen["delta"]
    assert job.pg.prepared() == []
    job.kafka.assert_no_open_transactions()


def test_a_record_over_the_topics_size_limit_commits_the_batch_nowhere_then_exact(
        job: FanJob) -> None:
    """Row 3 of the last file carries a 2 MB name: PostgreSQL and Delta take it, the topic
    (max.message.bytes 1 MB) cannot. Kafka's check of every record runs before the decision,
    so PostgreSQL's prepared part is rolled back and Delta never commits: the query ends
    naming Kafka's target and the size. After the fix, exact in all three."""
    bad, good = _rewrite_row(job, name="x" * 2_000_000)
    # The example splits files at 16 kB (several tasks per batch): 124 tasks for this one,
    # more than the server's max_prepared_transactions (a ConfigurationError that says so).
    job.extra = ["--conf", "spark.sql.files.maxPartitionBytes=4m"]
    first = job.run()
    assert first.returncode != 0, first.tail()
    assert "BadInputError" in first.output and "larger than" in first.output, first.tail()
    assert job.kafka.sink_id in first.output, first.tail()
    _refused_nowhere(job, good, FILES - 1)
    bad.write_text(good)  # the fix
    check_restart(job.run())
    job.assert_exact()


def test_a_delta_table_of_another_schema_commits_the_batch_nowhere_then_exact(
        job: FanJob) -> None:
    """The Delta table exists with ``amount`` as a string where the query has a double:
    Delta's check runs before the decision, after PostgreSQL prepared its part, which is
    rolled back; the query ends naming Delta's target and the column. The operator
    recreates the table with the query's schema (here: removes it, and the sink's
    ``create_table=True`` makes it): exact in all three."""
    import pyarrow as pa
    from deltalake import write_deltalake

    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.string()),
                        ("ts", pa.timestamp("us", tz="UTC"))])
    write_deltalake(str(job.path), schema.empty_table())
    first = job.run()
    assert first.returncode != 0, first.tail()
    assert "BadInputError" in first.output and "amount" in first.output, first.tail()
    assert f"{job.fan_id}-delta" in first.output, first.tail()
    seen = job.seen()
    assert {name: counts.total() for name, counts in seen.items()} == {
        "postgres": 0, "kafka": 0, "delta": 0}, seen
    assert job.pg.prepared() == []
    job.kafka.assert_no_open_transactions()
    shutil.rmtree(job.path)  # the fix
    check_restart(job.run())
    job.assert_exact()


def test_values_a_delta_table_refuses_commit_the_batch_nowhere_then_exact(
        job: FanJob) -> None:
    """The Delta table's ``name`` is NOT NULL and a CHECK constraint wants ``amount >= 0``;
    PostgreSQL takes either row. Delta's writer would refuse them only in its commit,
    after the decision; the fan-out runs Delta's value checks before it instead, so
    PostgreSQL's prepared part is rolled back and the query ends naming Delta's target
    and what the row breaks. Each fix of the file, then exact in all three."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    schema = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string(), False),
                        pa.field("amount", pa.float64()),
                        pa.field("ts", pa.timestamp("us", tz="UTC"))])
    write_deltalake(str(job.path), schema.empty_table())
    DeltaTable(str(job.path)).alter.add_constraint({"amount_not_negative": "amount >= 0"})
    for change, broken in (({"name": None}, "NOT NULL column 'name'"),
                           ({"amount": -1.0}, "CHECK constraint amount_not_negative")):
        bad, good = _rewrite_row(job, **change)
        run = job.run()
        assert run.returncode != 0, run.tail()
        assert "BadInputError" in run.output and broken in run.output, run.tail()
        assert f"{job.fan_id}-delta" in run.output, run.tail()
        _refused_nowhere(job, good, FILES - 1)
        bad.write_text(good)  # the fix
    check_restart(job.run())
    job.assert_exact()


class ConnectFanJob(FanJob):
    """The fan-out job as a Spark Connect client: the fan-out runs in the server's
    foreachBatch worker (pickled there with its sinks), bound to the query by its name."""

    def args(self) -> list[str]:
        return [*super().args(), "--connect", "--query-name", "fan-orders"]


@pytest.mark.connect_local
def test_under_spark_connect_the_worker_killed_after_the_decision_then_exact(
        tmp_path: Path, postgres_conninfo: str, kafka_bootstrap: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGOPTIONS", DRIVER_PGOPTIONS)
    pg = PgTarget(postgres_conninfo, prefix="fanconn")
    pg.create_table()
    kafka = KafkaTarget(kafka_bootstrap, "fanconn")
    kafka.create()
    try:
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
        for sink_id in (pg.sink_id, kafka.sink_id, f"{job.fan_id}-delta"):
            assert f"last metrics of sink {sink_id}: {{" in second.output, second.tail()
    finally:
        pg.cleanup()
        kafka.cleanup()


def test_driver_killed_at_random_moments_then_exact_in_all_three(job: FanJob) -> None:
    """SIGKILLs a random 0-1.5 s after the fan-out decided a new batch (its ledger, in
    PostgreSQL, counts decisions): wherever each lands (a target's commit, between two,
    a task), the restarts end exact in all three. One kill in CI, three wide."""
    import psycopg
    from psycopg import sql

    from integration.support._driver import SEED, kill_at_random

    seen = [0]

    def decided() -> int:
        try:  # a PostgreSQL restarting under the test: the last count stands
            if job.pg.exists(job.pg.ledger):
                seen[0] = len(job.pg.execute(
                    sql.SQL("SELECT batch_id FROM {} WHERE sink_id = %s")
                    .format(sql.Identifier(job.pg.ledger)), [job.fan_id]))
        except psycopg.OperationalError:
            pass
        return seen[0]

    runs = kill_at_random(job, progress=decided, runs=3 if WIDE else 1, max_delay=1.5,
                          seed=SEED, check=check_restart)
    assert any(r.returncode == -9 for r in runs)
    job.assert_exact()
