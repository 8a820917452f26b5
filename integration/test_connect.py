"""The sinks over Spark Connect: the job is a Connect client, ``foreachBatch`` runs in a
Python worker next to the server.

Each driver here is an example job run with ``--connect``: PySpark starts a local Connect
server (a JVM of its own, child of the client) whose foreachBatch worker inherits the
client's environment, so ``CONNECTORS_CRASH_AT`` arms the crash points in that worker: at
a driver-side crash point the worker SIGKILLs itself, the server fails the query, the
client exits with an error; a restart on the same checkpoint must then be exact, row by
row. The binding is never silently lost: a new checkpoint is refused, and so is a sink
without ``query_name`` (the worker is not told which query calls it).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from connectors import CrashPoint
from integration._connect_server import connect_server, start_server
from integration._delta import intent_batches, ledger_batches
from integration._driver import DriverRun, KillJob, reached, spark_batches
from integration._kafka import KafkaTarget, wait_no_open_transactions
from integration._pg import PgTarget
from integration.test_delta_kill import APPEND, MERGE, DeltaJob
from integration.test_kafka_kill import KafkaJob, kafka  # noqa: F401 - the kafka fixture
from integration.test_postgres_kill import PgJob, pg  # noqa: F401 - the pg fixture

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUERY = "orders"


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


def _failed_in_the_worker(run: DriverRun) -> None:
    """The client ended with the query's error (the worker died), not by a signal."""
    assert run.returncode not in (0, -9), run.tail()


def test_worker_killed_after_the_decision_then_restart_is_exact(
    tmp_path: Path, spark: SparkSession
) -> None:
    job = ConnectDeltaJob(tmp_path, source="rate", batches=3, rows=100)
    first = job.run(crash=f"after_decision:batch=1:sink={APPEND}")
    _failed_in_the_worker(first)
    assert job.reached(CrashPoint.AFTER_DECISION, 1), reached(job.crash_log)
    assert 1 in intent_batches(job.a, APPEND)  # decided, not yet recorded
    second = job.run()
    assert second.returncode == 0, second.tail()
    job.assert_exact(spark)
    # The client's sink never ran: the worker's published its metrics into the session.
    assert f"last metrics of sink {APPEND}: {{'sink_id': '{APPEND}', 'batch_id': 2" in \
        second.output, second.tail()
    # A new checkpoint is a new query: refused, never taken for a batch job.
    job.checkpoint = tmp_path / "ckpt-new"
    third = job.run()
    assert third.returncode != 0
    assert "QueryBindingError" in third.output and "is bound to query" in third.output


def test_postgres_worker_killed_after_the_decision_then_restart_is_exact(
    tmp_path: Path, pg: PgTarget  # noqa: F811 - the imported fixture
) -> None:
    job = ConnectPgJob(tmp_path, pg, files=3)
    first = job.run(crash="after_decision:batch=1")
    _failed_in_the_worker(first)
    assert job.reached(CrashPoint.AFTER_DECISION, 1), reached(job.crash_log)
    assert pg.prepared(), "the decided batch's transactions are left prepared"
    second = job.run()
    assert second.returncode == 0, second.tail()
    job.assert_exact()
    assert not pg.prepared(), "nothing left prepared"


def test_kafka_worker_killed_before_the_decision_then_restart_is_exact(
    tmp_path: Path, kafka: KafkaTarget  # noqa: F811 - the imported fixture
) -> None:
    job = ConnectKafkaJob(tmp_path, kafka, files=3)
    first = job.run(crash="before_decision:batch=1")
    _failed_in_the_worker(first)
    assert job.reached(CrashPoint.BEFORE_DECISION, 1), reached(job.crash_log)
    second = job.run()
    assert second.returncode == 0, second.tail()
    job.assert_exact()
    topics = [kafka.topic, kafka.marker_topic]
    assert not wait_no_open_transactions(kafka.bootstrap, topics), "nothing left open"


