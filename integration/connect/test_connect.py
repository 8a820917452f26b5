"""The sinks over Spark Connect: the job is a Connect client, ``foreachBatch`` runs in a
Python worker next to the server, and the sink's driver side (decide, commit, recover)
runs in that worker.

For each sink, at its driver-side crash points (one per sink in CI, every one with
``EOS_WIDE_MATRIX=1``), two deaths and a graceful stop, chained in one job (each run a
restart of the last on the same checkpoint) on separate server processes
(``integration/connect/_connect_server.py``, whose foreachBatch worker inherits the
server's environment, so ``CONNECTORS_CRASH_AT`` arms the crash points there):

- **the server**: the worker stalls at the point and the whole server (JVM and Python
  workers) is SIGKILLed there, as a lost host; the restart runs on a new server;
- **the worker**: on that new server the worker SIGKILLs itself at the same point of the
  next batch; the server fails the query (and lives on), the client exits with its error;
- **a graceful stop**, on the same server: the SIGTERM reaches the client, the stop request
  reaches the sink in the worker through the session's configuration, at the decision.

Then a last run on that server must be exact, row by row, with nothing left prepared
(PostgreSQL, MariaDB) or open (Kafka). The binding is never silently lost: a new checkpoint is
refused, and so is a sink without ``query_name`` (the worker is not told which query calls
it). Killing only the client leaves the query running on its server (wide only).

DeltaSink on ``s3a://`` (the worker killed) runs with ``--connect`` on a local Connect
server (a JVM of its own, child of the client, whose worker inherits the client's
environment): the server gets the s3 jars and every s3a setting, the keys too, as confs;
the sink in the worker reads them from its session (no ``AWS_*`` variable anywhere);
delta-rs reads the tables back. Only that test holds the host-wide lock of local Connect
servers (``connect_local``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pyspark.sql import SparkSession

from connectors.sdk import CrashPoint
from connectors.testing.kill import kill_at_each
from integration.connect._connect_server import ConnectServer, connect_server, start_server
from integration.core.test_stopping import (
    FIRST,
    PG_CI,
    STALL_SECONDS,
    Stopped,
    batches_for,
    stop_chain,
    wide,
)
from integration.delta.test_delta_kill import APPEND, MERGE, DeltaJob
from integration.delta.test_delta_s3 import S3DeltaJob, killed_holds
from integration.kafka.test_kafka_kill import KafkaJob, kafka  # noqa: F401 - the kafka fixture
from integration.mariadb.test_mariadb_kill import MariaJob
from integration.mariadb.test_mariadb_kill import Target as MariaTarget
from integration.postgres.test_postgres_kill import PgJob, pg  # noqa: F401 - the pg fixture
from integration.support._delta import intent_batches, ledger_batches
from integration.support._driver import DriverRun, KillJob, spark_batches
from integration.support._kafka import KafkaTarget, wait_no_open_transactions
from integration.support._pg import PgTarget

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WIDE = os.environ.get("EOS_WIDE_MATRIX") == "1"
QUERY = "orders"
#: Seconds the client may outlive its killed server: its gRPC client retries a lost server
#: for minutes, and nothing it does can touch the target (the sink runs in the worker).
CLIENT_GRACE = 3.0
#: Seconds a worker stalls at the point where its server is killed (it never wakes).
SERVER_STALL = 600

Plan = list[tuple[CrashPoint, str, int]]
SERVER, WORKER, GRACEFUL = "server", "worker", "graceful"
#: One step of a chain: ``(what dies, or a graceful stop; point, sink, batch)``.
Step = tuple[str, CrashPoint, str, int]
BD, AD, BC, AC = (CrashPoint.BEFORE_DECISION, CrashPoint.AFTER_DECISION,
                  CrashPoint.BETWEEN_COMMITS, CrashPoint.AFTER_COMMIT)


def connect_args(query_name: str | None = QUERY) -> list[str]:
    """An example job's flags to run as a Connect client (of a local Connect server, or of
    ``--master sc://...``)."""
    return ["--connect", "--query-name", query_name or ""]


