"""Crash points: the spec parser, filters, once-files, the reached log, and real kills."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from connectors.core.protocol import crash
from connectors.core.protocol.crash import (
    ENV_CRASH_AT,
    ENV_CRASH_LOG,
    ENV_TEST_MODE,
    ArmedCrash,
    SimulatedCrash,
    arm,
    armed,
    crash_point,
    parse_spec,
)
from connectors.core.states import CrashPoint

REPO_ROOT = Path(__file__).resolve().parents[2]
P = CrashPoint


# --- parse_spec --------------------------------------------------------------------------


def test_parse_spec_defaults_to_kill_with_no_filter() -> None:
    assert parse_spec("after_decision") == [ArmedCrash(P.AFTER_DECISION)]
    assert parse_spec("after_decision")[0].action == "kill"


def test_parse_spec_reads_every_option() -> None:
    spec = "before_precommit:batch=1:sink=events-pg:partition=2:action=exit:once=/tmp/c1"
    assert parse_spec(spec) == [
        ArmedCrash(P.BEFORE_PRECOMMIT, batch_id=1, sink_id="events-pg", partition=2,
                   action="exit", once="/tmp/c1")
    ]


def test_parse_spec_reads_several_entries_and_ignores_blanks() -> None:
    crashes = parse_spec(" after_decision:batch=3 ; ;between_commits:action=raise;")
    assert crashes == [
        ArmedCrash(P.AFTER_DECISION, batch_id=3),
        ArmedCrash(P.BETWEEN_COMMITS, action="raise"),
    ]
    assert parse_spec("") == []
    assert parse_spec(" ; ") == []


@pytest.mark.parametrize("point", list(CrashPoint))
def test_parse_spec_knows_every_crash_point(point: CrashPoint) -> None:
    assert parse_spec(point.value)[0].point is point


def test_unknown_crash_point_is_named_with_the_valid_ones() -> None:
    with pytest.raises(ValueError) as info:
        parse_spec("after_lunch:batch=1")
    message = str(info.value)
    assert "unknown crash point 'after_lunch'" in message
    assert ENV_CRASH_AT in message
    for point in CrashPoint:
        assert point.value in message


@pytest.mark.parametrize("option", ["color=red", "batch", "batches=1", "=3", "Batch=1"])
def test_bad_option_is_named(option: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_spec(f"after_decision:{option}")
    assert f"bad option {option!r}" in str(info.value)
    assert "after_decision" in str(info.value)


def test_bad_action_is_named_with_the_valid_ones() -> None:
    with pytest.raises(ValueError) as info:
        parse_spec("after_decision:action=explode")
    message = str(info.value)
    assert "bad action 'explode'" in message
    for action in ("kill", "exit", "raise"):
        assert action in message


@pytest.mark.parametrize("option", ["batch=three", "partition=x"])
def test_non_numeric_batch_or_partition_is_a_value_error(option: str) -> None:
    with pytest.raises(ValueError, match=option.split("=")[1]):
        parse_spec(f"after_decision:{option}")


def test_arm_refuses_an_unknown_action() -> None:
    with pytest.raises(ValueError, match="action must be one of"):
        arm(P.AFTER_DECISION, action="explode")


# --- in-process arming -------------------------------------------------------------------


def test_nothing_happens_when_nothing_is_armed() -> None:
    for point in CrashPoint:
        crash_point(point, sink_id="events", batch_id=0, partition=0)
    assert crash.reached == []


def test_armed_crash_fires_once_and_is_recorded() -> None:
    arm(P.BEFORE_DECISION)
    with pytest.raises(SimulatedCrash, match="before_decision"):
        crash_point(P.BEFORE_DECISION, sink_id="events", batch_id=4)
    assert crash.reached == [(P.BEFORE_DECISION, "events", 4)]
    crash_point(P.BEFORE_DECISION, sink_id="events", batch_id=4)  # spent
    assert crash.reached == [(P.BEFORE_DECISION, "events", 4)]


def test_simulated_crash_is_not_an_exception() -> None:
    # Clean-up written as `except Exception` must not run: a killed process runs nothing.
    assert issubclass(SimulatedCrash, BaseException)
    assert not issubclass(SimulatedCrash, Exception)


def test_other_points_do_not_fire() -> None:
    arm(P.AFTER_DECISION)
    for point in CrashPoint:
        if point is not P.AFTER_DECISION:
            crash_point(point, sink_id="events", batch_id=0)
    with pytest.raises(SimulatedCrash):
        crash_point(P.AFTER_DECISION, sink_id="events", batch_id=0)


def test_batch_filter() -> None:
    arm(P.AFTER_DECISION, batch_id=3)
    crash_point(P.AFTER_DECISION, sink_id="events", batch_id=2)
    crash_point(P.AFTER_DECISION, sink_id="events", batch_id=4)
    with pytest.raises(SimulatedCrash):
        crash_point(P.AFTER_DECISION, sink_id="events", batch_id=3)


def test_sink_filter_is_exact() -> None:
    arm(P.AFTER_DECISION, sink_id="events")
    crash_point(P.AFTER_DECISION, sink_id="events-2", batch_id=0)
    crash_point(P.AFTER_DECISION, sink_id="event", batch_id=0)
    assert crash.reached == []
    with pytest.raises(SimulatedCrash):
        crash_point(P.AFTER_DECISION, sink_id="events", batch_id=0)


def test_partition_filter() -> None:
    arm(P.BEFORE_PRECOMMIT, partition=1)
    crash_point(P.BEFORE_PRECOMMIT, sink_id="events", batch_id=0, partition=0)
    crash_point(P.BEFORE_PRECOMMIT, sink_id="events", batch_id=0, partition=2)
    crash_point(P.BEFORE_PRECOMMIT, sink_id="events", batch_id=0)  # a driver-side call
    with pytest.raises(SimulatedCrash):
        crash_point(P.BEFORE_PRECOMMIT, sink_id="events", batch_id=0, partition=1)


def test_two_armed_crashes_fire_one_each() -> None:
    arm(P.AFTER_COMMIT, batch_id=1)
    arm(P.AFTER_COMMIT, batch_id=2)
    with pytest.raises(SimulatedCrash):
        crash_point(P.AFTER_COMMIT, sink_id="s", batch_id=1)
    with pytest.raises(SimulatedCrash):
        crash_point(P.AFTER_COMMIT, sink_id="s", batch_id=2)
    crash_point(P.AFTER_COMMIT, sink_id="s", batch_id=1)
    crash_point(P.AFTER_COMMIT, sink_id="s", batch_id=2)


def test_armed_context_manager_disarms_on_exit() -> None:
    with armed(P.AFTER_COMMIT, batch_id=5) as handle:
        assert handle.point is P.AFTER_COMMIT
        assert handle.action == "raise"
    crash_point(P.AFTER_COMMIT, sink_id="s", batch_id=5)
    assert crash.reached == []


def test_disarm_all_forgets_crashes_and_reached() -> None:
    arm(P.AFTER_COMMIT)
    with pytest.raises(SimulatedCrash):
        crash_point(P.AFTER_COMMIT, sink_id="s", batch_id=0)
    arm(P.AFTER_DECISION)
    crash.disarm_all()
    assert crash.reached == []
    crash_point(P.AFTER_DECISION, sink_id="s", batch_id=0)


# --- the environment, in-process ---------------------------------------------------------


@pytest.fixture
def test_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_TEST_MODE, "1")


def test_environment_spec_alone_arms_nothing_and_warns_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(crash, "_warned", set())
    monkeypatch.setenv(ENV_CRASH_AT, "after_decision:action=raise")
    for value in (None, "0", "true", "yes"):
        if value is not None:
            monkeypatch.setenv(ENV_TEST_MODE, value)
        crash_point(P.AFTER_DECISION, sink_id="s", batch_id=0)  # no SimulatedCrash
    warnings = [r for r in caplog.records if ENV_TEST_MODE in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelname == "WARNING"
    monkeypatch.setenv(ENV_TEST_MODE, "1")
    with pytest.raises(SimulatedCrash):
        crash_point(P.AFTER_DECISION, sink_id="s", batch_id=0)


@pytest.mark.usefixtures("test_mode")
def test_environment_spec_fires_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_CRASH_AT, "after_decision:sink=events:action=raise")
    crash_point(P.AFTER_DECISION, sink_id="other", batch_id=0)
    with pytest.raises(SimulatedCrash):
        crash_point(P.AFTER_DECISION, sink_id="events", batch_id=0)
    crash_point(P.AFTER_DECISION, sink_id="events", batch_id=0)


@pytest.mark.usefixtures("test_mode")
def test_once_file_is_created_and_spends_the_entry(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    once = tmp_path / "fired"
    monkeypatch.setenv(ENV_CRASH_AT, f"after_decision:batch=1:action=raise:once={once}")
    crash_point(P.AFTER_DECISION, sink_id="s", batch_id=0)
    assert not once.exists()  # not claimed by a call that did not match
    with pytest.raises(SimulatedCrash):
        crash_point(P.AFTER_DECISION, sink_id="s", batch_id=1)
    assert once.exists()
    # A "restarted process" (nothing remembered in memory) goes on while the file exists.
    crash.disarm_all()
    crash_point(P.AFTER_DECISION, sink_id="s", batch_id=1)
    # Deleting the file re-arms the entry.
    once.unlink()
    crash.disarm_all()
    with pytest.raises(SimulatedCrash):
        crash_point(P.AFTER_DECISION, sink_id="s", batch_id=1)


def test_crash_log_records_the_point_before_acting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    log = tmp_path / "reached.log"
    monkeypatch.setenv(ENV_CRASH_LOG, str(log))
    arm(P.BEFORE_PRECOMMIT, partition=2)
    with pytest.raises(SimulatedCrash):
        crash_point(P.BEFORE_PRECOMMIT, sink_id="events", batch_id=3, partition=2)
    arm(P.AFTER_COMMIT)
    with pytest.raises(SimulatedCrash):
        crash_point(P.AFTER_COMMIT, sink_id="events", batch_id=3)
    lines = log.read_text().splitlines()
    assert lines == [
        f"before_precommit sink=events batch=3 partition=2 pid={os.getpid()}",
        f"after_commit sink=events batch=3 partition=None pid={os.getpid()}",
    ]


@pytest.mark.usefixtures("test_mode")
def test_invalid_environment_spec_raises_at_the_crash_point(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_CRASH_AT, "after_lunch")
    with pytest.raises(ValueError, match="unknown crash point"):
        crash_point(P.AFTER_DECISION, sink_id="s", batch_id=0)


# --- real processes ----------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    from connectors.core.protocol.crash import crash_point
    from connectors.core.states import CrashPoint
    crash_point(CrashPoint.AFTER_DECISION, sink_id="events", batch_id=3)
    print("survived", flush=True)
    """
)


