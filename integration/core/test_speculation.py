"""Spark's own speculation on a real standalone cluster: duplicate attempts commit once.

Local mode never speculates, and ``local-cluster`` gives every executor the same host, on
which Spark never launches a speculative copy. So this test starts a standalone cluster
(``integration/support/_standalone.py``) whose two one-core workers have different hosts
(127.0.0.2, 127.0.0.3), and makes a straggler: the first attempt of batch 1's partition 0
to reach pre-commit stalls 25 s there. Spark launches a copy of it on the other host;
whichever attempt Spark accepts, exactly one transaction per partition may be decided and
committed, and the loser's (killed, or prepared late) must never be.

The stalled attempt is normally the original. On a loaded machine Spark sometimes
speculates the original before it reaches pre-commit (a slow Python worker start); then
the copy stalls and the original wins. Both are the case under test.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from integration.core.test_fs_sink_kill import FILES, ROWS_PER_FILE, Job
from integration.support._driver import DriverRun, KillJob, event_log_conf
from integration.support._standalone import (
    StandaloneCluster,
    conf_args,
    executor_env_conf,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STALLED_BATCH = 1
STALL_SECONDS = 25  # the straggler; far above the other tasks' ~1 s, far below the timeout
SPECULATION = {
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.multiplier": "1.5",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.minTaskRuntime": "200ms",
    # Spark >= 3.4 only speculates tasks it finds "inefficient" by their input rate, from
    # metrics sent with heartbeats (10 s): off, so the plain duration rule above applies.
    "spark.speculation.efficiency.enabled": "false",
}


@dataclass
class Attempt:
    """One task attempt Spark launched, from its event log."""

    task_id: int  # application-unique: the ``attempt`` of a TaskCommit
    stage: int
    index: int  # the partition, for these stages
    attempt: int
    host: str
    speculative: bool
    batch: int | None  # the micro-batch whose job ran the stage
    reason: str | None = None  # "Success", "TaskKilled", ...; None: never reported ended


def _attempts(event_log_dir: Path) -> list[Attempt]:
    """Every task attempt launched (``TaskStart``), with its end (``TaskEnd``) if logged.

    A losing attempt killed late may never report its end before the application stops,
    hence ``TaskStart``. Structured Streaming puts ``batch = <id>`` in the job description,
    which the jobs ``foreachBatch`` starts inherit (a local property of the query thread).
    """
    stage_batch: dict[int, int] = {}
    starts: list[dict[str, Any]] = []
    reasons: dict[int, str] = {}
    for path in event_log_dir.rglob("*"):
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            if '"SparkListenerJobStart"' in line:
                event = json.loads(line)
                description = (event.get("Properties") or {}).get("spark.job.description", "")
                for part in description.splitlines():
                    key, _, value = part.partition(" = ")
                    if key.strip() == "batch" and value.strip().isdigit():
                        for stage in event["Stage IDs"]:
                            stage_batch[stage] = int(value)
            elif '"SparkListenerTaskStart"' in line:
                starts.append(json.loads(line))
            elif '"SparkListenerTaskEnd"' in line:
                event = json.loads(line)
                reason = (event.get("Task End Reason") or {}).get("Reason", "?")
                reasons[event["Task Info"]["Task ID"]] = reason
    return [
        Attempt(
            task_id=e["Task Info"]["Task ID"],
            stage=e["Stage ID"],
            index=e["Task Info"]["Index"],
            attempt=e["Task Info"]["Attempt"],
            host=e["Task Info"]["Host"],
            speculative=e["Task Info"].get("Speculative", False),
            batch=stage_batch.get(e["Stage ID"]),
            reason=reasons.get(e["Task Info"]["Task ID"]),
        )
        for e in starts
    ]


def _decision(job: Job, batch_id: int, sink_id: str = "files") -> dict[str, Any]:
    path = job.out / "_ledger" / sink_id / "decisions" / f"{batch_id:020d}.json"
    assert path.exists(), f"batch {batch_id} was never decided ({path} missing)"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _committed_txns(job: Job) -> list[str]:
    return [unquote(p.name[: -len(".parquet")]) for p in job.data_files()]


def _add_input_file(job: Job) -> None:
    """One more input file, ids continuing the others', so that a restart runs a batch."""
    ids = range(job.total, job.total + ROWS_PER_FILE)
    rows = [{"id": i, "name": f"name-{i}", "amount": i * 0.25, "ts": "2026-01-01T00:00:00Z"}
            for i in ids]
    n = len(list(job.input.glob("part-*.json")))
    tmp = job.input / f".part-{n:05d}.json.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(job.input / f"part-{n:05d}.json")  # the files source never sees a half file
    job.total += len(rows)


