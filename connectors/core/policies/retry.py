"""Bounded retry of transient failures, then a clear :class:`RetriesExhaustedError`.

Modelled on Flink's ``RestartBackoffTimeStrategy`` family::

    NoRetry             <- NoRestartBackoffTimeStrategy
    FixedDelay          <- FixedDelayRestartBackoffTimeStrategy
    ExponentialBackoff  <- ExponentialDelayRestartBackoffTimeStrategy
    FailureRate         <- FailureRateRestartBackoffTimeStrategy

A policy is an immutable, picklable, validated frozen dataclass (it travels to executors by
cloudpickle). It holds no state: every retried operation asks it for a fresh
:class:`RetryTracker`, which answers "may I retry, and after how long?" for a failure seen
at clock time ``now``. :func:`call_with_retry` ties the two together.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from connectors.core.errors import ConfigurationError, RetriesExhaustedError, TransientError

__all__ = [
    "DEFAULT_COMMIT_RETRY",
    "ExponentialBackoff",
    "FailureRate",
    "FixedDelay",
    "NoRetry",
    "RetryPolicy",
    "RetryTracker",
    "call_with_retry",
    "default_is_retriable",
]

_log = logging.getLogger(__name__)
T = TypeVar("T")


def _require(ok: bool, policy: object, field: str, allowed: str, value: object) -> None:
    if not ok:
        raise ConfigurationError(
            f"{type(policy).__name__}.{field} must be {allowed}, got {value!r}"
        )


def _check_int(policy: object, field: str, value: object, minimum: int) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
    _require(ok, policy, field, f"an int >= {minimum}", value)


def _check_float(policy: object, field: str, value: object, minimum: float, *,
                 strict: bool = False, maximum: float = math.inf) -> None:
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and value <= maximum
          and (value > minimum if strict else value >= minimum))
    lower = f"> {minimum}" if strict else f">= {minimum}"
    upper = "" if maximum == math.inf else f" and <= {maximum}"
    _require(ok, policy, field, f"a finite number {lower}{upper}", value)


class RetryTracker:
    """Mutable per-operation state: counts attempts and decides on each failure."""

    def __init__(self) -> None:
        self.attempts = 0  # attempts made so far (each failure ends one)

    def on_failure(self, now: float) -> float | None:
        """Record a failure at clock time ``now``; the delay before retrying, or None."""
        self.attempts += 1
        return self._decide(now)

    def _decide(self, now: float) -> float | None:
        return None


@dataclass(frozen=True)
class RetryPolicy:
    """Base of the retry policies: immutable configuration, no state."""

    def new_tracker(self, rng: random.Random | None = None) -> RetryTracker:
        """A fresh tracker for one operation; ``rng`` makes jitter reproducible."""
        return RetryTracker()

    def limit(self) -> str:
        """The bound on attempts, for log lines such as ``attempt 3/<limit>``."""
        return "1"


@dataclass(frozen=True)
class NoRetry(RetryPolicy):
    """Never retry: the first retriable failure raises :class:`RetriesExhaustedError`.

    Example::

        call_with_retry(commit, policy=NoRetry(), description="commit")
    """


@dataclass(frozen=True)
class FixedDelay(RetryPolicy):
    """At most ``max_attempts`` attempts in all (the first included), ``delay`` s apart.

    Example::

        call_with_retry(commit, policy=FixedDelay(max_attempts=3, delay=0.5),
                        description="commit")
    """

    max_attempts: int = 5
    delay: float = 1.0

    def __post_init__(self) -> None:
        _check_int(self, "max_attempts", self.max_attempts, 1)
        _check_float(self, "delay", self.delay, 0.0)

    def new_tracker(self, rng: random.Random | None = None) -> RetryTracker:
        return _FixedTracker(self)

    def limit(self) -> str:
        return str(self.max_attempts)


class _FixedTracker(RetryTracker):
    def __init__(self, policy: FixedDelay) -> None:
        super().__init__()
        self.policy = policy

    def _decide(self, now: float) -> float | None:
        return self.policy.delay if self.attempts < self.policy.max_attempts else None


@dataclass(frozen=True)
class ExponentialBackoff(RetryPolicy):
    """Delays ``initial_delay * multiplier**k`` capped at ``max_delay``, then jittered.

    At most ``max_attempts`` attempts in all. ``jitter`` is a fraction: each delay is drawn
    uniformly from ``[d * (1 - jitter), d * (1 + jitter)]`` around the capped delay ``d``.
    With ``reset_after`` set, an attempt that ran at least that many seconds before failing
    counts as progress: the backoff and the attempt budget start over (total attempts, as
    reported in the error, keep counting).

    Example::

        policy = ExponentialBackoff(initial_delay=0.1, max_delay=5.0, max_attempts=8)
        call_with_retry(commit, policy=policy, description="commit")
        # sleeps ~0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0 s between the 8 attempts
    """

    initial_delay: float = 0.1
    max_delay: float = 30.0
    multiplier: float = 2.0
    max_attempts: int = 10
    jitter: float = 0.1
    reset_after: float | None = None

    def __post_init__(self) -> None:
        _check_float(self, "initial_delay", self.initial_delay, 0.0)
        _check_float(self, "max_delay", self.max_delay, 0.0)
        _require(self.max_delay >= self.initial_delay, self, "max_delay",
                 f">= initial_delay ({self.initial_delay!r})", self.max_delay)
        _check_float(self, "multiplier", self.multiplier, 1.0)
        _check_int(self, "max_attempts", self.max_attempts, 1)
        _check_float(self, "jitter", self.jitter, 0.0, maximum=1.0)
        if self.reset_after is not None:
            _check_float(self, "reset_after", self.reset_after, 0.0, strict=True)

    def delay_for(self, retry: int) -> float:
        """The un-jittered delay before retry number ``retry`` (1-based)."""
        # Compare exponents first: multiplier**k overflows long before the cap matters.
        if self.multiplier > 1 and self.initial_delay > 0:
            steps = math.log(self.max_delay / self.initial_delay, self.multiplier)
            if retry - 1 >= steps:
                return self.max_delay
        return min(self.initial_delay * self.multiplier ** (retry - 1), self.max_delay)

    def new_tracker(self, rng: random.Random | None = None) -> RetryTracker:
        return _ExponentialTracker(self, rng or random.Random())

    def limit(self) -> str:
        return str(self.max_attempts)


class _ExponentialTracker(RetryTracker):
    def __init__(self, policy: ExponentialBackoff, rng: random.Random) -> None:
        super().__init__()
        self.policy, self.rng = policy, rng
        self.streak = 0  # failures since the last reset
        self.retry_started: float | None = None  # clock time the current attempt began

    def _decide(self, now: float) -> float | None:
        p = self.policy
        ran = None if self.retry_started is None else now - self.retry_started
        if p.reset_after is not None and ran is not None and ran >= p.reset_after:
            self.streak = 0  # it ran healthy long enough: a new failure, not the same one
        self.streak += 1
        if self.streak >= p.max_attempts:
            return None
        base = p.delay_for(self.streak)
        delay = max(0.0, base * (1.0 + self.rng.uniform(-p.jitter, p.jitter)))
        self.retry_started = now + delay
        return delay


@dataclass(frozen=True)
class FailureRate(RetryPolicy):
    """Retry after ``delay`` s until more than ``max_failures`` failed within ``interval`` s.

    The window slides: failures older than ``interval`` are forgotten, so an operation
    that fails rarely is retried indefinitely, one that fails in bursts gives up.

    Example::

        # give up on the 4th failure within any 30 s
        policy = FailureRate(max_failures=3, interval=30.0, delay=2.0)
        call_with_retry(commit, policy=policy, description="commit")
    """

    max_failures: int = 5
    interval: float = 60.0
    delay: float = 1.0

    def __post_init__(self) -> None:
        _check_int(self, "max_failures", self.max_failures, 0)
        _check_float(self, "interval", self.interval, 0.0, strict=True)
        _check_float(self, "delay", self.delay, 0.0)

    def new_tracker(self, rng: random.Random | None = None) -> RetryTracker:
        return _FailureRateTracker(self)

    def limit(self) -> str:
        return f"<= {self.max_failures} failures per {self.interval:g}s"


class _FailureRateTracker(RetryTracker):
    def __init__(self, policy: FailureRate) -> None:
        super().__init__()
        self.policy = policy
        self.failures: deque[float] = deque()

    def _decide(self, now: float) -> float | None:
        self.failures.append(now)
        while self.failures[0] <= now - self.policy.interval:
            self.failures.popleft()
        return None if len(self.failures) > self.policy.max_failures else self.policy.delay


# Committing prepared transactions: the participant already holds the data, so giving
# up early turns a blip into a failed batch and a replay. Start fast (0.2 s: a lock or
# leader election often clears in well under a second), cap at 10 s so a recovering
# service is probed often, and stop after 18 attempts: 0.2+0.4+...+6.4 (12.6 s) + 11 x 10 s
# is ~2 minutes of waiting, longer than a typical failover, shorter than Spark's patience.
# 10 % jitter keeps the executors of one batch from retrying in lock-step.
DEFAULT_COMMIT_RETRY = ExponentialBackoff(
    initial_delay=0.2, max_delay=10.0, multiplier=2.0, max_attempts=18, jitter=0.1
)


def default_is_retriable(error: BaseException) -> bool:
    """``TransientError``s are retried, except an inner policy's ``RetriesExhaustedError``
    (retrying it again would multiply the budgets of nested retries)."""
    return isinstance(error, TransientError) and not isinstance(error, RetriesExhaustedError)


def _describe(error: BaseException) -> str:
    # Type and message only: never repr(args), which may carry raw values.
    try:
        message = str(error)
    except Exception:  # a broken __str__ must not hide the original failure
        message = "<unprintable>"
    if len(message) > 500:
        message = message[:500] + "..."
    return f"{type(error).__qualname__}: {message}"


def call_with_retry(
    fn: Callable[[], T],
    *,
    policy: RetryPolicy,
    description: str,
    is_retriable: Callable[[BaseException], bool] = default_is_retriable,
    sleep: Callable[[float], object] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
    rng: random.Random | None = None,
    sink_id: str | None = None,
    batch_id: int | None = None,
    transaction_id: str | None = None,
) -> T:
    """Call ``fn`` until it succeeds, a non-retriable error occurs, or ``policy`` gives up.

    A non-retriable error propagates unchanged. Each retriable one is logged (WARNING) and
    reported to ``on_retry(attempt, error, delay)`` before sleeping. When the policy gives
    up, :class:`RetriesExhaustedError` is raised from the last error, carrying the ids.

    Example::

        xid = "eos1|events-pg|1f2e3d4c|7|42"
        call_with_retry(lambda: commit(xid), policy=DEFAULT_COMMIT_RETRY,
                        description=f"COMMIT PREPARED {xid}", transaction_id=xid)
    """
    tracker = policy.new_tracker(rng)
    while True:
        try:
            return fn()
        except Exception as error:  # BaseException (Ctrl-C, SystemExit) is never retried
            if not is_retriable(error):
                raise
            delay = tracker.on_failure(clock())
            if delay is None:
                raise RetriesExhaustedError(
                    f"{description} failed after {tracker.attempts} attempt(s) under "
                    f"{policy!r}; last error: {_describe(error)}",
                    attempts=tracker.attempts, sink_id=sink_id, batch_id=batch_id,
                    transaction_id=transaction_id,
                ) from error
            _log.warning("%s: attempt %d/%s failed (%s); retrying in %.3fs", description,
                         tracker.attempts, policy.limit(), _describe(error), delay)
            if on_retry is not None:
                on_retry(tracker.attempts, error, delay)
            sleep(delay)