def _run_child(spec: str, log: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env[ENV_CRASH_AT] = spec
    env[ENV_TEST_MODE] = "1"
    env[ENV_CRASH_LOG] = str(log)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=60,
        check=False,
    )


def test_kill_action_sigkills_the_process_after_logging(tmp_path: Path) -> None:
    log = tmp_path / "reached.log"
    result = _run_child("after_decision:batch=3", log)
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert "survived" not in result.stdout
    assert log.read_text().startswith("after_decision sink=events batch=3 partition=None pid=")


def test_exit_action_exits_with_137(tmp_path: Path) -> None:
    log = tmp_path / "reached.log"
    result = _run_child("after_decision:action=exit", log)
    assert result.returncode == 137, result.stderr
    assert "survived" not in result.stdout
    assert "after_decision sink=events batch=3" in log.read_text()


def test_child_survives_a_spec_for_another_batch(tmp_path: Path) -> None:
    log = tmp_path / "reached.log"
    result = _run_child("after_decision:batch=4;before_decision", log)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "survived"
    assert not log.exists()


def test_once_file_lets_the_restarted_process_go_on(tmp_path: Path) -> None:
    log, once = tmp_path / "reached.log", tmp_path / "once"
    first = _run_child(f"after_decision:batch=3:once={once}", log)
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert once.exists()
    second = _run_child(f"after_decision:batch=3:once={once}", log)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "survived"
    assert len(log.read_text().splitlines()) == 1
