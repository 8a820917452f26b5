"""The sinks over Spark Connect: the job is a Connect client, ``foreachBatch`` runs in a
Python worker next to the server, and the sink's driver side (decide, commit, recover)
runs in that worker.

For each sink, at its driver-side crash points (one per sink in CI, every one with
``EOS_WIDE_MATRIX=1``), two deaths:

- **the worker**: the job runs with ``--connect`` on a local Connect server (a JVM of its
  own, child of the client) whose foreachBatch worker inherits the client's environment,
  so ``CONNECTORS_CRASH_AT`` arms the crash points there; the worker SIGKILLs itself, the
  server fails the query and the client exits with its error;
- **the server**: a separate server process (``integration/connect/_connect_server.py``) whose
  worker stalls at the crash point; the whole server (JVM and Python workers) is SIGKILLed
  there, as a lost host.

Then a restart on the same checkpoint (a new server) must be exact, row by row, with
nothing left prepared (PostgreSQL) or open (Kafka). The binding is never silently lost: a
new checkpoint is refused, and so is a sink without ``query_name`` (the worker is not told
which query calls it). Killing only the client leaves the query running on its server.

DeltaSink on ``s3a://`` (the worker killed): the server gets the s3 jars and every s3a
setting, the keys too, as confs; the sink in the worker reads them from its session (no
``AWS_*`` variable anywhere); delta-rs reads the tables back.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from connectors.sdk import CrashPoint
from connectors.testing.kill import kill_at_each
from integration.connect._connect_server import connect_server, start_server
from integration.core.test_stopping import PG_CI, Stopped, batches_for, stop_chain, wide
from integration.delta.test_delta_kill import APPEND, MERGE, DeltaJob
from integration.delta.test_delta_s3 import S3DeltaJob, killed_holds
from integration.kafka.test_kafka_kill import KafkaJob, kafka  # noqa: F401 - the kafka fixture
from integration.postgres.test_postgres_kill import PgJob, pg  # noqa: F401 - the pg fixture
from integration.support._delta import intent_batches, ledger_batches
from integration.support._driver import DriverRun, KillJob, spark_batches
from integration.support._kafka import KafkaTarget, wait_no_open_transactions
from integration.support._pg import PgTarget

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.connect_local]

WIDE = os.environ.get("EOS_WIDE_MATRIX") == "1"
QUERY = "orders"
#: Seconds the client may outlive its killed server: its gRPC client retries a lost server
#: for minutes, and nothing it does can touch the target (the sink runs in the worker).
CLIENT_GRACE = 3.0

Plan = list[tuple[CrashPoint, str, int]]
BD, AD, BC, AC = (CrashPoint.BEFORE_DECISION, CrashPoint.AFTER_DECISION,
                  CrashPoint.BETWEEN_COMMITS, CrashPoint.AFTER_COMMIT)


def connect_args(query_name: str | None = QUERY) -> list[str]:
    """An example job's flags to run as a Connect client of a local Connect server."""
    return ["--connect", "--query-name", query_name or ""]


class ConnectDeltaJob(DeltaJob):
    """The Delta kill tests' job (an append table and a MERGE table), as a Connect client."""

    query_name: str | None = QUERY

    def args(self) -> list[str]:
        return [*super().args(), *connect_args(self.query_name)]


class ConnectPgJob(PgJob):
    def args(self) -> list[str]:
        return [*super().args(), *connect_args()]


class ConnectKafkaJob(KafkaJob):
    def args(self) -> list[str]:
        return [*super().args(), *connect_args()]


# ------------------------------------------------------------------ the sinks' cases


class Case:
    """One sink's Connect kill case: its job, its crash points (the family's driver-side
    points, in the order a restarted job meets them; CI takes one), what the target holds
    at each point, and what must hold at the end."""

    full: Plan
    ci: Plan

    def plan(self) -> Plan:
        return self.full if WIDE else self.ci

    def job(self, root: Path, plan: Plan) -> KillJob:
        raise NotImplementedError

    def after_kill(self, job: Any, point: CrashPoint, sink: str, batch: int) -> None:
        """What the target holds at ``point``."""

    def finish(self, job: Any, final: DriverRun) -> None:
        """The output exact, row by row; nothing left prepared or open."""
        job.assert_exact()


