"""PostgresSink's DataSource form (``format("connectors.postgres")``) on real Spark and a
real PostgreSQL: drivers SIGKILLed in the commit worker at every driver-side crash point
and at a random moment, a killed task, a batch job killed and rerun, bad input, a
checkpoint reset, settings the form cannot keep, and Spark's own progress.

The killed drivers are ``examples/stream_to_postgres.py --form datasource``: the same job,
table checks and crash points as ``test_postgres_kill.py``. In this form the driver-side
steps run in the commit worker Spark starts (``connectors.core.driver.planned``): a crash point
there SIGKILLs the whole driver (JVM, Python, workers), as a crashed driver host would.
Every run ends checked row by row (every id once) with nothing of the sink left prepared.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

import connectors
from connectors.sdk import CrashPoint
from examples.stream_to_files import make_input_files
from integration.postgres.test_postgres_kill import PgJob
from integration.support._driver import SEED, DriverRun, kill_at_random, reached, spark_batches
from integration.support._pg import DRIVER_PGOPTIONS, PgTarget, check_restart, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 600  # rows per input file (one file per batch)
try:
    from pyspark.sql import datasource
except ImportError:  # pyspark 3.5: no Python data sources
    datasource = None  # type: ignore[assignment]
#: pyspark >= 4.1: streaming writers take Arrow batches (the form needs them).
ARROW_STREAM_WRITERS = hasattr(datasource, "DataSourceStreamArrowWriter")


class DataSourceJob(PgJob):
    """``PgJob`` in the DataSource form; ``batch_run``: a batch job of that run id;
    ``connect``: a Spark Connect client of a local Connect server."""

    batch_run: int | None = None
    connect: bool = False

    def args(self) -> list[str]:
        run = [] if self.batch_run is None else ["--batch-run", str(self.batch_run)]
        connect = ["--connect"] if self.connect else []
        return [*super().args(), "--form", "datasource", *run, *connect]


@pytest.fixture
def pg(postgres_conninfo: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[PgTarget]:
    monkeypatch.setenv("EOS_POSTGRES_CONNINFO", postgres_conninfo)  # drivers read it
    monkeypatch.setenv("PGOPTIONS", DRIVER_PGOPTIONS)
    target = PgTarget(postgres_conninfo, prefix="dsrc")
    target.create_table()
    yield target
    target.cleanup()


def _outcome(run: DriverRun, batch: int) -> str | None:
    found = [m for m in run.metrics() if m.get("batch_id") == str(batch)]
    return found[-1]["outcome"] if found else None


# In the order a restarted driver meets them: a restart first replays the killed batch.
CHAIN = [
    (CrashPoint.BEFORE_DECISION, 1),
    (CrashPoint.AFTER_DECISION, 1),
    (CrashPoint.BETWEEN_COMMITS, 2),
    (CrashPoint.AFTER_COMMIT, 3),
]


def _check_point(pg: PgTarget, point: CrashPoint, batch: int) -> None:
    """What PostgreSQL holds right after the kill at ``point`` of ``batch``."""
    ledger = pg.ledger_states()
    prepared = {str(t) for t in pg.prepared()}
    assert all(t.batch_id == batch for t in pg.prepared()), pg.prepared()
    assert all(ledger.get(b) in ("COMMITTED", "DECIDED") for b in range(batch)), ledger
    count, before = pg.count(), batch * ROWS
    if point is CrashPoint.BEFORE_DECISION:
        assert prepared and batch not in ledger and count == before, (prepared, ledger, count)
    elif point is CrashPoint.AFTER_DECISION:
        assert ledger.get(batch) == "DECIDED", ledger
        assert prepared == set(pg.decided_transactions(batch)) and count == before
    elif point is CrashPoint.BETWEEN_COMMITS:
        decided = set(pg.decided_transactions(batch))
        assert len(decided) > 1 and prepared < decided, (prepared, decided)
        assert ledger.get(batch) == "DECIDED" and before < count < before + ROWS, count
    else:
        assert not prepared and ledger.get(batch) == "COMMITTED" and count == before + ROWS


def test_driver_sigkilled_in_the_commit_worker_at_every_point_then_exact(
    tmp_path: Path, pg: PgTarget
) -> None:
    """Four kills chained in one job (one per driver-side crash point), then a clean run;
    each restart settles the killed batch as its point requires. (CI's version lanes run
    this test with EOS_WIDE_MATRIX=1: on pyspark 4.0 the form is refused before anything
    is written.)"""
    job = DataSourceJob(tmp_path, pg)
    if not ARROW_STREAM_WRITERS:
        _refused_before_anything(job, pg)
        return
    spec = ";".join(f"{p.value}:batch={b}:once={tmp_path / f'once-{i}'}"
                    for i, (p, b) in enumerate(CHAIN))
    runs = []
    for point, batch in CHAIN:
        run = job.run(crash=spec)
        runs.append(run)
        assert run.returncode == -9, f"not SIGKILLed at {point.value}:\n{run.tail()}"
        assert job.reached(point, batch), reached(job.crash_log)
        offsets, commits = spark_batches(job.checkpoint)
        assert batch in offsets and batch not in commits, (offsets, commits)
        _check_point(pg, point, batch)
    final = job.run(crash=spec)
    check_restart(final)
    runs.append(final)
    job.assert_exact()
    assert pg.prepared() == []
    # The first later run that logged the killed batch settled it: written afresh after
    # before_decision, else a replay the ledger had (what the tasks wrote again was rolled
    # back). A later kill of the same batch replaces the earlier one.
    for i, (point, batch) in enumerate(CHAIN):
        if any(b == batch for _, b in CHAIN[i + 1:]):
            continue
        settled = next(_outcome(r, batch) for r in runs[i + 1:] if _outcome(r, batch))
        expected = "committed" if point is CrashPoint.BEFORE_DECISION else "replayed"
        assert settled == expected, (point, batch, settled)
    print("driver runs (s):", [round(r.seconds, 1) for r in runs])


def _refused_before_anything(job: DataSourceJob, pg: PgTarget) -> None:
    """pyspark < 4.1 (3.5 in CI's oldest lane, 4.0 in a wide run): the form refuses the
    query, naming the version it needs, before any row, prepared transaction or ledger
    entry."""
    run = job.run()
    assert run.returncode != 0 and "needs pyspark >= 4.1" in run.output, run.tail()
    assert pg.count() == 0 and pg.prepared() == [] and pg.ledger_states() == {}


def test_driver_killed_at_a_random_moment_then_exact(tmp_path: Path, pg: PgTarget) -> None:
    """One kill at a random moment after a decision, then a run to the end: exact, nothing
    prepared. (CI's version lanes run this test: before pyspark 4.1 the form is refused.)"""
    job = DataSourceJob(tmp_path, pg, files=8)
    if not ARROW_STREAM_WRITERS:
        _refused_before_anything(job, pg)
        return
    kill_at_random(job, progress=lambda: len(pg.ledger_states()), runs=1, max_delay=1.5,
                   seed=SEED, check=check_restart)
    job.assert_exact()
    assert pg.prepared() == []


def test_a_killed_task_fails_the_batch_and_spark_abort_rolls_it_back(
    tmp_path: Path, pg: PgTarget
) -> None:
    job = DataSourceJob(tmp_path, pg)
    first = job.run(crash="after_precommit:batch=1:partition=0")
    assert first.returncode > 0, f"the query should have failed:\n{first.tail()}"
    assert job.reached(CrashPoint.AFTER_PRECOMMIT, 1, partition=0), reached(job.crash_log)
    assert 1 not in pg.ledger_states() and pg.count() == ROWS
    # Spark's abort rolled back what the batch prepared (a task it was still stopping may
    # prepare after that: the next planning rolls it back, so the restart proves it).
    assert wait_for(lambda: pg.prepared() == [], 10), pg.prepared()
    second = job.run()
    check_restart(second)
    job.assert_exact()
    assert pg.prepared() == []


@pytest.mark.connect_local
def test_over_spark_connect_killed_after_the_decision_then_exact(
    tmp_path: Path, pg: PgTarget
) -> None:
    """A Connect client registers the data source; the server's workers plan and commit.
    The crash point in the server's commit worker takes the client and its local server
    (one session), as a lost host; the restart (a new server) settles the batch."""
    job = DataSourceJob(tmp_path, pg, files=3)
    job.connect = True
    first = job.run(crash="after_decision:batch=1")
    assert first.returncode == -9, first.tail()
    assert job.reached(CrashPoint.AFTER_DECISION, 1), reached(job.crash_log)
    assert pg.ledger_states().get(1) == "DECIDED" and pg.count() == ROWS
    second = job.run()
    check_restart(second)
    assert _outcome(second, 1) == "replayed", second.metrics()
    job.assert_exact()
    assert pg.prepared() == []


def test_a_batch_job_killed_after_its_decision_then_rerun_with_its_run_id_is_exact(
    tmp_path: Path, pg: PgTarget
) -> None:
    job = DataSourceJob(tmp_path, pg, source="rate")
    job.batch_run = 1
    first = job.run(crash="after_decision:batch=1")
    assert first.returncode == -9, first.tail()
    assert pg.ledger_states() == {1: "DECIDED"} and pg.count() == 0
    second = job.run()
    check_restart(second)
    assert _outcome(second, 1) == "replayed", second.metrics()
    third = job.run()  # the same run id again: nothing twice
    check_restart(third)
    assert sorted(pg.ids()) == list(range(500, 1000)) and pg.prepared() == []


# ---- in-process: Spark's progress, bad input, refusals ----


def _query(spark: SparkSession, source: Path, checkpoint: Path, *,
           available_now: bool = True, **options: str) -> Any:
    """A DataSource-form query over the JSON files in ``source``: until they are all
    written (``available_now``), else batch after batch until stopped."""
    df = (spark.readStream.schema("id LONG, name STRING, amount DOUBLE, ts TIMESTAMP")
          .option("maxFilesPerTrigger", 1).json(str(source)))
    writer = (df.writeStream.format("connectors.postgres").options(**options)
              .option("checkpointLocation", str(checkpoint)))
    return (writer.trigger(availableNow=True) if available_now else writer).start()


@pytest.fixture
def registered(spark: SparkSession) -> SparkSession:
    assert connectors.register(spark) == ["connectors.postgres"]
    return spark


def _options(pg: PgTarget, **more: str) -> dict[str, str]:
    return {"conninfo": pg.conninfo, "table": pg.table, "sink_id": pg.sink_id,
            "ledger_table": pg.ledger, **more}


def test_progress_reports_the_rows_and_a_second_checkpoint_is_refused(
    registered: SparkSession, tmp_path: Path, pg: PgTarget
) -> None:
    make_input_files(tmp_path / "in", 3, ROWS)
    query = _query(registered, tmp_path / "in", tmp_path / "ck", **_options(pg))
    query.awaitTermination()
    sinks = [p["sink"] for p in query.recentProgress]
    assert [s["numOutputRows"] for s in sinks] == [ROWS] * 3, json.dumps(sinks)
    assert query.lastProgress["sink"]["numOutputRows"] == ROWS
    pg.assert_exact(3 * ROWS)
    # A new checkpoint restarts batch ids at 0: the sink is bound to the first query.
    again = _query(registered, tmp_path / "in", tmp_path / "ck2", **_options(pg))
    with pytest.raises(Exception, match=r"QueryBindingError|is bound to query"):
        again.awaitTermination()
    pg.assert_exact(3 * ROWS)
    assert wait_for(lambda: pg.prepared() == [], 10), pg.prepared()


def test_a_null_into_not_null_is_refused_then_after_the_fix_exact(
    registered: SparkSession, tmp_path: Path, pg: PgTarget
) -> None:
    make_input_files(tmp_path / "in", 2, ROWS)
    bad = {"id": None, "name": "no id", "amount": 1.0, "ts": "2026-01-01T00:00:00Z"}
    (tmp_path / "in" / "part-00002.json").write_text(json.dumps(bad) + "\n")
    query = _query(registered, tmp_path / "in", tmp_path / "ck", **_options(pg))
    with pytest.raises(Exception, match="BadInputError") as failed:
        query.awaitTermination()
    assert "NOT NULL" in str(failed.value) or "not-null" in str(failed.value), failed.value
    assert pg.count() == 2 * ROWS and 2 not in pg.ledger_states()
    assert wait_for(lambda: pg.prepared() == [], 10), pg.prepared()
    pg.execute(f"ALTER TABLE {pg.table} ALTER COLUMN id DROP NOT NULL")
    query = _query(registered, tmp_path / "in", tmp_path / "ck", **_options(pg))
    query.awaitTermination()
    assert pg.count() == 2 * ROWS + 1 and pg.prepared() == []


def test_a_textfile_exporter_registered_before_the_source_gets_its_batches(
    registered: SparkSession, tmp_path: Path, pg: PgTarget
) -> None:
    """The commit runs in Spark's worker: exporters that travel go there with the source
    (registered again after ``export_metrics``), as to Spark Connect's worker."""
    from connectors.core.metrics import unregister_exporter

    textfile = tmp_path / "metrics.prom"
    exporter = connectors.export_metrics(connectors.PrometheusMetrics(port=None,
                                                                      textfile=str(textfile)))
    try:
        connectors.register(registered)
        make_input_files(tmp_path / "in", 2, ROWS)
        _query(registered, tmp_path / "in", tmp_path / "ck", **_options(pg)).awaitTermination()
    finally:
        unregister_exporter(exporter)
        connectors.register(registered)  # the source without the exporter, for later tests
    rows = [line for line in textfile.read_text().splitlines()
            if line.startswith("connectors_rows_total") and pg.sink_id in line]
    assert rows and float(rows[0].rsplit(" ", 1)[1]) == 2 * ROWS, rows


def test_a_graceful_stop_finishes_the_batch_in_flight_and_refuses_the_next(
    registered: SparkSession, tmp_path: Path, pg: PgTarget
) -> None:
    """``connectors.stop_gracefully`` on a DataSource-form query whose batches run back to
    back: the planning worker reads the host's stop flag and refuses the next batch before
    it writes anything; nothing is left prepared; the restart writes the rest exactly."""
    files = 8
    make_input_files(tmp_path / "in", files, ROWS)
    query = _query(registered, tmp_path / "in", tmp_path / "ck", available_now=False,
                   **_options(pg))
    assert wait_for(lambda: len(pg.ledger_states()) >= 2, 120), pg.ledger_states()
    report = connectors.stop_gracefully(query, timeout=60)
    assert report.clean, report
    assert not query.isActive
    states = pg.ledger_states()
    assert set(states.values()) == {"COMMITTED"} and pg.prepared() == [], states
    assert pg.count() == len(states) * ROWS
    if report.outcome == "refused_next_batch":
        assert "GracefulStop" in str(query.exception()) or "graceful" in report.message
    again = _query(registered, tmp_path / "in", tmp_path / "ck", **_options(pg))
    again.awaitTermination()
    pg.assert_exact(files * ROWS)
    assert pg.prepared() == []


@pytest.mark.parametrize(("options", "message"), [
    ({"mode": "upsert", "key_columns": "id"}, "cannot route rows"),
    ({"batch_size": "10"}, r"unknown option\(s\) \['batch_size'\]"),
    ({"sink_id": ""}, 'option "sink_id" is required'),
])
def test_what_the_form_cannot_keep_is_refused_before_any_row(
    registered: SparkSession, tmp_path: Path, pg: PgTarget, options: dict[str, str],
    message: str
) -> None:
    make_input_files(tmp_path / "in", 1, 10)
    if options.get("mode") == "upsert":  # a table upsert can write: the key is the refusal
        pg.execute(f"ALTER TABLE {pg.table} ADD PRIMARY KEY (id)")
    query = _query(registered, tmp_path / "in", tmp_path / "ck", **_options(pg, **options))
    with pytest.raises(Exception, match=message):
        query.awaitTermination()
    assert pg.count() == 0 and pg.prepared() == [] and pg.ledger_states() == {}
