"""The operator CLI against a real MariaDB, with what SIGKILLed MariaDBSink drivers left.

Two streaming jobs (``examples/stream_to_mariadb.py``) are SIGKILLed in batch
``CRASH_BATCH``: one after its tasks' ``XA PREPARE`` and before the decision (branches
prepared, undecided), one right after the decision (prepared and decided, nothing
committed). ``connectors status --mariadb-env`` must list exactly those branches, decided
yes or no, and exit 1; ``doctor`` must find each checkpoint and ledger consistent;
``recover`` must leave an undecided branch of unknown age alone unless told ``--min-age 0``
(``XA RECOVER`` gives no age), commit the decided ones and roll back the undecided ones;
``status`` then exits 0, ``XA RECOVER`` holds nothing of the sinks, and the restarted jobs
deliver every row exactly once. The password is in no output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors.mariadb._config import Address
from connectors.sdk import CrashPoint
from integration.mariadb.test_mariadb_kill import ROWS_PER_FILE, MariaJob, Target
from integration.support._driver import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: The batch the drivers are killed in (batches 0.. CRASH_BATCH - 1 are committed).
CRASH_BATCH = 1
FILES = 3
#: The environment variable the CLI reads the address from.
ENV = "EOS_TEST_MARIADB_OPERATOR_URL"


def cli(*args: str, json_out: bool = True) -> tuple[int, Any, str]:
    """``python -m connectors ARGS [--json]``: (exit code, parsed JSON or stdout, stderr)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "connectors", *args,
                           *(["--json"] if json_out else [])], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    out = proc.stdout
    data = json.loads(out) if json_out and out.strip().startswith("[") else out
    return proc.returncode, data, out + proc.stderr


def target_args(t: Target) -> list[str]:
    return ["--mariadb-env", ENV, "--mariadb-ledger-table", t.ledger, "--sink-id", t.sink_id]


@pytest.fixture
def targets(mariadb_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Target]]:
    monkeypatch.setenv(ENV, mariadb_url)
    made = [Target(mariadb_url), Target(mariadb_url)]
    yield made
    for t in made:
        for tid in t.prepared():  # a failed test's branches must not hold locks for others
            t.execute(f"XA ROLLBACK {_xid(tid)}")
        t.cleanup()


def _xid(tid: Any) -> str:
    from connectors.mariadb._xid import xid_sql

    return xid_sql(tid)


