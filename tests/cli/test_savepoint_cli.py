"""``connectors savepoint`` (no services): a target's ledger and a local checkpoint; the
driver stopped first with ``--stop-pid`` (a real process that handles SIGTERM, and one
that ignores it)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from connectors.cli import _savepoint, build_parser
from connectors.cli._model import EXIT_ATTENTION, EXIT_OK, Lingering, RecoverReport
from connectors.cli._targets import Target
from connectors.core.errors import ConfigurationError
from connectors.core.ledgers.ledger import Ledger, LedgerEntry
from connectors.core.states import BatchState
from connectors.savepoints import load_savepoint
from connectors.testing import InMemoryTarget


class _MemoryTarget(Target):
    kind = "memory"

    def __init__(self, store: InMemoryTarget) -> None:
        self.store = store
        self.closed = False

    def describe(self) -> str:
        return "memory"

    def sink_ids(self) -> list[str]:
        return sorted(self.store.ledgers)

    def ledger(self, sink_id: str) -> Ledger:
        return self.store.ledger(sink_id)

    def lingering(self, sink_id: str) -> list[Lingering]:
        return []

    def recover(self, sink_id: str, *, commit_decided: bool, abort_undecided: bool,
                min_age_s: float) -> RecoverReport:
        return RecoverReport(sink_id, "memory")

    def close(self) -> None:
        self.closed = True


def _setup(tmp_path: Path, second_source: str) -> tuple[InMemoryTarget, str]:
    store = InMemoryTarget()
    ledger = store.ledger("orders")
    ledger.bind_query("q-1")
    ledger.decide(LedgerEntry("orders", 0, "r", BatchState.COMMITTED, query_id="q-1"))
    ckpt = tmp_path / "ck"
    (ckpt / "offsets").mkdir(parents=True)
    (ckpt / "metadata").write_text('{"id":"q-1"}\n')
    (ckpt / "offsets" / "0").write_text(f'v1\n{{}}\n{{"t":{{"0":9}}}}\n{second_source}\n')
    return store, str(ckpt)


def _args(*argv: str):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(["savepoint", "--postgres", "unused", *argv])


@pytest.mark.parametrize(("second", "code"), [
    ('{"sourceVersion":1,"reservoirId":"x","reservoirVersion":3,"index":-1,'
     '"isStartingVersion":false}', EXIT_OK),
    ('{"logOffset":2}', EXIT_ATTENTION),  # a file source: taken, not resumable
])
def test_the_savepoint_printed_as_json_and_written_to_a_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], second: str, code: int) -> None:
    store, ckpt = _setup(tmp_path, second)
    target = _MemoryTarget(store)
    out = tmp_path / "sp.json"
    args = _args("--checkpoint", ckpt, "--sink-id", "orders", "--json", "--output", str(out))
    assert _savepoint.run(args, [target]) == code
    printed = json.loads(capsys.readouterr().out)
    assert printed["batch_id"] == 0 and printed["sources"][0]["options"] == {
        "startingOffsets": '{"t":{"0":9}}'}
    assert load_savepoint(out).to_json() == printed and target.closed
    assert _savepoint.run(_args("--checkpoint", ckpt, "--sink-id", "orders"),
                          [_MemoryTarget(store)]) == code
    text = capsys.readouterr().out
    assert text.startswith("savepoint of sink orders: query q-1, last batch 0, committed")


def test_one_sink_and_a_target_that_holds_its_ledger(tmp_path: Path) -> None:
    store, ckpt = _setup(tmp_path, "9")
    with pytest.raises(ConfigurationError, match="exactly one --sink-id"):
        _savepoint.run(_args("--checkpoint", ckpt), [_MemoryTarget(store)])
    with pytest.raises(ConfigurationError, match="no ledger of sink 'other'"):
        _savepoint.run(_args("--checkpoint", ckpt, "--sink-id", "other"),
                       [_MemoryTarget(store)])


HANDLES_SIGTERM = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.5), sys.exit(0)))
print("ready", flush=True)
time.sleep(60)
"""
IGNORES_SIGTERM = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""


def _driver(code: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_stop_pid_waits_for_the_driver_to_end_then_takes_the_savepoint(tmp_path: Path) -> None:
    store, ckpt = _setup(tmp_path, "9")
    proc = _driver(HANDLES_SIGTERM)
    started = time.monotonic()
    args = _args("--checkpoint", ckpt, "--sink-id", "orders", "--stop-pid", str(proc.pid))
    assert _savepoint.run(args, [_MemoryTarget(store)]) == EXIT_ATTENTION  # a rate source
    assert proc.poll() == 0 and time.monotonic() - started >= 0.5


def test_a_driver_that_does_not_end_gets_no_savepoint(tmp_path: Path) -> None:
    store, ckpt = _setup(tmp_path, "9")
    proc = _driver(IGNORES_SIGTERM)
    try:
        args = _args("--checkpoint", ckpt, "--sink-id", "orders", "--stop-pid",
                     str(proc.pid), "--stop-timeout", "1")
        with pytest.raises(ConfigurationError, match="did not end within 1 s of SIGTERM: no "
                                                     "savepoint taken"):
            _savepoint.run(args, [_MemoryTarget(store)])
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(ConfigurationError, match="no such process"):
        _savepoint.stop_driver(proc.pid, 1)
    with pytest.raises(ConfigurationError, match="not a driver's process id"):
        _savepoint.stop_driver(1, 1)


def test_a_driver_its_parent_has_not_reaped_yet_has_ended() -> None:
    # The driver is the child of another process (a supervisor, a shell) that reaps it
    # later: the command sees a zombie, and a zombie has ended.
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         "p = subprocess.Popen([sys.executable, '-c', 'pass'])\n"
         "print(p.pid, flush=True)\n"
         "time.sleep(30)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while _savepoint._alive(child):
            assert time.monotonic() < deadline, "an unreaped child counted as running"
            time.sleep(0.05)
        assert _savepoint._alive(parent.pid)
    finally:
        parent.kill()
        parent.wait()
