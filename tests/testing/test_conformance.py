"""The conformance suite passes the in-memory sink of every family and rejects the
deliberately broken sink of every family (``CommitBeforeDecisionSink``,
``IgnoresMarkerSink``, ``ForgetsCommitSink``), naming the scenario that catches it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from connectors.core.protocol import crash
from connectors.core.states import CRASH_POINTS, Family
from connectors.core.templates.template import TwoPhaseCommitSink
from connectors.testing import (
    SCENARIOS,
    CommitBeforeDecisionSink,
    DataSourceFormHarness,
    ForgetsCommitSink,
    IgnoresMarkerSink,
    InMemoryDriverCommitSink,
    InMemoryPreparedSink,
    InMemoryTarget,
    InMemoryTaskCommitSink,
    SinkConformanceTests,
    SinkHarness,
    run_conformance,
)
from connectors.testing.conformance import Row


class InMemoryHarness(SinkHarness):
    """One empty :class:`InMemoryTarget`; every sink built on it is a "restarted driver"."""

    def __init__(self, sink_class: Callable[..., TwoPhaseCommitSink], **options: Any) -> None:
        self.target = InMemoryTarget()
        self.sink_class = sink_class
        self.options = {"sink_id": "conformance", **options}

    def new_sink(self, **overrides: Any) -> TwoPhaseCommitSink:
        return self.sink_class(self.target, **{**self.options, **overrides})

    def committed_rows(self) -> list[Row]:
        return self.target.committed_rows()

    def lingering_transactions(self) -> int:
        return self.target.lingering()


def harness_factory(
    sink_class: Callable[..., TwoPhaseCommitSink], **options: Any
) -> Callable[[], SinkHarness]:
    """What the suite calls for every scenario (and every crash point): a fresh target."""
    return lambda: InMemoryHarness(sink_class, **options)


class TestInMemoryPreparedSink(SinkConformanceTests):
    make_harness = staticmethod(harness_factory(InMemoryPreparedSink))


class TestInMemoryTaskCommitSink(SinkConformanceTests):
    make_harness = staticmethod(harness_factory(InMemoryTaskCommitSink, slots=3))


class TestInMemoryTaskCommitSinkOneSlot(SinkConformanceTests):
    make_harness = staticmethod(harness_factory(InMemoryTaskCommitSink, slots=1))


class TestInMemoryDriverCommitSink(SinkConformanceTests):
    make_harness = staticmethod(harness_factory(InMemoryDriverCommitSink))


def test_the_harnesses_cover_every_family() -> None:
    families = {
        cls.make_harness().new_sink().family
        for cls in (TestInMemoryPreparedSink, TestInMemoryTaskCommitSink,
                    TestInMemoryDriverCommitSink)
    }
    assert families == set(Family)


def test_the_pytest_base_class_runs_every_scenario() -> None:
    tests = [n for n in dir(SinkConformanceTests) if n.startswith("test_")]
    assert len(tests) == len(SCENARIOS)


@pytest.mark.parametrize(
    "make",
    [
        harness_factory(InMemoryPreparedSink),
        harness_factory(InMemoryTaskCommitSink),
        harness_factory(InMemoryDriverCommitSink),
    ],
    ids=["prepared", "task_commit", "driver_commit"],
)
def test_run_conformance_returns_every_scenario_name(make: Callable[[], SinkHarness]) -> None:
    assert run_conformance(make) == list(SCENARIOS)


def test_crash_point_scenario_really_reaches_every_crash_point(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = []
    original = crash.disarm_all

    def remember_then_disarm() -> None:
        seen.extend(point for point, _, _ in crash.reached)
        original()

    monkeypatch.setattr(crash, "disarm_all", remember_then_disarm)
    SCENARIOS["crash_points"](harness_factory(InMemoryPreparedSink))
    assert set(seen) == set(CRASH_POINTS[Family.PREPARE_IN_TASK])


def test_commit_before_decision_sink_is_rejected_naming_the_failing_scenarios() -> None:
    with pytest.raises(AssertionError) as info:
        run_conformance(harness_factory(CommitBeforeDecisionSink))
    message = str(info.value)
    assert message.startswith("sink fails the conformance suite:")
    failed = {line.strip().split(":")[0] for line in message.splitlines()[1:]}
    assert {"crash_points", "speculation"} <= failed
    assert failed <= set(SCENARIOS)
    assert "plain" not in failed  # without a crash the broken sink looks fine
    assert "not exact" in message
    assert "extra/duplicated" in message


def _failed_scenarios(make: Callable[[], SinkHarness]) -> tuple[set[str], str]:
    """Run the suite on a sink that must fail it: the names of the failed scenarios, and
    the whole message."""
    with pytest.raises(AssertionError) as info:
        run_conformance(make)
    message = str(info.value)
    assert message.startswith("sink fails the conformance suite:")
    return {line.strip().split(":")[0] for line in message.splitlines()[1:]}, message


@pytest.mark.parametrize(
    ("broken", "correct", "family", "crash_at"),
    [
        (IgnoresMarkerSink, InMemoryTaskCommitSink, Family.COMMIT_IN_TASK, "after_precommit"),
        (ForgetsCommitSink, InMemoryDriverCommitSink, Family.COMMIT_ON_DRIVER, "after_decision"),
    ],
    ids=["ignores_marker", "forgets_commit"],
)
def test_broken_sink_is_rejected_by_the_crash_points_scenario_and_its_sibling_passes(
    broken: Callable[..., TwoPhaseCommitSink],
    correct: Callable[..., TwoPhaseCommitSink],
    family: Family,
    crash_at: str,
) -> None:
    assert harness_factory(broken)().new_sink().family is family
    assert harness_factory(correct)().new_sink().family is family
    assert run_conformance(harness_factory(correct)) == list(SCENARIOS)

    failed, message = _failed_scenarios(harness_factory(broken))
    # Only a restart exposes the mistake: retries, speculation and replays look fine.
    assert failed == {"crash_points"}
    assert f"crash_points: crash at {crash_at}, restart, replay: output is not exact" in message
    assert "0 missing" in message
    assert "extra/duplicated" in message


def test_ignores_marker_sink_duplicates_the_slots_committed_before_the_crash() -> None:
    make = harness_factory(IgnoresMarkerSink, slots=1)  # one slot: all of batch 1 twice
    failed, message = _failed_scenarios(make)
    assert failed == {"crash_points"}
    assert "0 missing, 7 extra/duplicated" in message



# ---- the DataSource form: the same scenarios through the split batch ----


class TestInMemoryPreparedSinkInItsDataSourceForm(SinkConformanceTests):
    make_harness = staticmethod(
        lambda: DataSourceFormHarness(harness_factory(InMemoryPreparedSink)()))


def test_the_data_source_form_rejects_a_sink_that_commits_before_the_decision() -> None:
    with pytest.raises(AssertionError) as info:
        run_conformance(lambda: DataSourceFormHarness(
            harness_factory(CommitBeforeDecisionSink)()))
    failed = {line.strip().split(":")[0] for line in str(info.value).splitlines()[1:]}
    assert {"crash_points", "speculation"} <= failed, str(info.value)