def server_env(crash_log: Path, spec: str) -> dict[str, str]:
    """A server's environment that arms ``spec`` in its foreachBatch worker (and its Python
    workers), each point reached appended to ``crash_log``."""
    return {"CONNECTORS_TEST_MODE": "1", "CONNECTORS_CRASH_AT": spec,
            "CONNECTORS_CRASH_LOG": str(crash_log)}


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


class ConnectMariaJob(MariaJob):
    def args(self) -> list[str]:
        return [*super().args(), *connect_args()]


# ------------------------------------------------------------------ the sinks' cases


class Case:
    """One sink's Connect kill case: its job, its crash points (the family's driver-side
    points, in the order a restarted job meets them; CI takes one), what the target holds
    at each point, and what must hold at the end."""

    full: list[tuple[CrashPoint, str]]
    ci: list[tuple[CrashPoint, str]]

    #: The sink whose decision a graceful stop lands in.
    stop_sink: str

    def steps(self) -> list[Step]:
        """At each point, the server killed (batch ``2i+1``), then the worker (``2i+2``);
        then a graceful stop at the decision of the next batch."""
        points = self.full if WIDE else self.ci
        kills = [(kind, point, sink, 2 * i + j + 1)
                 for i, (point, sink) in enumerate(points)
                 for j, kind in enumerate((SERVER, WORKER))]
        return [*kills, (GRACEFUL, BD, self.stop_sink, len(kills) + 1)]

    def job(self, root: Path, last: int) -> KillJob:
        """The job (rate source), whose last batch is ``last``."""
        raise NotImplementedError

    def after_kill(self, job: Any, point: CrashPoint, sink: str, batch: int) -> None:
        """What the target holds at ``point``."""

    def after_stop(self, job: Any) -> None:
        """Nothing left by a graceful stop: nothing prepared, open or half-committed."""

    def finish(self, job: Any, final: DriverRun) -> None:
        """The output exact, row by row; nothing left prepared or open."""
        job.assert_exact()


_Job = TypeVar("_Job", bound=KillJob)


def _through(last: int, job: _Job, rows: int = 200) -> _Job:
    """``job`` (a rate-source job of PostgreSQL's or Kafka's) set to run batches 0..``last``
    of ``rows`` rows each."""
    job.batches, job.rows_per_batch = last + 1, rows  # type: ignore[attr-defined]
    job.total = job.batches * job.rows_per_batch  # type: ignore[attr-defined]
    return job


