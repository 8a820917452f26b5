"""The per-batch state machine: legal transitions per family, errors naming the rest."""

from __future__ import annotations

import itertools

import pytest

from connectors.core.errors import ConnectorError, ProtocolStateError
from connectors.core.states import (
    CRASH_POINTS,
    BatchProtocol,
    BatchState,
    CrashPoint,
    Family,
    Side,
)

S = BatchState

LEGAL: dict[Family, set[tuple[BatchState, BatchState]]] = {
    Family.PREPARE_IN_TASK: {
        (S.OPEN, S.PREPARED),
        (S.OPEN, S.ABORTED),
        (S.PREPARED, S.DECIDED),
        (S.PREPARED, S.ABORTED),
        (S.DECIDED, S.COMMITTED),
    },
    Family.COMMIT_IN_TASK: {  # the ledger's record of the slots' commits decides
        (S.OPEN, S.PREPARED),
        (S.OPEN, S.ABORTED),
        (S.PREPARED, S.COMMITTED),
    },
    Family.COMMIT_ON_DRIVER: {
        (S.OPEN, S.DECIDED),
        (S.OPEN, S.ABORTED),
        (S.DECIDED, S.COMMITTED),
    },
}

ALL_PAIRS = list(itertools.product(BatchState, BatchState))


def _case_id(case: tuple[Family, BatchState, BatchState]) -> str:
    family, src, dst = case
    return f"{family.value}:{src.value}->{dst.value}"


LEGAL_CASES = [(f, a, b) for f in Family for (a, b) in sorted(LEGAL[f], key=str)]
ILLEGAL_CASES = [(f, a, b) for f in Family for (a, b) in ALL_PAIRS if (a, b) not in LEGAL[f]]


@pytest.mark.parametrize("case", LEGAL_CASES, ids=_case_id)
def test_legal_transition_advances_and_records_history(
    case: tuple[Family, BatchState, BatchState],
) -> None:
    family, src, dst = case
    p = BatchProtocol(family, "events", 3, state=src)
    assert p.can_advance(dst)
    p.advance(dst)
    assert p.state is dst
    assert p.history == [src, dst]


@pytest.mark.parametrize("case", ILLEGAL_CASES, ids=_case_id)
def test_illegal_transition_raises_naming_the_transition(
    case: tuple[Family, BatchState, BatchState],
) -> None:
    family, src, dst = case
    p = BatchProtocol(family, "events", 3, state=src)
    assert not p.can_advance(dst)
    with pytest.raises(ProtocolStateError) as info:
        p.advance(dst)
    message = str(info.value)
    assert f"{src.value} -> {dst.value}" in message
    assert family.value in message
    assert info.value.sink_id == "events"
    assert info.value.batch_id == 3
    # The state is unchanged by a refused transition.
    assert p.state is src
    assert p.history == [src]


def test_commit_without_decision_is_refused_with_the_reason() -> None:
    p = BatchProtocol(Family.PREPARE_IN_TASK, "events", 0)
    p.advance(S.PREPARED)
    with pytest.raises(ProtocolStateError, match=r"PREPARED -> COMMITTED") as info:
        p.advance(S.COMMITTED)
    assert "must be DECIDED" in str(info.value)


def test_rolling_back_a_decided_batch_is_refused_with_the_reason() -> None:
    p = BatchProtocol(Family.PREPARE_IN_TASK, "events", 0, state=S.DECIDED)
    with pytest.raises(ProtocolStateError, match=r"DECIDED -> ABORTED") as info:
        p.advance(S.ABORTED)
    assert "never rolled back" in str(info.value)


def test_slots_committed_in_tasks_cannot_be_aborted_after_preparing() -> None:
    p = BatchProtocol(Family.COMMIT_IN_TASK, "events", 0, state=S.PREPARED)
    with pytest.raises(ProtocolStateError, match=r"PREPARED -> ABORTED"):
        p.advance(S.ABORTED)