def run_with_a_straggler(job: KillJob, cluster: StandaloneCluster, *, timeout: float = 300,
                         **executor_env: str) -> tuple[DriverRun, list[Attempt]]:
    """One run of ``job`` on the standalone ``cluster`` with speculation on, whose task of
    partition 0 in batch ``STALLED_BATCH`` stalls (once) before its pre-commit, so Spark
    launches a speculative copy. Spark's event log on; ``executor_env`` goes to the
    executors (they get the workers' environment, not the driver's: the crash is armed
    there). Returns the run and every task attempt, after checking both ran."""
    events = job.root / "events"
    once = job.root / "stall-once"
    stall = (
        f"before_precommit:batch={STALLED_BATCH}:partition=0:action=stall"
        f":seconds={STALL_SECONDS}:once={once}"
    )
    run = job.run(
        "--master", cluster.master_url,
        *cluster.driver_conf(),
        *conf_args(SPECULATION),
        *conf_args(event_log_conf(events)),
        *executor_env_conf(CONNECTORS_TEST_MODE="1", CONNECTORS_CRASH_AT=stall,
                           CONNECTORS_CRASH_LOG=str(job.crash_log), **executor_env),
        timeout=timeout,
    )
    assert run.returncode == 0, f"{run.tail()}\n{cluster.executor_logs()}"
    assert once.exists(), f"the straggler never stalled:\n{run.tail()}\n{cluster.executor_logs()}"
    return run, _attempts(events)


def test_speculative_duplicate_attempts_commit_once(
    cluster: StandaloneCluster, tmp_path: Path
) -> None:
    job = Job(tmp_path)
    run, attempts = run_with_a_straggler(job, cluster, timeout=240)
    seconds = run.seconds
    listing = "\n".join(map(str, attempts))
    speculative = [a for a in attempts if a.speculative]
    assert speculative, f"Spark launched no speculative attempt ({seconds:.0f} s):\n{listing}"
    part0 = [a for a in attempts if a.batch == STALLED_BATCH and a.index == 0]
    assert any(a.speculative for a in part0), (
        f"no speculative copy of the straggler (batch {STALLED_BATCH}, partition 0):\n{listing}"
    )
    assert len({a.host for a in part0}) == len(part0), f"two attempts on one host:\n{listing}"

    # Batch 1's decision lists one transaction per partition, each an attempt Spark
    # accepted; for partition 0 that is the straggler's or its copy's, never both.
    decision = _decision(job, STALLED_BATCH)
    partitions = sorted(c["partition"] for c in decision["commits"])
    tasks = {a.index for a in attempts if a.batch == STALLED_BATCH}
    assert partitions == sorted(tasks), f"not one commit per partition: {partitions} ({tasks})"
    accepted = {a.task_id for a in attempts if a.batch == STALLED_BATCH and a.reason == "Success"}
    decided = {c["attempt"] for c in decision["commits"]}
    assert decided <= accepted, f"decided attempts {decided}, Spark accepted {accepted}:\n{listing}"
    winner = next(c for c in decision["commits"] if c["partition"] == 0)
    losers = {a.task_id for a in part0} - {winner["attempt"]}
    assert losers, f"partition 0 had one attempt only:\n{listing}"
    committed = _committed_txns(job)
    assert winner["txn"] in committed, committed
    assert not [t for t in committed if int(t.rsplit("|", 1)[1]) in losers], (
        f"a losing attempt ({losers}) committed: {committed}"
    )
    # And across every batch: the committed files are exactly the decided transactions.
    all_decided = {c["txn"] for b in range(FILES) for c in _decision(job, b)["commits"]}
    assert sorted(committed) == sorted(all_decided), (sorted(committed), sorted(all_decided))

    # A straggler may still prepare after the last batch's sweep, and a restart with no new
    # input runs no batch (so reconciles nothing): one more input file makes it run batch
    # FILES, whose reconciliation rolls back whatever no decision lists. First wait until
    # the application's executors and Python workers are gone: then no attempt can
    # prepare after the restart's reconciliation.
    cluster.wait_apps_gone()
    _add_input_file(job)
    final = job.run()
    assert final.returncode == 0, final.tail()
    assert _decision(job, FILES)["commits"], "the restart ran no batch"
    job.assert_exact()