class DeltaCase(Case):
    """DeltaSink (commits on the driver): the append sink and the MERGE sink by turns."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.full = [(BD, APPEND, 1), (AD, MERGE, 2), (AC, APPEND, 3)]
        self.ci = [(AD, APPEND, 1)]

    def job(self, root: Path, plan: Plan) -> ConnectDeltaJob:
        return ConnectDeltaJob(root, source="rate", batches=plan[-1][2] + 2, rows=100)

    def after_kill(self, job: Any, point: CrashPoint, sink: str, batch: int) -> None:
        path = job.a if sink == APPEND else job.b
        ledger = ledger_batches(path, sink)
        assert all(ledger.get(b) for b in range(batch)), ledger
        if point is BD:
            assert batch not in ledger and batch not in intent_batches(path, sink)
        elif point is AD:
            assert batch not in ledger and batch in intent_batches(path, sink)  # decided
        else:
            assert ledger.get(batch) is True, ledger

    def finish(self, job: Any, final: DriverRun) -> None:
        job.assert_exact(self.spark)
        # The client's sink never ran: the worker published its metrics into the session.
        last = f"last metrics of sink {APPEND}: {{'sink_id': '{APPEND}', " \
               f"'batch_id': {job.batches - 1}"
        assert last in final.output, final.tail()


class PgCase(Case):
    """PostgresSink (prepared transactions decided on the driver)."""

    def __init__(self, target: PgTarget) -> None:
        self.pg = target
        s = target.sink_id
        self.full = [(BD, s, 1), (AD, s, 2), (BC, s, 3), (AC, s, 4)]
        self.ci = [(AD, s, 1)]

    def job(self, root: Path, plan: Plan) -> ConnectPgJob:
        return ConnectPgJob(root, self.pg, files=plan[-1][2] + 2)

    def after_kill(self, job: Any, point: CrashPoint, sink: str, batch: int) -> None:
        ledger = self.pg.ledger_states()
        prepared = [t for t in self.pg.prepared() if t.batch_id == batch]
        if point is AC:
            assert not prepared and ledger.get(batch) == "COMMITTED", (prepared, ledger)
        else:
            assert prepared, "the batch's transactions are left prepared"
            assert ledger.get(batch) == (None if point is BD else "DECIDED"), ledger

    def finish(self, job: Any, final: DriverRun) -> None:
        job.assert_exact()
        assert not self.pg.prepared(), "nothing left prepared"


class KafkaCase(Case):
    """KafkaSink (slots commit in their tasks; the ledger record is the decision)."""

    def __init__(self, target: KafkaTarget) -> None:
        self.kafka = target
        s = target.sink_id
        self.full = [(BD, s, 1), (AC, s, 2)]
        self.ci = [(BD, s, 1)]

    def job(self, root: Path, plan: Plan) -> ConnectKafkaJob:
        return ConnectKafkaJob(root, self.kafka, files=plan[-1][2] + 2)

    def finish(self, job: Any, final: DriverRun) -> None:
        job.assert_exact()
        topics = [self.kafka.topic, self.kafka.marker_topic]
        assert not wait_no_open_transactions(self.kafka.bootstrap, topics), "left open"


def _case(name: str, request: pytest.FixtureRequest) -> Case:
    if name == "delta":
        return DeltaCase(request.getfixturevalue("spark"))
    if name == "postgres":
        return PgCase(request.getfixturevalue("pg"))
    return KafkaCase(request.getfixturevalue("kafka"))


SINKS = ["delta", "postgres", "kafka"]


# --------------------------------------------------------------- the worker SIGKILLed


def _failed_in_the_worker(run: DriverRun) -> None:
    """The client ended with the query's error (the worker died), not by a signal."""
    assert run.returncode not in (0, -9), run.tail()


