"""DeltaSink on ``s3a://`` (the test services' S3 API, moto's server) with nothing else to
provide: no ``ledger_path``, the ledger as objects beside the table written with S3's
conditional writes, the lease an object renewed by compare-and-swap.

Drivers (``integration.support._delta``: ``examples/stream_to_delta.py`` with two sinks, an append
and a MERGE) are SIGKILLed at the crash points of the COMMIT_ON_DRIVER family and at random
moments, restarted from the same checkpoint; the tables are then read back row by row with
delta-rs (an independent reader) and compared with the input, the history shows one
tagged commit per batch and sink, the ledger objects every batch recorded and no intent
left. A second driver of the same sink started while the first runs is kept out by the
lease. In-process: a replay holding other rows and a checkpoint reset are refused, a
graceful ``close`` releases the lease at once.

Credentials reach the drivers as a user's would: the endpoint and path style as
``spark.hadoop.fs.s3a.*`` confs, the keys as ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``
in the environment (S3A's default credential chain; the sink's ledger client reads the
same variables); in-process, everything as s3a confs of the session. Under Spark Connect
(``integration/connect/test_connect.py``, ``keys_in_env = False``) the keys are s3a confs too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from connectors.core.engine import EngineCall, batch_input_for
from connectors.core.errors import NonDeterministicReplayError, QueryBindingError
from connectors.delta import DeltaSink
from connectors.sdk import CrashPoint
from integration.delta._delta_s3 import S3Tables
from integration.delta.test_delta_kill import APPEND, COLUMNS, MERGE, PLAN, SHORT_PLAN, DeltaJob
from integration.support._driver import (
    REPO,
    SEED,
    DriverRun,
    kill_at_each,
    kill_at_random,
    reached,
    spark_batches,
)

pytestmark = [pytest.mark.integration]

WIDE = os.environ.get("EOS_WIDE_MATRIX") == "1"
#: How long driver 1 of the fencing test idles after each batch's last commit (a stall),
#: so that it writes little while driver 2 starts and is refused, and a graceful stop
#: then waits for at most one batch and one stall. Nothing is timed on it: driver 1 holds
#: the lease throughout, stalled or writing.
FENCE_STALL_S = 10.0


def _prefix(s3: Any, name: str) -> str:
    return f"s3a://{s3.bucket}/{name}-{uuid.uuid4().hex[:10]}"


class S3DeltaJob(DeltaJob):
    """The DeltaJob of test_delta_kill with both tables on S3. The keys go to the driver as
    ``AWS_*`` variables (``keys_in_env``), or else as s3a confs like the other settings."""

    keys_in_env = True
    #: The tables' ``s3a://`` URIs (local paths in DeltaJob).
    a: str  # type: ignore[assignment]
    b: str  # type: ignore[assignment]

    def __init__(self, root: Path, s3: Any, **kwargs: Any) -> None:
        super().__init__(root, **kwargs)
        self.s3 = s3
        self.tables = S3Tables(s3)
        prefix = _prefix(s3, root.name)
        self.a, self.b = f"{prefix}/a", f"{prefix}/b"
        #: Every run of the job, in order (what a restart logged, e.g. a lease takeover).
        self.runs: list[DriverRun] = []

    def args(self) -> list[str]:
        confs = [f"{k}={v}" for k, v in self.s3.hadoop_confs().items()
                 if not (self.keys_in_env and k.endswith((".access.key", ".secret.key")))]
        return [*super().args(), *[x for c in confs for x in ("--conf", c)]]

    def run(self, *extra: str, **kwargs: Any) -> DriverRun:
        env = {"AWS_ACCESS_KEY_ID": self.s3.access_key,
               "AWS_SECRET_ACCESS_KEY": self.s3.secret_key, "AWS_REGION": "us-east-1"}
        kwargs["env"] = {**(env if self.keys_in_env else {}), **kwargs.get("env", {})}
        run = super().run(*extra, **kwargs)
        self.runs.append(run)
        return run

    def assert_exact(self, spark: SparkSession | None = None, *,
                     released: bool = True) -> None:
        """Both tables row by row (delta-rs), one tagged commit per batch and sink, the
        ledger objects complete; the lease ``released`` (else left by a process gone)."""
        rows, latest = self.expected()
        cols = ["id", "name", "amount", "ts"] if self.source == "files" else COLUMNS[:3]
        got_a = self.tables.rows(self.a, cols)
        assert len(got_a) == len(rows), (len(got_a), len(rows))
        assert got_a == rows, "table a differs from the input row by row"
        got_b = self.tables.rows(self.b, [*cols, "key"])
        assert got_b == latest, "table b differs from the latest row per key"
        for uri, app in ((self.a, APPEND), (self.b, MERGE)):
            commits = self.tables.tagged_commits(uri, app)
            assert sorted(commits) == list(range(self.batches)), (app, commits)
            assert all(len(v) == 1 for v in commits.values()), (app, commits)
            want = self.batches - 1 if self.txn else None  # only delta_txn_id writes one
            assert self.tables.txn_version(uri, app) == want, (app, want)
            ledger = self.tables.ledger_batches(uri, app)
            assert sorted(ledger) == list(range(self.batches)) and all(ledger.values())
            assert self.tables.intent_batches(uri, app) == [], "spent intents are pruned"
            lease = self.tables.lease(uri, app)
            assert lease is not None and lease["released"] is released, lease
            if not released:
                assert not _alive(int(lease["holder"]["pid"])), lease
        assert self.tables.operations(self.a) == ["WRITE"] * self.batches
        assert self.tables.operations(self.b) == ["WRITE"] + ["MERGE"] * self.batches


def killed_holds(job: S3DeltaJob) -> Callable[[CrashPoint, str, int, DriverRun], None]:
    """kill_at_each's ``after_kill`` for ``job``: what the killed sink's table, ledger
    objects and lease hold at each point of the COMMIT_ON_DRIVER family."""
    t = job.tables

    def after_kill(point: CrashPoint, sink: str, batch: int, run: DriverRun) -> None:
        uri = job.a if sink == APPEND else job.b
        ledger, tags = t.ledger_batches(uri, sink), t.tagged_commits(uri, sink)
        assert all(ledger.get(b) for b in range(batch)), ledger
        if point is CrashPoint.BEFORE_DECISION:
            assert batch not in tags and batch not in ledger
            assert batch not in t.intent_batches(uri, sink)
        elif point is CrashPoint.AFTER_DECISION:
            assert len(tags[batch]) == 1 and batch not in ledger
            assert (batch in t.intent_batches(uri, sink)) is not job.txn  # tag path only
        else:
            assert len(tags[batch]) == 1 and ledger.get(batch) is True
        lease = t.lease(uri, sink)
        assert lease is not None and not lease["released"], "a SIGKILL releases nothing"

    return after_kill


@pytest.mark.parametrize(("delta_path", "plan"), [
    # CI: each crash point of the family once (both sinks between them); wide: all six.
    pytest.param("tag", PLAN if WIDE else PLAN[:3], id="tag"),
    # delta_txn_id=True (the accelerated lookup): where the table is ahead of the ledger
    pytest.param("txn_seed", SHORT_PLAN if WIDE else SHORT_PLAN[1:2], id="txn-seed"),
])
def test_s3_sigkill_at_crash_points_of_both_sinks_then_restart_is_exact(
    tmp_path: Path, s3_service: Any, delta_path: str, plan: list[tuple[CrashPoint, str, int]]
) -> None:
    # One file (micro-batch) past the plan's last kill: its restart writes the rest.
    job = S3DeltaJob(tmp_path, s3_service, delta_path=delta_path,
                     files=max(b for _, _, b in plan) + 1)
    runs = kill_at_each(job, plan, after_kill=killed_holds(job))
    assert len(reached(job.crash_log)) == len(plan)
    # The restarts took the lease of the killed driver at once (same machine, pid gone).
    assert not any("taking over the lease" in r.output for r in runs), runs[-1].tail()
    job.assert_exact()


def test_s3_sigkill_at_random_moments_then_restart_is_exact(
    tmp_path: Path, s3_service: Any
) -> None:
    job = S3DeltaJob(tmp_path, s3_service, source="rate", batches=4, rows=150)
    kill_at_random(job, progress=lambda: len(job.tables.ledger_batches(job.a, APPEND)),
                   max_delay=4.0, runs=2 if WIDE else 1, seed=SEED)
    job.assert_exact()


def test_s3_second_driver_of_the_sink_is_kept_out_while_the_first_runs(
    tmp_path: Path, s3_service: Any
) -> None:
    """Driver 1 (``--on-sigterm graceful``, a rate stream with no end of its own) takes the
    lease and writes, idling after each batch (``FENCE_STALL_S``). Driver 2, the same two
    sinks fed by a query of its own, starts once driver 1 holds the lease: it fails with
    FencedError naming the holder (driver 1's pid, alive and still holding the lease),
    having written nothing. Only then is driver 1 stopped, gracefully (SIGTERM): it exits
    0, releases the lease, and the tables are exact for the batches Spark's commit log
    holds (0..n-1: each once in table, history and ledger, no commit of driver 2's).

    (Driver 1 used to run a 60-batch stream only to be still running when driver 2 was
    refused; now it runs until the test stops it, once driver 2 was refused.)"""
    job = S3DeltaJob(tmp_path / "first", s3_service, source="rate", batches=10_000, rows=50)
    other = S3DeltaJob(tmp_path / "second", s3_service, source="rate", batches=2, rows=50)
    other.a, other.b = job.a, job.b
    stall = ";".join(f"{CrashPoint.AFTER_COMMIT.value}:batch={b}:sink={MERGE}:action=stall:"
                     f"seconds={FENCE_STALL_S}" for b in range(30))
    refused = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(job.run, "--on-sigterm", "graceful", crash=stall, kill_after=0.0,
                            kill_when=refused.is_set, kill_signal=signal.SIGTERM)
        try:
            holder = _wait_for_lease(job, first)
            pid = int(holder["pid"])
            second = other.run()
            assert not first.done(), "driver 1 ended before driver 2 met the lease"
            assert second.returncode != 0, second.tail()
            assert "FencedError" in second.output and "another driver holds the lease" in \
                second.output, second.tail()
            assert f"pid {pid} on {holder['host']}, run " in second.output, (holder,
                                                                          second.tail())
            assert "outcome=committed" not in second.output, second.tail()
            lease = job.tables.lease(job.a, APPEND)
            assert lease is not None and not lease["released"] and \
                lease["holder"] == holder and _alive(pid), lease
        finally:
            refused.set()  # SIGTERM to driver 1: a graceful stop
        run = first.result()
    assert run.returncode == 0, run.tail()
    _offsets, commits = spark_batches(job.checkpoint)
    assert commits and commits == set(range(len(commits))), commits
    job.batches = len(commits)  # what driver 1 committed before it stopped
    job.total = job.batches * job.rows_per_batch
    job.assert_exact()  # (the lease released by the stop's close)
    lease = job.tables.lease(job.a, APPEND)
    assert lease is not None and lease["holder"] == holder, lease


def _wait_for_lease(job: S3DeltaJob, first: Future[DriverRun]) -> dict[str, Any]:
    """The holder of the append sink's lease once driver 1 has taken it (not released)."""
    while True:
        assert not first.done(), f"driver 1 ended first:\n{first.result().tail()}"
        try:
            lease = job.tables.lease(job.a, APPEND)
        except Exception:  # nothing under the prefix yet
            lease = None
        if lease is not None and not lease["released"]:
            return dict(lease["holder"])
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---- in-process, the shared session (its s3a confs are the test services') ----
def _events(spark: SparkSession, n: int, start: int = 0) -> Any:
    return spark.range(start, start + n).selectExpr("id", "concat('e-', id) AS name")


def test_s3_replay_holding_other_rows_is_refused_and_reset_is_refused(
    spark: SparkSession, s3_service: Any
) -> None:
    uri = _prefix(s3_service, "replay") + "/t"
    sink = DeltaSink(uri, sink_id="s3-replay", create_table=True)
    sink(_events(spark, 20), 0)
    sink(_events(spark, 20, 20), 1)
    with pytest.raises(NonDeterministicReplayError, match="replayed batch differs"):
        sink(_events(spark, 20, 100), 1)  # batch 1 again, other rows
    sink(_events(spark, 20, 20), 1)  # the same rows: a replay, nothing written
    sink.close()
    tables = S3Tables(s3_service)
    assert tables.rows(uri, ["id"]) == [(i,) for i in range(40)]
    assert tables.lease(uri, "s3-replay")["released"] is True  # type: ignore[index]
    # A new query (a new checkpoint) is refused: batch ids would restart at 0.
    other = DeltaSink(uri, sink_id="s3-replay")
    batch, _ = batch_input_for(_events(spark, 5), EngineCall("s3-replay", False, None, False))
    with pytest.raises(QueryBindingError, match="is bound to query"):
        other.write_batch(batch, 0, query_id="another-query")
    other.close()
    assert tables.rows(uri, ["id"]) == [(i,) for i in range(40)]


def test_s3_demo_reports_exactly_once_then_status_reads_the_table(
    tmp_path: Path, s3_service: Any
) -> None:
    """``connectors demo --table s3a://...``: the driver SIGKILLed after the decision of
    batch 1 (of three; batch 0 created the table), restarted; every id once. Then
    ``connectors status --delta`` reads the table on S3 (delta-rs) and its ledger
    (objects), the keys in the environment only."""
    env = {**os.environ, "AWS_ACCESS_KEY_ID": s3_service.access_key,
           "AWS_SECRET_ACCESS_KEY": s3_service.secret_key, "AWS_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": s3_service.endpoint, "AWS_ALLOW_HTTP": "true",
           "PYTHONPATH": str(REPO)}
    env.pop("CONNECTORS_CRASH_AT", None)
    root = _prefix(s3_service, "demo")
    proc = subprocess.run(
        [sys.executable, "-m", "connectors", "demo", "--json", "--workdir", str(tmp_path / "w"),
         "--files", "3", "--rows-per-file", "200", "--crash-batch", "1", "--table", root,
         "--conf", f"spark.hadoop.fs.s3a.endpoint={s3_service.endpoint}",
         "--conf", "spark.hadoop.fs.s3a.path.style.access=true"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    verdict = json.loads(proc.stdout.strip().splitlines()[-1])
    assert verdict["verdict"] == "EXACTLY ONCE", verdict
    assert verdict["rows out"] == verdict["rows in"] == 600 and verdict["driver SIGKILLed"]
    assert str(verdict["target"]).startswith(root + "/connectors-demo-")
    assert s3_service.secret_key not in proc.stdout + proc.stderr
    # The table on S3, read independently: every id once.
    ids = S3Tables(s3_service).rows(verdict["target"], ["id"])
    assert ids == [(i,) for i in range(600)]
    status = subprocess.run(
        [sys.executable, "-m", "connectors", "status", "--delta", verdict["target"], "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert status.returncode == 0, status.stdout[-2000:] + status.stderr[-2000:]
    assert verdict["sink id"] in status.stdout, status.stdout[-2000:]
    assert s3_service.secret_key not in status.stdout + status.stderr


def test_s3_demo_refuses_a_secret_on_its_command_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "connectors", "demo", "--table", "s3a://b/demos",
         "--conf", "spark.hadoop.fs.s3a.secret.key=hunter2-secret"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode != 0
    assert "holds a secret" in proc.stderr and "AWS_SECRET_ACCESS_KEY" in proc.stderr
    assert "hunter2-secret" not in proc.stdout + proc.stderr
