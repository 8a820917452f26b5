"""Retry policies and call_with_retry, on a fake clock: nothing here really sleeps."""

from __future__ import annotations

import dataclasses
import logging
import pickle
import random
from collections.abc import Callable

import pytest

from connectors.core.errors import (
    ConfigurationError,
    FatalError,
    RetriesExhaustedError,
    TransientError,
)
from connectors.core.policies.retry import (
    DEFAULT_COMMIT_RETRY,
    ExponentialBackoff,
    FailureRate,
    FixedDelay,
    NoRetry,
    RetryPolicy,
    call_with_retry,
)


class FakeTime:
    """A monotonic clock that only moves when ``sleep`` is called (or ``advance``)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Flaky:
    """Raises the given errors one per call, then returns ``result``."""

    def __init__(self, errors: list[BaseException], result: str = "ok") -> None:
        self.errors = list(errors)
        self.result = result
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.result


def always_failing(error_factory: Callable[[], BaseException]) -> Callable[[], str]:
    def fn() -> str:
        raise error_factory()

    return fn


def run(fn: Callable[[], str], policy: RetryPolicy, t: FakeTime, **kwargs: object) -> str:
    return call_with_retry(
        fn, policy=policy, description="commit txn-1", sleep=t.sleep, clock=t.clock,
        **kwargs,  # type: ignore[arg-type]
    )


# --- fixed delay -------------------------------------------------------------------------


def test_fixed_delay_returns_result_after_transient_failures() -> None:
    t = FakeTime()
    fn = Flaky([TransientError("blip"), TransientError("blip")])
    assert run(fn, FixedDelay(max_attempts=3, delay=0.5), t) == "ok"
    assert fn.calls == 3
    assert t.sleeps == [0.5, 0.5]


def test_fixed_delay_gives_up_after_max_attempts() -> None:
    t = FakeTime()
    fn = Flaky([TransientError(f"blip {i}") for i in range(10)])
    with pytest.raises(RetriesExhaustedError) as info:
        run(fn, FixedDelay(max_attempts=4, delay=2.0), t)
    assert fn.calls == 4
    assert t.sleeps == [2.0, 2.0, 2.0]
    assert info.value.attempts == 4


def test_no_retry_gives_up_on_first_retriable_failure() -> None:
    t = FakeTime()
    fn = Flaky([TransientError("blip")])
    with pytest.raises(RetriesExhaustedError) as info:
        run(fn, NoRetry(), t)
    assert fn.calls == 1
    assert t.sleeps == []
    assert info.value.attempts == 1


# --- exponential backoff -----------------------------------------------------------------


def test_exponential_delays_grow_and_cap_without_jitter() -> None:
    t = FakeTime()
    policy = ExponentialBackoff(initial_delay=0.1, max_delay=1.0, multiplier=2.0,
                                max_attempts=7, jitter=0.0)
    with pytest.raises(RetriesExhaustedError) as info:
        run(always_failing(lambda: TransientError("blip")), policy, t)
    assert t.sleeps == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert info.value.attempts == 7


def test_exponential_delay_for_does_not_overflow_on_huge_retry_numbers() -> None:
    policy = ExponentialBackoff(initial_delay=0.1, max_delay=30.0, max_attempts=100_000)
    assert policy.delay_for(50_000) == 30.0


def test_jitter_stays_within_fraction_of_base_delay() -> None:
    policy = ExponentialBackoff(initial_delay=1.0, max_delay=8.0, max_attempts=1000,
                                jitter=0.25)
    tracker = policy.new_tracker(random.Random(42))
    for retry in range(1, 200):
        delay = tracker.on_failure(float(retry))
        assert delay is not None
        base = policy.delay_for(retry)
        assert base * 0.75 <= delay <= base * 1.25


def test_jitter_is_deterministic_with_a_seeded_rng() -> None:
    policy = ExponentialBackoff(jitter=0.5, max_attempts=20)

    def delays(seed: int) -> list[float | None]:
        tracker = policy.new_tracker(random.Random(seed))
        return [tracker.on_failure(float(i)) for i in range(10)]

    assert delays(7) == delays(7)
    assert delays(7) != delays(8)


def test_reset_after_restarts_backoff_when_the_attempt_ran_long_enough() -> None:
    policy = ExponentialBackoff(initial_delay=1.0, max_delay=100.0, max_attempts=3,
                                jitter=0.0, reset_after=60.0)
    tracker = policy.new_tracker()
    assert tracker.on_failure(0.0) == 1.0  # retry starts at t=1
    assert tracker.on_failure(1.5) == 2.0  # ran 0.5 s: same streak; retry starts at 3.5
    # This attempt ran 100 s before failing: progress, so the backoff and budget restart.
    assert tracker.on_failure(103.5) == 1.0
    assert tracker.on_failure(104.6) == 2.0
    assert tracker.on_failure(106.7) is None  # 3rd failure of the new streak
    assert tracker.attempts == 5


def test_reset_after_does_not_count_the_backoff_sleep_as_progress() -> None:
    # A sleep longer than reset_after must not reset the streak (that would never end).
    policy = ExponentialBackoff(initial_delay=10.0, max_delay=10.0, max_attempts=3,
                                jitter=0.0, reset_after=5.0)
    t = FakeTime()
    with pytest.raises(RetriesExhaustedError):
        run(always_failing(lambda: TransientError("blip")), policy, t)
    assert t.sleeps == [10.0, 10.0]


# --- failure rate ------------------------------------------------------------------------


def test_failure_rate_gives_up_on_a_burst_above_max_failures() -> None:
    t = FakeTime()
    policy = FailureRate(max_failures=3, interval=60.0, delay=1.0)
    with pytest.raises(RetriesExhaustedError) as info:
        run(always_failing(lambda: TransientError("blip")), policy, t)
    assert t.sleeps == [1.0, 1.0, 1.0]
    assert info.value.attempts == 4  # the 4th failure within 60 s


def test_failure_rate_window_slides_so_spaced_failures_keep_retrying() -> None:
    tracker = FailureRate(max_failures=2, interval=10.0, delay=1.0).new_tracker()
    assert tracker.on_failure(0.0) == 1.0
    assert tracker.on_failure(5.0) == 1.0
    assert tracker.on_failure(10.0) == 1.0  # the failure at 0 is exactly 10 s old: gone
    assert tracker.on_failure(16.0) == 1.0  # the one at 5 slid out too
    assert tracker.on_failure(17.0) is None  # 10, 16, 17: three within 10 s


# --- error handling ----------------------------------------------------------------------


@pytest.mark.parametrize("error", [ValueError("bad row"), FatalError("fenced")])
def test_non_retriable_error_propagates_on_first_call_without_sleeping(
    error: Exception,
) -> None:
    t = FakeTime()
    fn = Flaky([error])
    with pytest.raises(type(error)) as info:
        run(fn, FixedDelay(), t)
    assert info.value is error
    assert fn.calls == 1
    assert t.sleeps == []


def test_keyboard_interrupt_is_never_retried() -> None:
    t = FakeTime()
    fn = Flaky([KeyboardInterrupt()])
    with pytest.raises(KeyboardInterrupt):
        run(fn, FixedDelay(), t, is_retriable=lambda e: True)
    assert fn.calls == 1


def test_custom_is_retriable_decides_what_is_retried() -> None:
    t = FakeTime()
    fn = Flaky([ConnectionError("reset"), ConnectionError("reset")])
    policy = FixedDelay(max_attempts=3, delay=0.1)
    assert run(fn, policy, t, is_retriable=lambda e: isinstance(e, ConnectionError)) == "ok"
    assert fn.calls == 3


def test_inner_retries_exhausted_error_is_not_retried_again_by_default() -> None:
    t = FakeTime()
    fn = Flaky([RetriesExhaustedError("inner gave up", attempts=3)])
    with pytest.raises(RetriesExhaustedError, match="inner gave up"):
        run(fn, FixedDelay(), t)
    assert fn.calls == 1


def test_retries_exhausted_error_names_operation_attempts_policy_and_last_error() -> None:
    t = FakeTime()
    last = TransientError("lock timeout")
    fn = Flaky([TransientError("first"), last])
    with pytest.raises(RetriesExhaustedError) as info:
        run(fn, FixedDelay(max_attempts=2, delay=0.0), t,
            sink_id="pg-sink", batch_id=7, transaction_id="txn-1")
    err = info.value
    assert err.__cause__ is last
    assert "commit txn-1" in err.message
    assert "2 attempt" in err.message
    assert "FixedDelay(max_attempts=2, delay=0.0)" in err.message
    assert "TransientError: lock timeout" in err.message
    assert (err.sink_id, err.batch_id, err.transaction_id) == ("pg-sink", 7, "txn-1")
    assert err.attempts == 2


def test_retries_exhausted_error_is_picklable_with_attempts_and_ids() -> None:
    t = FakeTime()
    with pytest.raises(RetriesExhaustedError) as info:
        run(always_failing(lambda: TransientError("blip")), FixedDelay(3, 0.0), t,
            sink_id="s", batch_id=3, transaction_id="x")
    clone = pickle.loads(pickle.dumps(info.value))
    assert type(clone) is RetriesExhaustedError
    assert (clone.attempts, clone.sink_id, clone.batch_id, clone.transaction_id) == (
        3, "s", 3, "x")
    assert str(clone) == str(info.value)


def test_warning_logs_attempt_delay_and_error_type_and_message_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class SecretCarrier(TransientError):
        def __init__(self) -> None:
            super().__init__("auth blip")
            self.args = ("auth blip", "password=hunter2")

        def __str__(self) -> str:
            return "auth blip"

    t = FakeTime()
    fn = Flaky([SecretCarrier()])
    with caplog.at_level(logging.WARNING, logger="connectors.core.policies.retry"):
        assert run(fn, FixedDelay(max_attempts=5, delay=1.5), t) == "ok"
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    text = record.getMessage()
    assert "commit txn-1" in text
    assert "attempt 1/5" in text
    assert "1.500s" in text
    assert "SecretCarrier: auth blip" in text
    assert "hunter2" not in text
    assert record.exc_info is None


def test_on_retry_is_told_attempt_error_and_delay_before_each_sleep() -> None:
    t = FakeTime()
    errors = [TransientError("a"), TransientError("b")]
    fn = Flaky(list(errors))
    seen: list[tuple[int, BaseException, float, int]] = []
    run(fn, FixedDelay(max_attempts=3, delay=0.25), t,
        on_retry=lambda n, e, d: seen.append((n, e, d, len(t.sleeps))))
    assert seen == [(1, errors[0], 0.25, 0), (2, errors[1], 0.25, 1)]


# --- policies as values ------------------------------------------------------------------

POLICIES: list[RetryPolicy] = [
    NoRetry(),
    FixedDelay(max_attempts=3, delay=0.5),
    ExponentialBackoff(initial_delay=0.2, max_delay=5.0, jitter=0.2, reset_after=30.0),
    FailureRate(max_failures=2, interval=10.0, delay=0.1),
    DEFAULT_COMMIT_RETRY,
]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: type(p).__name__)
def test_policies_survive_pickle_and_cloudpickle(policy: RetryPolicy) -> None:
    assert pickle.loads(pickle.dumps(policy)) == policy
    cloudpickle = pytest.importorskip("pyspark.cloudpickle")
    assert cloudpickle.loads(cloudpickle.dumps(policy)) == policy


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: type(p).__name__)
def test_policies_are_frozen(policy: RetryPolicy) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.delay = 3.0  # type: ignore[attr-defined]


def test_trackers_are_independent_per_operation() -> None:
    policy = FixedDelay(max_attempts=2, delay=1.0)
    first, second = policy.new_tracker(), policy.new_tracker()
    assert first.on_failure(0.0) == 1.0
    assert first.on_failure(1.0) is None
    assert second.on_failure(2.0) == 1.0


def test_default_commit_retry_is_bounded_to_about_two_minutes() -> None:
    p = DEFAULT_COMMIT_RETRY
    assert isinstance(p, ExponentialBackoff)
    total = sum(p.delay_for(k) for k in range(1, p.max_attempts))
    assert total * (1 - p.jitter) >= 90.0 and total * (1 + p.jitter) <= 150.0
    assert p.initial_delay == 0.2 and p.max_delay == 10.0


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: FixedDelay(max_attempts=0), "FixedDelay.max_attempts"),
        (lambda: FixedDelay(max_attempts=2.5), "FixedDelay.max_attempts"),  # type: ignore[arg-type]
        (lambda: FixedDelay(max_attempts=True), "FixedDelay.max_attempts"),
        (lambda: FixedDelay(delay=-1.0), "FixedDelay.delay"),
        (lambda: FixedDelay(delay=float("nan")), "FixedDelay.delay"),
        (lambda: ExponentialBackoff(initial_delay=-0.1), "ExponentialBackoff.initial_delay"),
        (lambda: ExponentialBackoff(max_delay=float("inf")), "ExponentialBackoff.max_delay"),
        (lambda: ExponentialBackoff(initial_delay=5.0, max_delay=1.0),
         "ExponentialBackoff.max_delay"),
        (lambda: ExponentialBackoff(multiplier=0.5), "ExponentialBackoff.multiplier"),
        (lambda: ExponentialBackoff(max_attempts=0), "ExponentialBackoff.max_attempts"),
        (lambda: ExponentialBackoff(jitter=1.5), "ExponentialBackoff.jitter"),
        (lambda: ExponentialBackoff(jitter=-0.1), "ExponentialBackoff.jitter"),
        (lambda: ExponentialBackoff(reset_after=0.0), "ExponentialBackoff.reset_after"),
        (lambda: FailureRate(max_failures=-1), "FailureRate.max_failures"),
        (lambda: FailureRate(interval=0.0), "FailureRate.interval"),
        (lambda: FailureRate(delay="1"), "FailureRate.delay"),  # type: ignore[arg-type]
    ],
)
def test_invalid_configs_are_rejected_naming_the_field_and_range(
    make: Callable[[], RetryPolicy], field: str,
) -> None:
    with pytest.raises(ConfigurationError, match=rf"^{field} must be .*, got ") as info:
        make()
    assert ">=" in str(info.value) or ">" in str(info.value)
