"""The operator CLI against a real PostgreSQL, with what SIGKILLed drivers really left.

Two streaming jobs are killed by SIGKILL: one before its batch was decided (its tasks'
transactions stay prepared, undecided), one right after the decision (prepared and decided,
nothing committed). ``connectors status`` must show exactly that, ``doctor`` must find the
checkpoint and ledger consistent (and catch a checkpoint of another query),
``recover`` must commit the decided ones, roll back the undecided ones (and leave young
ones alone), and the restarted jobs must then deliver every row exactly once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from connectors.postgres._config import Conninfo
from connectors.sdk import CrashPoint
from integration.postgres.test_postgres_kill import CRASH_BATCH, ROWS_PER_FILE, PgJob
from integration.support._driver import REPO, spark_batches
from integration.support._pg import DRIVER_PGOPTIONS, PgTarget, check_restart

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def cli(*args: str) -> tuple[int, Any, str]:
    """Run ``python -m connectors ARGS --json``: (exit code, parsed JSON, stderr)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "connectors", *args, "--json"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    data = json.loads(proc.stdout) if proc.stdout.strip().startswith("[") else proc.stdout
    return proc.returncode, data, proc.stderr


def leaks(conninfo: str, text: str) -> bool:
    """Does ``text`` show the conninfo's password (in a key=value or a URI)?"""
    password = Conninfo(conninfo).password
    assert password
    return f"password={password}" in text or f":{password}@" in text


def target_args(t: PgTarget) -> list[str]:
    return ["--postgres", t.conninfo, "--ledger-table", t.ledger, "--sink-id", t.sink_id]