def test_status_and_recover_settle_what_killed_drivers_left_then_exact(
        tmp_path: Path, targets: list[Target]) -> None:
    undecided_t, decided_t = targets
    password = Address(undecided_t.url).password
    assert password
    outputs: list[str] = []
    undecided = MariaJob(tmp_path / "u", undecided_t, files=FILES)
    decided = MariaJob(tmp_path / "d", decided_t, files=FILES)

    # ---- two drivers SIGKILLed in batch CRASH_BATCH: after the prepare, after the decision
    for job, point in ((undecided, CrashPoint.BEFORE_DECISION),
                       (decided, CrashPoint.AFTER_DECISION)):
        run = job.run(crash=f"{point.value}:batch={CRASH_BATCH}")
        assert run.returncode == -9 and job.reached(point, CRASH_BATCH), run.tail()
    left_undecided, left_decided = (sorted(map(str, t.prepared())) for t in targets)
    assert left_undecided and left_decided
    assert decided_t.ledger_states().get(CRASH_BATCH) == "DECIDED"
    assert CRASH_BATCH not in undecided_t.ledger_states()

    # ---- status: exactly the branches, decided yes / no, age unknown; exit 1
    for t, left, decided_flag in ((undecided_t, left_undecided, False),
                                  (decided_t, left_decided, True)):
        code, data, out = cli("status", *target_args(t))
        outputs.append(out)
        assert code == 1, out
        (s,) = data
        assert s["sink_id"] == t.sink_id and s["target"].startswith("mariadb mariadb://")
        assert s["last_committed"] == CRASH_BATCH - 1
        assert s["unfinished"] == ([CRASH_BATCH] if decided_flag else [])
        assert sorted(x["transaction"] for x in s["lingering"]) == left
        assert all(x["decided"] is decided_flag and x["batch_id"] == CRASH_BATCH
                   and x["age_s"] is None for x in s["lingering"]), s["lingering"]
    code, _, out = cli("status", *target_args(decided_t), json_out=False)
    outputs.append(out)
    assert code == 1 and left_decided[0] in out and "yes" in out, out
    code, data, out = cli("status", "--mariadb-env", ENV, "--mariadb-ledger-table",
                          undecided_t.ledger)  # every sink the target knows
    outputs.append(out)
    assert undecided_t.sink_id in {s["sink_id"] for s in data}, out

    # ---- doctor: each checkpoint and ledger consistent; another query's checkpoint caught
    for job, t in ((undecided, undecided_t), (decided, decided_t)):
        code, findings, out = cli("doctor", "--checkpoint", str(job.checkpoint),
                                  *target_args(t))
        outputs.append(out)
        assert code == 0, out
        assert {f["check"] for f in findings} >= {"binding", "no-gaps"}
    code, findings, out = cli("doctor", "--checkpoint", str(decided.checkpoint),
                              *target_args(undecided_t))
    assert code == 1 and [f for f in findings if f["check"] == "binding" and not f["ok"]]

    # ---- recover: an undecided branch of unknown age is left unless --min-age 0
    code, data, out = cli("recover", *target_args(undecided_t), "--commit-decided",
                          "--abort-undecided")
    outputs.append(out)
    assert code == 1 and data[0]["aborted"] == [] and data[0]["committed"] == [], out
    assert sorted(x["transaction"] for x in data[0]["left"]) == left_undecided
    assert any("--min-age 0" in note for note in data[0]["notes"]), data[0]["notes"]
    assert sorted(str(t) for t in undecided_t.prepared()) == left_undecided

    # ---- recover: the decided are committed (whatever --min-age), the undecided rolled back
    code, data, out = cli("recover", *target_args(decided_t), "--commit-decided",
                          "--abort-undecided")
    outputs.append(out)
    assert code == 0, out
    assert sorted(data[0]["committed"]) == left_decided and data[0]["aborted"] == []
    assert decided_t.ledger_states()[CRASH_BATCH] == "COMMITTED"
    assert len(decided_t.ids()) == (CRASH_BATCH + 1) * ROWS_PER_FILE

    code, data, out = cli("recover", *target_args(undecided_t), "--commit-decided",
                          "--abort-undecided", "--min-age", "0")
    outputs.append(out)
    assert code == 0, out
    assert sorted(data[0]["aborted"]) == left_undecided and data[0]["committed"] == []
    aborts = undecided_t.execute(
        f"SELECT batch_id FROM {undecided_t.sql(undecided_t.ledger + '_aborts')} "
        "WHERE sink_id = %s", (undecided_t.sink_id,))
    assert {int(r[0]) for r in aborts} == {CRASH_BATCH}, "the abort is recorded first"
    assert len(undecided_t.ids()) == CRASH_BATCH * ROWS_PER_FILE

    # ---- settled: status exits 0, nothing of the sinks left in XA RECOVER
    for t in (undecided_t, decided_t):
        code, data, out = cli("status", *target_args(t))
        outputs.append(out)
        assert code == 0 and data[0]["lingering"] == [] and data[0]["unfinished"] == [], out
        assert t.prepared() == []

    # ---- the restarted queries: every row exactly once, row by row
    for job in (undecided, decided):
        run = job.run()
        assert run.returncode == 0, run.tail()
        job.assert_exact()
    # The service's password may be a common word ("eos", also the user's and database's
    # name): the address with it is what must never show (tests/cli has a distinct one).
    assert not [o for o in outputs if f":{password}@" in o], "the password was printed"
    assert all(":***@" in o for o in outputs if "mariadb://" in o)