@pytest.mark.parametrize(
    ("family", "path"),
    [
        (Family.PREPARE_IN_TASK, [S.PREPARED, S.DECIDED, S.COMMITTED]),
        (Family.COMMIT_IN_TASK, [S.PREPARED, S.COMMITTED]),
        (Family.COMMIT_ON_DRIVER, [S.DECIDED, S.COMMITTED]),
    ],
)
def test_happy_path_of_each_family_finishes(family: Family, path: list[BatchState]) -> None:
    p = BatchProtocol(family, "events", 1)
    for state in path:
        assert not p.finished
        p.advance(state)
    assert p.finished
    assert p.history == [S.OPEN, *path]


@pytest.mark.parametrize("family", list(Family))
def test_terminal_states_have_no_way_out(family: Family) -> None:
    for terminal in (S.COMMITTED, S.ABORTED):
        p = BatchProtocol(family, "events", 1, state=terminal)
        assert p.finished
        assert not any(p.can_advance(s) for s in BatchState)


def test_protocol_error_is_a_connector_error() -> None:
    assert issubclass(ProtocolStateError, ConnectorError)


def test_repr_names_family_sink_batch_and_state() -> None:
    p = BatchProtocol(Family.COMMIT_ON_DRIVER, "events", 9)
    assert repr(p) == "BatchProtocol(commit_on_driver, sink_id='events', batch_id=9, state=OPEN)"


# --- crash points ------------------------------------------------------------------------


def test_crash_points_per_family() -> None:
    P = CrashPoint
    assert CRASH_POINTS[Family.PREPARE_IN_TASK] == (
        P.BEFORE_TASKS,
        P.BEFORE_PRECOMMIT,
        P.AFTER_PRECOMMIT,
        P.BEFORE_DECISION,
        P.AFTER_DECISION,
        P.BETWEEN_COMMITS,
        P.AFTER_COMMIT,
    )
    assert CRASH_POINTS[Family.COMMIT_IN_TASK] == (
        P.BEFORE_TASKS,
        P.BEFORE_PRECOMMIT,
        P.AFTER_PRECOMMIT,
        P.BEFORE_DECISION,
        P.AFTER_COMMIT,
    )
    assert CRASH_POINTS[Family.COMMIT_ON_DRIVER] == (
        P.BEFORE_TASKS,
        P.BEFORE_DECISION,
        P.AFTER_DECISION,
        P.AFTER_COMMIT,
    )
    assert set(CRASH_POINTS) == set(Family)


def test_every_crash_point_is_used_by_some_family() -> None:
    used = {p for points in CRASH_POINTS.values() for p in points}
    assert used == set(CrashPoint)


def test_driver_commit_family_has_no_task_side_crash_points() -> None:
    assert all(p.side is Side.DRIVER for p in CRASH_POINTS[Family.COMMIT_ON_DRIVER])


@pytest.mark.parametrize(
    ("point", "side"),
    [
        (CrashPoint.BEFORE_TASKS, Side.DRIVER),
        (CrashPoint.BEFORE_PRECOMMIT, Side.TASK),
        (CrashPoint.AFTER_PRECOMMIT, Side.TASK),
        (CrashPoint.BEFORE_DECISION, Side.DRIVER),
        (CrashPoint.AFTER_DECISION, Side.DRIVER),
        (CrashPoint.BETWEEN_COMMITS, Side.DRIVER),
        (CrashPoint.AFTER_COMMIT, Side.DRIVER),
    ],
)
def test_crash_point_side(point: CrashPoint, side: Side) -> None:
    assert point.side is side


def test_crash_point_values_are_the_environment_names() -> None:
    assert {p.value for p in CrashPoint} == {
        "before_tasks",
        "before_precommit",
        "after_precommit",
        "before_decision",
        "after_decision",
        "between_commits",
        "after_commit",
    }
    assert CrashPoint("after_decision") is CrashPoint.AFTER_DECISION