@pytest.fixture
def make_target(postgres_conninfo: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("EOS_POSTGRES_CONNINFO", postgres_conninfo)
    monkeypatch.setenv("PGOPTIONS", DRIVER_PGOPTIONS)
    made: list[PgTarget] = []

    def make(prefix: str) -> PgTarget:
        target = PgTarget(postgres_conninfo, prefix=prefix)
        target.create_table()
        made.append(target)
        return target

    yield make
    for target in made:
        target.cleanup()


def test_status_recover_doctor_on_what_killed_drivers_left(
    tmp_path: Path, make_target: Any
) -> None:
    undecided_t, decided_t = make_target("cliu"), make_target("clid")
    undecided = PgJob(tmp_path / "u", undecided_t)
    decided = PgJob(tmp_path / "d", decided_t)

    # ---- two drivers SIGKILLed at two moments of batch CRASH_BATCH
    run = undecided.run(crash=f"{CrashPoint.BEFORE_DECISION.value}:batch={CRASH_BATCH}")
    assert run.returncode == -9 and undecided.reached(CrashPoint.BEFORE_DECISION, CRASH_BATCH)
    run = decided.run(crash=f"{CrashPoint.AFTER_DECISION.value}:batch={CRASH_BATCH}")
    assert run.returncode == -9 and decided.reached(CrashPoint.AFTER_DECISION, CRASH_BATCH)
    left_undecided = sorted(str(t) for t in undecided_t.prepared())
    left_decided = sorted(str(t) for t in decided_t.prepared())
    assert left_undecided and left_decided
    assert sorted(decided_t.decided_transactions(CRASH_BATCH)) == left_decided

    # ---- status: exactly what they left; exit 1 = needs attention; no password anywhere
    code, data, err = cli("status", *target_args(undecided_t))
    assert code == 1, err
    (s,) = data
    assert s["sink_id"] == undecided_t.sink_id
    assert s["last_committed"] == CRASH_BATCH - 1 and s["unfinished"] == []
    assert sorted(x["transaction"] for x in s["lingering"]) == left_undecided
    assert all(x["decided"] is False and x["batch_id"] == CRASH_BATCH for x in s["lingering"])
    assert all(x["age_s"] is not None and x["age_s"] >= 0 for x in s["lingering"])
    assert not leaks(undecided_t.conninfo, json.dumps(data) + err)

    code, data, err = cli("status", *target_args(decided_t))
    assert code == 1, err
    (s,) = data
    assert s["unfinished"] == [CRASH_BATCH] and s["last_committed"] == CRASH_BATCH - 1
    assert sorted(x["transaction"] for x in s["lingering"]) == left_decided
    assert all(x["decided"] is True for x in s["lingering"])

    # ---- human-readable output too
    human = subprocess.run(
        [sys.executable, "-m", "connectors", "status", *target_args(decided_t)], cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=120, check=False)
    assert human.returncode == 1 and decided_t.sink_id in human.stdout
    assert left_decided[0] in human.stdout and not leaks(decided_t.conninfo, human.stdout)

    # ---- doctor: the crash left consistent states; another query's checkpoint is caught
    offsets, commits = spark_batches(undecided.checkpoint)
    assert CRASH_BATCH in offsets and CRASH_BATCH not in commits
    for job, target in ((undecided, undecided_t), (decided, decided_t)):
        code, findings, err = cli("doctor", "--checkpoint", str(job.checkpoint),
                                  *target_args(target))
        assert code == 0, (findings, err)
        assert {f["check"] for f in findings} >= {
            "binding", "not-ahead-of-plan", "at-most-one-ahead", "spark-commits-in-ledger",
            "no-gaps"}
    code, findings, _ = cli("doctor", "--checkpoint", str(decided.checkpoint),
                            *target_args(undecided_t))
    assert code == 1
    assert [f for f in findings if f["check"] == "binding" and not f["ok"]]

    # ---- recover leaves young undecided transactions alone (a live driver may decide them)
    code, data, err = cli("recover", *target_args(undecided_t), "--abort-undecided",
                          "--min-age", "3600")
    assert code == 1, err
    assert data[0]["aborted"] == [] and len(data[0]["left"]) == len(left_undecided)
    assert sorted(str(t) for t in undecided_t.prepared()) == left_undecided

    # ---- --commit-decided alone never rolls anything back
    code, data, err = cli("recover", *target_args(undecided_t), "--commit-decided")
    assert code == 1 and data[0]["aborted"] == [] and data[0]["committed"] == [], err
    code, data, err = cli("recover", *target_args(decided_t), "--abort-undecided",
                          "--min-age", "0")
    assert code == 1 and data[0]["aborted"] == [], err  # decided: never rolled back
    assert sorted(str(t) for t in decided_t.prepared()) == left_decided

    # ---- recover: roll back the undecided (after recording the abort), commit the decided
    code, data, err = cli("recover", *target_args(undecided_t), "--commit-decided",
                          "--abort-undecided", "--min-age", "0")
    assert code == 0, err
    assert sorted(data[0]["aborted"]) == left_undecided and data[0]["committed"] == []
    assert undecided_t.prepared() == []
    assert {b for b, _ in undecided_t.ledger_aborts()} == {CRASH_BATCH}
    assert undecided_t.count() == CRASH_BATCH * ROWS_PER_FILE

    code, data, err = cli("recover", *target_args(decided_t), "--commit-decided",
                          "--abort-undecided", "--min-age", "0")
    assert code == 0, err
    assert sorted(data[0]["committed"]) == left_decided and data[0]["aborted"] == []
    assert decided_t.prepared() == []
    assert decided_t.ledger_states()[CRASH_BATCH] == "COMMITTED"
    assert decided_t.count() == (CRASH_BATCH + 1) * ROWS_PER_FILE

    # ---- settled: status is clean (exit 0), doctor still consistent (sink one ahead)
    for job, target in ((undecided, undecided_t), (decided, decided_t)):
        code, data, err = cli("status", *target_args(target))
        assert code == 0 and data[0]["lingering"] == [] and data[0]["unfinished"] == [], err
        code, findings, err = cli("doctor", "--checkpoint", str(job.checkpoint),
                                  *target_args(target))
        assert code == 0, (findings, err)

    # ---- the restarted jobs deliver everything exactly once
    for job in (undecided, decided):
        check_restart(job.run())
        job.assert_exact()
        code, findings, err = cli("doctor", "--checkpoint", str(job.checkpoint),
                                  *target_args(job.target))
        assert code == 0, (findings, err)


def test_cli_errors_are_clear_and_exit_codes_mean_something(make_target: Any) -> None:
    t = make_target("clie")
    code, _, err = cli("recover", *target_args(t))
    assert code == 2 and "--commit-decided" in err
    code, _, err = cli("status")
    assert code == 2 and "--postgres" in err
    bad = psycopg.conninfo.make_conninfo(t.conninfo, port="1")  # nothing listens there
    code, _, err = cli("status", "--postgres", bad, "--sink-id", "x")
    assert code == 3 and "connect" in err, err
    assert not leaks(bad, err)
    code, _, err = cli("doctor", "--checkpoint", "/nonexistent/ckpt", *target_args(t))
    assert code == 2 and "/nonexistent/ckpt" in err