@pytest.mark.parametrize("sink", SINKS)
def test_worker_killed_at_driver_side_crash_points_then_restart_is_exact(
    sink: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    case = _case(sink, request)
    plan = case.plan()
    job = case.job(tmp_path, plan)
    runs = kill_at_each(job, plan, killed=_failed_in_the_worker,
                        after_kill=lambda p, s, b, _run: case.after_kill(job, p, s, b))
    case.finish(job, runs[-1])
    if sink == "delta":
        # A new checkpoint is a new query: refused, never taken for a batch job.
        job.checkpoint = tmp_path / "ckpt-new"
        third = job.run()
        assert third.returncode != 0
        assert "QueryBindingError" in third.output and "is bound to query" in third.output


class ConnectS3DeltaJob(S3DeltaJob):
    """S3DeltaJob as a Connect client; the keys are confs (of the local server) too."""

    keys_in_env = False

    def args(self) -> list[str]:
        return [*super().args(), *connect_args()]


def test_delta_on_s3a_worker_killed_at_driver_side_crash_points_then_restart_is_exact(
    tmp_path: Path, s3_service: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_REGION",
                 "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)  # only the session's confs reach the sink
    plan = [(BD, APPEND, 1), (AD, MERGE, 2), (AC, APPEND, 3)] if WIDE else [(AD, APPEND, 1)]
    job = ConnectS3DeltaJob(tmp_path, s3_service, source="rate", batches=plan[-1][2] + 2,
                            rows=100)
    runs = kill_at_each(job, plan, killed=_failed_in_the_worker, after_kill=killed_holds(job))
    # delta-rs, row by row; the ledger objects. The worker ends with the query (a plain
    # stop) before its sinks close: the lease is left as a killed driver's, by a pid gone.
    job.assert_exact(released=False)
    assert not any("taking over the lease" in r.output for r in runs), "a restart waited"
    last = f"last metrics of sink {APPEND}: {{'sink_id': '{APPEND}', 'batch_id': {job.batches - 1}"
    assert last in runs[-1].output, runs[-1].tail()  # the sink ran in the worker
    assert not any(s3_service.secret_key in r.output for r in runs), "a key in the output"


def test_kafka_small_batch_slots_die_with_the_worker_then_restart_is_exact(
    tmp_path: Path, kafka: KafkaTarget  # noqa: F811
) -> None:
    """KafkaSink's default ``small_batch_rows``: under Connect a small batch's slots run in
    the foreachBatch worker (the sink's driver there). The worker SIGKILLs itself while
    slot 1 has produced and not committed, slot 0 perhaps committed; the restart finishes
    the batch through the shuffle (the first batch of a run) and the rest in the worker:
    every record once, nothing left open."""
    job = ConnectKafkaJob(tmp_path, kafka, source="rate", small_batch_rows=1000)
    # A stall of 0 s at batch 1's decision records the pid of the process running the
    # sink's driver side; the slot's crash point in batch 2 must fire in that process.
    first = job.run(crash="before_decision:batch=1:action=stall:seconds=0;"
                          "before_precommit:batch=2:partition=1")
    _failed_in_the_worker(first)
    assert job.reached(CrashPoint.BEFORE_PRECOMMIT, 2, partition=1)
    pids = {line.split()[0]: line.split("pid=")[1].strip()
            for line in Path(job.crash_log).read_text().splitlines()}
    assert pids["before_precommit"] == pids["before_decision"], pids  # not a Spark task
    final = job.run()
    assert final.returncode == 0, final.tail()
    job.assert_exact()
    assert not wait_no_open_transactions(kafka.bootstrap, [kafka.topic, kafka.marker_topic])


def test_a_sink_without_query_name_is_refused_with_the_fix(tmp_path: Path) -> None:
    job = ConnectDeltaJob(tmp_path, source="rate", batches=2, rows=50)
    job.query_name = None
    run = job.run()
    assert run.returncode != 0
    assert "under Spark Connect the sink cannot tell which streaming query" in run.output
    assert "queryName('orders')" in run.output and "run_batch(df, run_id)" in run.output
    assert not (job.a / "_delta_log").exists() or not intent_batches(job.a, APPEND)


# ------------------------------------------------------ a separate server SIGKILLed


def server_killed_at_each(job: KillJob, plan: Plan, root: Path,
                          after_kill: Callable[[CrashPoint, str, int], None]) -> DriverRun:
    """For each ``(point, sink, batch)`` of ``plan``: a new server whose foreachBatch worker
    stalls at that point, the client run on it, the whole server SIGKILLed there (the
    client a moment later); Spark has the batch in its offset log, not in its commit log.
    Then a last new server and a clean run, returned."""
    for i, (point, sink, batch) in enumerate(plan):
        stall = f"{point.value}:batch={batch}:sink={sink}:action=stall:seconds=600"
        env = {"CONNECTORS_TEST_MODE": "1", "CONNECTORS_CRASH_AT": stall,
               "CONNECTORS_CRASH_LOG": str(job.crash_log)}
        server = start_server(root / f"server-{i}", env)
        server_killed = threading.Event()
        try:
            with ThreadPoolExecutor(1) as pool:
                client = pool.submit(job.run, "--master", server.url, kill_after=CLIENT_GRACE,
                                     kill_when=server_killed.is_set)
                deadline = time.monotonic() + 240
                while not job.reached(point, batch, sink_id=sink):
                    assert time.monotonic() < deadline and not client.done(), server.tail()
                    time.sleep(0.2)
                server.kill()
                server_killed.set()
                run = client.result(timeout=120)
        finally:
            server.stop()
        assert run.returncode != 0, run.tail()  # the client lost its server
        offsets, commits = spark_batches(job.checkpoint)
        assert batch in offsets and batch not in commits, (offsets, commits)
        after_kill(point, sink, batch)
    with connect_server(root / "server-last") as fresh:
        final = job.run("--master", fresh.url)
    assert final.returncode == 0, final.tail()
    return final


@pytest.mark.parametrize("sink", SINKS)
def test_server_jvm_killed_at_driver_side_crash_points_then_restart_is_exact(
    sink: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    case = _case(sink, request)
    plan = case.plan()
    job = case.job(tmp_path, plan)
    final = server_killed_at_each(job, plan, tmp_path,
                                  lambda p, s, b: case.after_kill(job, p, s, b))
    case.finish(job, final)


# ------------------------------------------------------------ only the client killed


@pytest.mark.skipif(not WIDE, reason="EOS_WIDE_MATRIX=1 only (CI's time budget): what "
                    "Spark Connect does, documented in docs/where-it-runs.md; no sink code")
def test_killing_only_the_client_leaves_the_query_running_on_the_server(
    tmp_path: Path, spark: SparkSession
) -> None:
    """What a client's death does to a separate server's query: nothing. The query goes on
    writing its batches with no client (until its session expires), exactly once."""
    job = ConnectDeltaJob(tmp_path, source="rate", batches=6, rows=50)
    with connect_server(tmp_path / "server") as server:
        run = job.run("--master", server.url, kill_after=0.0,
                      kill_when=lambda: len(ledger_batches(job.a, APPEND)) >= 1)
        assert run.returncode == -9, run.tail()
        at_kill = len(ledger_batches(job.a, APPEND))
        deadline = time.monotonic() + 180
        planned = set(range(job.batches))

        def all_written() -> bool:  # both tables and Spark's commit log
            return (planned <= set(ledger_batches(job.a, APPEND))
                    and planned <= set(ledger_batches(job.b, MERGE))
                    and planned <= spark_batches(job.checkpoint)[1])

        while not all_written():
            assert time.monotonic() < deadline, (at_kill, ledger_batches(job.a, APPEND))
            time.sleep(0.5)
    assert at_kill < job.batches  # the batches after the kill were written by the server
    job.assert_exact(spark)


# ------------------------------------------------------------------ graceful stops


def test_graceful_stop_under_connect_leaves_nothing_and_restarts_exactly(
        tmp_path: Path, pg: PgTarget) -> None:  # noqa: F811 - the pg fixture
    """The SIGTERM reaches the client; the stop request reaches the sink in the server's
    foreachBatch worker through the session's configuration. CI: one stop, at the
    decision; ``EOS_WIDE_MATRIX=1``: three graceful stops in each phase. (A plain
    ``query.stop()`` under Connect ends the worker with the query: what a hard kill
    leaves, which the kill tests above cover; docs/stopping.md.)"""
    plan = [s for s in wide([p for _, p in PG_CI]) if s[0] == "graceful"] if WIDE \
        else [("graceful", BD)]
    job = ConnectPgJob(tmp_path, pg, source="rate")
    job.batches, job.rows_per_batch = batches_for(plan), 200
    job.total = job.batches * job.rows_per_batch

    def nothing_left(stopped: Stopped) -> None:
        assert pg.prepared() == [], pg.prepared()

    stop_chain(job, pg.sink_id, plan, nothing_left)
    job.assert_exact()


def test_graceful_stop_of_kafka_and_delta_sinks_under_connect(
        tmp_path: Path, kafka: KafkaTarget, spark: SparkSession) -> None:  # noqa: F811
    """The same for KafkaSink (a graceful stop after its slots committed, at the decision)
    and DeltaSink (two tables in one foreachBatch function, stopped at the append sink's
    decision: the MERGE sink finishes the batch too), one stop each."""
    kjob = ConnectKafkaJob(tmp_path / "kafka", kafka, source="rate")
    plan = [("graceful", BD)]
    kjob.batches, kjob.rows_per_batch = batches_for(plan), 200
    kjob.total = kjob.batches * kjob.rows_per_batch

    def no_open_transaction(stopped: Stopped) -> None:
        kafka.assert_no_open_transactions()

    stop_chain(kjob, kafka.sink_id, plan, no_open_transaction)
    kjob.assert_exact()

    djob = ConnectDeltaJob(tmp_path / "delta", source="rate", rows=100,
                           batches=batches_for(plan))

    def no_intent(stopped: Stopped) -> None:
        assert intent_batches(djob.a, APPEND) == [] and intent_batches(djob.b, MERGE) == []

    stop_chain(djob, APPEND, plan, no_intent)
    djob.assert_exact(spark)
