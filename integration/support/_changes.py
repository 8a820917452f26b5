"""What the change-stream kill tests of PostgresSink and MariaDBSink share
(``integration/{postgres,mariadb}/test_*_changes.py``): the driver-side crash points in
turn, the streaming job's arguments, the check of the target after each kill, and the
check that the generated stream holds every case the tests are about.

The stream is ``examples/stream_changes_to_postgres.py``'s files (:data:`Change` rows
``(id, op, seq, name, amount)``); a target is a test's table, ledger and sink id with
``prepared()`` (the sink's prepared transactions) and ``ledger_states()``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from connectors.core.naming import TransactionId
from connectors.core.states import CRASH_POINTS, Family, Side
from connectors.sdk import CrashPoint
from examples.stream_changes_to_postgres import Change
from integration.support._driver import REPO, DriverRun, KillJob

__all__ = ["DELETES", "DRIVER_POINTS", "FILES", "ROWS_PER_FILE", "ChangesJob",
           "assert_stream_has_every_case", "holds_what_the_point_stands_for"]

DELETES = ("d", "delete")
#: The driver-side crash points of the prepared-transaction family, in the order one
#: restarted driver meets them (each in its own batch).
DRIVER_POINTS = [p for p in CRASH_POINTS[Family.PREPARE_IN_TASK] if p.side is Side.DRIVER]
FILES, ROWS_PER_FILE = len(DRIVER_POINTS) + 1, 400


class Target(Protocol):
    """A test's table, ledger and sink, as the checks read them."""

    table: str
    ledger: str
    sink_id: str

    def prepared(self) -> Sequence[TransactionId]: ...

    def ledger_states(self) -> dict[int, str]: ...


class ChangesJob(KillJob):
    """A change-stream driver (``module``) over the files in ``root/in``; ``extra``:
    arguments before the common ones."""

    def __init__(self, root: Path, target: Target, module: str,
                 extra: Sequence[str] = ()) -> None:
        super().__init__(root, sink_id=target.sink_id, cwd=REPO)
        self.module = module
        self.target = target
        self.input = root / "in"
        self.extra = list(extra)

    def args(self) -> list[str]:
        t = self.target
        return [*self.extra, "--input", str(self.input), "--checkpoint", str(self.checkpoint),
                "--table", t.table, "--sink-id", t.sink_id, "--ledger-table", t.ledger]


def holds_what_the_point_stands_for(
    target: Target, per_file: Sequence[Sequence[Change]],
    assert_exact: Callable[[list[Change]], None],
    between_commits: Callable[[int, Sequence[TransactionId]], None] | None = None,
) -> Callable[[CrashPoint, str, int, DriverRun], None]:
    """The check after each kill (``kill_at_each``'s ``after_kill``): the earlier batches
    applied, this one prepared, decided, partly or wholly committed as the point says
    (file f is batch f); ``assert_exact(changes)``: the table is these changes applied."""
    def check(point: CrashPoint, _sink: str, batch: int, _run: Any) -> None:
        prepared, state = target.prepared(), target.ledger_states()
        assert all(t.batch_id == batch for t in prepared), prepared
        assert all(state.get(b) == "COMMITTED" for b in range(batch)), state
        done = [c for file in per_file[:batch] for c in file]
        if point is CrashPoint.BEFORE_TASKS:
            assert not prepared and batch not in state
        elif point is CrashPoint.BEFORE_DECISION:
            assert prepared and batch not in state
        elif point is CrashPoint.AFTER_DECISION:
            assert state.get(batch) == "DECIDED" and prepared
        elif point is CrashPoint.BETWEEN_COMMITS:
            assert prepared and state.get(batch) == "DECIDED"
            if between_commits is not None:
                between_commits(batch, prepared)
            return  # partly committed: some keys show this batch, the others not yet
        else:
            assert state.get(batch) == "COMMITTED" and not prepared
            done += per_file[batch]
        assert_exact(done)

    return check


def assert_stream_has_every_case(per_file: Sequence[Sequence[Change]]) -> None:
    """The generated stream holds what the tests are about: several changes of a key
    within a file and across files, deletes of present keys, re-inserts after a delete,
    deletes of keys never seen, ties of one key's sequence value."""
    seen: set[int] = set()
    present: set[int] = set()
    cases: set[str] = set()
    for changes in per_file:
        keys = [c[0] for c in changes]
        if len(keys) > len(set(keys)):
            cases.add("several in a file")
        if seen & set(keys):
            cases.add("across files")
        if len({(c[0], c[2]) for c in changes}) < len(changes):
            cases.add("tie")
        for key, op, *_ in sorted(changes, key=lambda c: c[2]):
            if op.lower() in DELETES:
                cases.add("delete present" if key in present else
                          "delete never seen" if key not in seen else "delete absent")
                present.discard(key)
            else:
                if key in seen and key not in present:
                    cases.add("re-insert")
                present.add(key)
            seen.add(key)
    wanted = {"several in a file", "across files", "tie", "delete present",
              "delete never seen", "re-insert"}
    assert wanted <= cases, wanted - cases