class DeltaCase(Case):
    """DeltaSink (commits on the driver): the append sink and the MERGE sink by turns."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.full = [(BD, APPEND), (AD, MERGE), (AC, APPEND)]
        self.ci = [(AD, APPEND)]
        # Stopped at the append sink's decision: the MERGE sink finishes the batch too.
        self.stop_sink = APPEND

    def job(self, root: Path, last: int) -> ConnectDeltaJob:
        return ConnectDeltaJob(root, source="rate", batches=last + 1, rows=100)

    def after_stop(self, job: Any) -> None:
        assert intent_batches(job.a, APPEND) == [] and intent_batches(job.b, MERGE) == []

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


class PreparedCase(Case):
    """A sink of prepared transactions decided on the driver: PostgresSink (``PREPARE
    TRANSACTION``) or MariaDBSink (XA branches); ``target`` lists them (``prepared()``)
    and reads the ledger (``ledger_states()``)."""

    def __init__(self, target: Any, job: Callable[[Path, int], KillJob]) -> None:
        self.target = target
        self._job = job
        s = target.sink_id
        self.full = [(BD, s), (AD, s), (BC, s), (AC, s)]
        self.ci = [(AD, s)]
        self.stop_sink = s

    def job(self, root: Path, last: int) -> KillJob:
        return self._job(root, last)

    def after_stop(self, job: Any) -> None:
        assert self.target.prepared() == [], self.target.prepared()

    def after_kill(self, job: Any, point: CrashPoint, sink: str, batch: int) -> None:
        ledger = self.target.ledger_states()
        prepared = [t for t in self.target.prepared() if t.batch_id == batch]
        if point is AC:
            assert not prepared and ledger.get(batch) == "COMMITTED", (prepared, ledger)
        else:
            assert prepared, "the batch's transactions are left prepared"
            assert ledger.get(batch) == (None if point is BD else "DECIDED"), ledger

    def finish(self, job: Any, final: DriverRun) -> None:
        job.assert_exact()
        assert not self.target.prepared(), "nothing left prepared"


class KafkaCase(Case):
    """KafkaSink (slots commit in their tasks; the ledger record is the decision)."""

    def __init__(self, target: KafkaTarget) -> None:
        self.kafka = target
        s = target.sink_id
        self.full = [(BD, s), (AC, s)]
        self.ci = [(BD, s)]
        # (after its slots committed)
        self.stop_sink = s

    def job(self, root: Path, last: int) -> ConnectKafkaJob:
        return _through(last, ConnectKafkaJob(root, self.kafka, source="rate"))

    def after_stop(self, job: Any) -> None:
        self.kafka.assert_no_open_transactions()

    def finish(self, job: Any, final: DriverRun) -> None:
        job.assert_exact()
        topics = [self.kafka.topic, self.kafka.marker_topic]
        assert not wait_no_open_transactions(self.kafka.bootstrap, topics), "left open"


def _case(name: str, request: pytest.FixtureRequest) -> Case:
    if name == "delta":
        return DeltaCase(request.getfixturevalue("spark"))
    if name == "postgres":
        pg = request.getfixturevalue("pg")
        return PreparedCase(pg, lambda root, last: _through(
            last, ConnectPgJob(root, pg, source="rate")))
    if name == "mariadb":
        maria = MariaTarget(request.getfixturevalue("mariadb_url"))
        request.addfinalizer(maria.cleanup)
        return PreparedCase(maria, lambda root, last: ConnectMariaJob(
            root, maria, files=last + 1, rate_rows=200))
    return KafkaCase(request.getfixturevalue("kafka"))


SINKS = ["delta", "postgres", "kafka", "mariadb"]


# ------------------------------------------- the server, then the worker, SIGKILLed


def _failed_in_the_worker(run: DriverRun) -> None:
    """The client ended with the query's error (the worker died), not by a signal."""
    assert run.returncode not in (0, -9), run.tail()


def _server_killed(job: KillJob, server: ConnectServer, point: CrashPoint, sink: str,
                   batch: int) -> DriverRun:
    """The client run on ``server`` until its worker stalls at ``point`` of ``batch``; the
    whole server SIGKILLed there (the client a moment later)."""
    server_killed = threading.Event()
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
    assert run.returncode != 0, run.tail()  # the client lost its server
    return run


def _spec(job: KillJob, steps: list[Step]) -> str:
    """One spec for every server of a chain, each entry spent once: a kill of the worker,
    a long stall where the server is killed, a short one where the stop lands."""
    entries = []
    for i, (kind, point, sink, batch) in enumerate(steps):
        entry = f"{point.value}:batch={batch}:sink={sink}:once={job.root / f'once-{i}'}"
        if kind == SERVER:
            entry += f":action=stall:seconds={SERVER_STALL}"
        elif kind == GRACEFUL:
            entry += f":action=stall:seconds={STALL_SECONDS}"
        entries.append(entry)
    return ";".join(entries)


def _stopped_gracefully(job: KillJob, server: ConnectServer, point: CrashPoint, sink: str,
                        batch: int) -> DriverRun:
    """The client run on ``server``, SIGTERMed once its worker holds ``point`` of ``batch``
    (as :func:`stop_chain`): it stops the query gracefully and exits 0, the batch in flight
    in Spark's commit log, the next one not."""
    def landed() -> bool:
        return job.reached(point, batch, sink_id=sink)

    run = job.run("--master", server.url, "--on-sigterm", "graceful", kill_after=0.0,
                  kill_when=landed, kill_signal=signal.SIGTERM)
    assert landed(), f"the stop's point was not reached\n{run.tail()}"
    assert run.returncode == 0, run.tail()
    commits = spark_batches(job.checkpoint)[1]
    assert batch in commits, "the batch in flight was not committed"
    assert batch + 1 not in commits, f"a batch after the stop ran\n{run.tail()}"
    return run