def test_a_sink_without_query_name_is_refused_with_the_fix(tmp_path: Path) -> None:
    job = ConnectDeltaJob(tmp_path, source="rate", batches=2, rows=50)
    job.query_name = None
    run = job.run()
    assert run.returncode != 0
    assert "under Spark Connect the sink cannot tell which streaming query" in run.output
    assert "queryName('orders')" in run.output and "run_batch(df, run_id)" in run.output
    assert not (job.a / "_delta_log").exists() or not intent_batches(job.a, APPEND)


# ---------------------------------------------------- a separate Connect server process


def _stall_env(job: KillJob, spec: str) -> dict[str, str]:
    """The server's environment arming ``spec`` (with a long stall) in its worker."""
    return {"CONNECTORS_TEST_MODE": "1", "CONNECTORS_CRASH_AT": spec,
            "CONNECTORS_CRASH_LOG": str(job.crash_log)}


def _server_killed_at(job: KillJob, root: Path, point: CrashPoint, batch: int,
                      sink: str) -> DriverRun:
    """Run ``job`` as a client of a separate server whose foreachBatch worker stalls at
    ``point`` of ``batch``; SIGKILL the whole server there (JVM, worker, Python workers),
    as a lost host. Returns the client's run (killed 20 s after the server at the latest:
    its gRPC client retries a lost server for minutes)."""
    stall = f"{point.value}:batch={batch}:sink={sink}:action=stall:seconds=600"
    server = start_server(root / "server-1", _stall_env(job, stall))
    server_killed = threading.Event()
    try:
        with ThreadPoolExecutor(1) as pool:
            client = pool.submit(job.run, "--master", server.url, kill_after=20.0,
                                 kill_when=server_killed.is_set)
            deadline = time.monotonic() + 240
            while not job.reached(point, batch, sink_id=sink):
                assert time.monotonic() < deadline and not client.done(), server.tail()
                time.sleep(0.2)
            server.kill()
            server_killed.set()
            first = client.result(timeout=120)
    finally:
        server.stop()
    assert first.returncode != 0, first.tail()  # the client lost its server
    return first


def test_server_jvm_killed_after_the_decision_then_restart_is_exact(
    tmp_path: Path, spark: SparkSession
) -> None:
    """DeltaSink: the server SIGKILLed while the worker sits after the decision; a new
    server and the client restarted on the same checkpoint finish exactly once."""
    job = ConnectDeltaJob(tmp_path, source="rate", batches=3, rows=100)
    _server_killed_at(job, tmp_path, CrashPoint.AFTER_DECISION, 1, APPEND)
    assert 1 in intent_batches(job.a, APPEND)  # decided, not yet recorded
    with connect_server(tmp_path / "server-2") as fresh:
        second = job.run("--master", fresh.url)
    assert second.returncode == 0, second.tail()
    job.assert_exact(spark)


def test_postgres_server_jvm_killed_after_the_decision_then_restart_is_exact(
    tmp_path: Path, pg: PgTarget  # noqa: F811 - the imported fixture
) -> None:
    job = ConnectPgJob(tmp_path, pg, files=3)
    _server_killed_at(job, tmp_path, CrashPoint.AFTER_DECISION, 1, pg.sink_id)
    assert pg.prepared(), "the decided batch's transactions are left prepared"
    with connect_server(tmp_path / "server-2") as fresh:
        second = job.run("--master", fresh.url)
    assert second.returncode == 0, second.tail()
    job.assert_exact()
    assert not pg.prepared(), "nothing left prepared"


def test_kafka_server_jvm_killed_before_the_decision_then_restart_is_exact(
    tmp_path: Path, kafka: KafkaTarget  # noqa: F811 - the imported fixture
) -> None:
    job = ConnectKafkaJob(tmp_path, kafka, files=3)
    _server_killed_at(job, tmp_path, CrashPoint.BEFORE_DECISION, 1, kafka.sink_id)
    with connect_server(tmp_path / "server-2") as fresh:
        second = job.run("--master", fresh.url)
    assert second.returncode == 0, second.tail()
    job.assert_exact()
    topics = [kafka.topic, kafka.marker_topic]
    assert not wait_no_open_transactions(kafka.bootstrap, topics), "nothing left open"


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