@contextlib.contextmanager
def in_turn(job: KillJob, steps: list[Step], case: Case,
            ) -> Iterator[tuple[DriverRun, ConnectServer]]:
    """Each step of ``steps`` in turn, each run a restart of the last on the same
    checkpoint: ``SERVER``, the client run on a server whose worker stalls at the point,
    the whole server SIGKILLed there, the next run on a new server; ``WORKER``, the worker
    SIGKILLs itself at the point, the client ends with the query's error, the server lives
    on and the next run uses it; ``GRACEFUL``, the client SIGTERMed while the worker holds
    the point, a graceful stop. Each kill proved (the crash log names the point, sink and
    batch; Spark's offset log has the batch, its commit log not) and checked
    (``case.after_kill``), each stop too (``case.after_stop``). Then a clean run on the
    last server; yields it and the server (still up)."""
    env = server_env(job.crash_log, _spec(job, steps))
    started = 0

    def new_server() -> ConnectServer:
        nonlocal started
        started += 1
        return start_server(job.root / f"server-{started}", env)

    server = new_server()
    try:
        for kind, point, sink, batch in steps:
            where = f"{kind} at {point.value} of sink {sink}, batch {batch}"
            if kind == GRACEFUL:
                _stopped_gracefully(job, server, point, sink, batch)
                case.after_stop(job)
                continue
            if kind == SERVER:
                run = _server_killed(job, server, point, sink, batch)
                server.stop()
                server = new_server()
            else:
                run = job.run("--master", server.url)
                _failed_in_the_worker(run)
                assert server.alive(), f"{where}: the server died too\n{server.tail()}"
            assert job.reached(point, batch, sink_id=sink), (where, run.tail())
            offsets, commits = spark_batches(job.checkpoint)
            assert batch in offsets and batch not in commits, (where, offsets, commits)
            case.after_kill(job, point, sink, batch)
        final = job.run("--master", server.url)
        assert final.returncode == 0, final.tail()
        assert started == 1 + sum(kind == SERVER for kind, *_ in steps)
        yield final, server
    finally:
        server.stop()


@pytest.mark.parametrize("sink", SINKS)
def test_server_and_worker_killed_and_a_graceful_stop_then_restart_is_exact(
    sink: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """At each crash point (CI: one per sink; ``EOS_WIDE_MATRIX=1``: every driver-side
    point of the family), both deaths in one chain: the server JVM killed, then the worker
    on the restart's server; then, on that server, a graceful stop at the decision (the
    SIGTERM reaches the client, the stop request reaches the sink in the worker through
    the session's configuration); then the last run. Two servers started in CI. For
    DeltaSink, on the last server: a new checkpoint, and a sink without ``query_name``,
    refused."""
    case = _case(sink, request)
    steps = case.steps()
    job = case.job(tmp_path, steps[-1][3] + 1)  # one batch after the stop's
    with in_turn(job, steps, case) as (final, server):
        case.finish(job, final)
        if isinstance(job, ConnectDeltaJob):
            _the_binding_is_never_lost(job, server, tmp_path)


def _the_binding_is_never_lost(job: ConnectDeltaJob, server: ConnectServer,
                               root: Path) -> None:
    # A new checkpoint is a new query: refused, never taken for a batch job.
    job.checkpoint = root / "ckpt-new"
    third = job.run("--master", server.url)
    assert third.returncode != 0
    assert "QueryBindingError" in third.output and "is bound to query" in third.output
    # A sink without query_name: the worker is not told which query calls it.
    nameless = ConnectDeltaJob(root / "nameless", source="rate", batches=2, rows=50)
    nameless.query_name = None
    run = nameless.run("--master", server.url)
    assert run.returncode != 0
    assert "under Spark Connect the sink cannot tell which streaming query" in run.output
    assert "queryName('orders')" in run.output and "run_batch(df, run_id)" in run.output
    assert not (nameless.a / "_delta_log").exists() or not intent_batches(nameless.a, APPEND)


# ------------------------------------------- the worker SIGKILLed, on a local server


class ConnectS3DeltaJob(S3DeltaJob):
    """S3DeltaJob as a Connect client; the keys are confs (of the local server) too."""

    keys_in_env = False

    def args(self) -> list[str]:
        return [*super().args(), *connect_args()]


@pytest.mark.connect_local
def test_delta_on_s3a_worker_killed_at_driver_side_crash_points_then_restart_is_exact(
    tmp_path: Path, s3_service: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``--connect`` on a local Connect server (the client's environment arms the
    worker). CI: the append sink after its decision; ``EOS_WIDE_MATRIX=1``: every point."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_REGION",
                 "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)  # only the session's confs reach the sink
    plan = [(BD, APPEND, 1), (AD, MERGE, 2), (AC, APPEND, 3)] if WIDE else [(AD, APPEND, 1)]
    job = ConnectS3DeltaJob(tmp_path, s3_service, source="rate", batches=plan[-1][2] + 1,
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
    slot 1 has produced and not committed, slot 0 perhaps committed; the restart (on the
    same server) finishes the batch through the shuffle (the first batch of a run) and the
    rest in the worker: every record once, nothing left open."""
    job = ConnectKafkaJob(tmp_path, kafka, source="rate", small_batch_rows=1000)
    # A stall of 0 s at batch 1's decision records the pid of the process running the
    # sink's driver side; the slot's crash point in batch 2 must fire in that process.
    spec = (f"before_decision:batch=1:action=stall:seconds=0:once={tmp_path / 'once-0'};"
            f"before_precommit:batch=2:partition=1:once={tmp_path / 'once-1'}")
    with connect_server(tmp_path / "server", server_env(job.crash_log, spec)) as server:
        first = job.run("--master", server.url)
        _failed_in_the_worker(first)
        assert job.reached(CrashPoint.BEFORE_PRECOMMIT, 2, partition=1)
        pids = {line.split()[0]: line.split("pid=")[1].strip()
                for line in Path(job.crash_log).read_text().splitlines()}
        assert pids["before_precommit"] == pids["before_decision"], pids  # not a Spark task
        assert server.alive(), server.tail()
        final = job.run("--master", server.url)
    assert final.returncode == 0, final.tail()
    job.assert_exact()
    assert not wait_no_open_transactions(kafka.bootstrap, [kafka.topic, kafka.marker_topic])


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


def stall_spec(job: KillJob, sink_id: str, plan: list[tuple[str, CrashPoint]]) -> str:
    """What :func:`stop_chain` arms in its client, for a server's worker: each stop's
    point held ``STALL_SECONDS`` once, in batch ``FIRST + i``."""
    return ";".join(f"{point.value}:batch={FIRST + i}:sink={sink_id}:action=stall:"
                    f"seconds={STALL_SECONDS}:once={job.root / f'server-stall-{i}'}"
                    for i, (_, point) in enumerate(plan))


@pytest.mark.skipif(not WIDE, reason="EOS_WIDE_MATRIX=1 only (CI's time budget): CI "
                    "stops each sink gracefully at its decision in the kill chains above")
def test_graceful_stops_in_every_phase_under_connect_leave_nothing_and_restart_exactly(
        tmp_path: Path, pg: PgTarget) -> None:  # noqa: F811 - the pg fixture
    """Three graceful stops of PostgresSink in each phase of a batch, every run on one
    server (it outlives each stopped client). (CI: one stop per sink, at the decision, in
    the chains above. A plain ``query.stop()`` under Connect ends the worker with the
    query: what a hard kill leaves, which the kill tests cover; docs/stopping.md.)"""
    plan = [s for s in wide([p for _, p in PG_CI]) if s[0] == "graceful"]
    job = ConnectPgJob(tmp_path, pg, source="rate")
    job.batches, job.rows_per_batch = batches_for(plan), 200
    job.total = job.batches * job.rows_per_batch

    def nothing_left(stopped: Stopped) -> None:
        assert pg.prepared() == [], pg.prepared()

    env = server_env(job.crash_log, stall_spec(job, pg.sink_id, plan))
    with connect_server(tmp_path / "server", env) as server:
        stop_chain(job, pg.sink_id, plan, nothing_left, extra=("--master", server.url))
    job.assert_exact()
