"""Riding out a target's restart: a batch that failed with a transient error runs again.

A managed database fails over in 30-120 s and a Kafka cluster rolls its brokers one at a
time; a step's own retries (the sink's ``retry`` policy) cover a blip, not that. Like
Flink's restart strategies, which restart a job from its last checkpoint, the template runs
a batch whose attempt failed with a :class:`~connectors.core.errors.TransientError` (on the
driver, or in a task: the engine adapter turns a task's transient error into one) again,
as a new driver run: the coordinator settles what the failed attempt left (decided
transactions committed, undecided ones rolled back, slots fenced) and writes the batch, so
it lands exactly once. Between attempts it waits with exponential backoff; once the target
has been unavailable for longer than ``outage_timeout`` (counted from the batch's first
failed attempt), the batch fails with :class:`~connectors.core.errors.RetriesExhaustedError`
naming the target and the bound, and the query ends as before.

Errors that running the batch again cannot mend (bad input, a replay that differs, a binding
to another query, a fatal or data-loss error, a graceful stop) end it at once.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from connectors.core.errors import ConfigurationError, RetriesExhaustedError, TransientError
from connectors.core.policies.retry import ExponentialBackoff

__all__ = ["DEFAULT_BATCH_BACKOFF", "DEFAULT_OUTAGE_TIMEOUT", "BatchRestarts", "Outage",
           "is_transient"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: Seconds a target may stay unavailable before a batch gives up: a managed database's
#: failover takes 30-120 s.
DEFAULT_OUTAGE_TIMEOUT = 120.0


#: The waits between a batch's attempts: 1 s doubling to 10 s, 20 % jitter (the attempts
#: are bounded by the outage's time, not by a count).
DEFAULT_BATCH_BACKOFF = ExponentialBackoff(
    initial_delay=1.0, max_delay=10.0, multiplier=2.0, max_attempts=1_000_000, jitter=0.2)


@dataclass(frozen=True)
class Outage:
    """How a sink rides out an unavailable target (immutable, picklable).

    ``timeout``: seconds, from a batch's first failed attempt, during which the batch runs
    again after a transient error (0: never). ``backoff`` spaces the attempts (its
    ``delay_for`` and ``jitter``; the timeout, not its ``max_attempts``, ends them).
    """

    timeout: float = DEFAULT_OUTAGE_TIMEOUT
    backoff: ExponentialBackoff = DEFAULT_BATCH_BACKOFF

    def __post_init__(self) -> None:
        value = self.timeout
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value < 0):
            raise ConfigurationError(f"outage_timeout must be a finite number >= 0 "
                                     f"(seconds), got {value!r}")
        if not isinstance(self.backoff, ExponentialBackoff):
            raise ConfigurationError(f"an outage's backoff must be an ExponentialBackoff, got "
                                     f"{type(self.backoff).__name__}")

    def delay(self, failures: int, rng: random.Random) -> float:
        """The jittered wait after the ``failures``-th failed attempt (1-based)."""
        b = self.backoff
        return max(0.0, b.delay_for(failures) * (1.0 + rng.uniform(-b.jitter, b.jitter)))


def is_transient(error: BaseException) -> bool:
    """Whether running the batch again may mend ``error``: a target's transient failure
    (an exhausted step retry included: its target may come back)."""
    return isinstance(error, TransientError)


class BatchRestarts:
    """One batch's attempts: after each failed one, how long to wait before the next, or
    the error that ends the batch.

    Example::

        >>> from connectors.core.errors import TransientError
        >>> from connectors.core.policies.retry import ExponentialBackoff
        >>> steady = ExponentialBackoff(initial_delay=1.0, max_delay=10.0, jitter=0.0)
        >>> restarts = BatchRestarts(Outage(timeout=60, backoff=steady), "events", 7,
        ...                          target=lambda: "PostgreSQL db:5432", clock=lambda: 0.0)
        >>> restarts.after(TransientError("connection lost"))
        1.0
        >>> restarts.after(TransientError("connection refused"))
        2.0
    """

    def __init__(
        self,
        outage: Outage,
        sink_id: str,
        batch_id: int,
        *,
        target: Callable[[], str],
        clock: Callable[[], float] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.outage = outage
        self.sink_id = sink_id
        self.batch_id = batch_id
        self.target = target
        self.clock = clock or time.monotonic
        self.rng = rng or random.Random()
        self.failures = 0
        self.first_failure: float | None = None

    def after(self, error: BaseException) -> float | None:
        """The attempt failed with ``error``: the delay before the next attempt, or
        ``None`` when running the batch again cannot mend it (the caller re-raises).
        Raises :class:`RetriesExhaustedError` (from ``error``) past the outage bound."""
        if not is_transient(error) or self.outage.timeout <= 0:
            return None
        now = self.clock()
        if self.first_failure is None:
            self.first_failure = now
        self.failures += 1
        waited = now - self.first_failure
        o = self.outage
        delay = o.delay(self.failures, self.rng)
        target = self.target()  # named only once a batch failed (a sink's hook: not free)
        if waited + delay > o.timeout:
            raise RetriesExhaustedError(
                f"{target} stayed unavailable for {waited:.0f} s, past the sink's "
                f"outage_timeout ({o.timeout:g} s): batch {self.batch_id} ran "
                f"{self.failures} time(s); last error: {type(error).__name__}: {error}",
                attempts=self.failures, sink_id=self.sink_id, batch_id=self.batch_id,
            ) from error
        logger.warning(
            "sink %s: batch %d failed (%s: %s); %s may be restarting: the batch runs again "
            "in %.1f s as a new driver run (%.0f of %g s of outage_timeout used)",
            self.sink_id, self.batch_id, type(error).__name__, error, target, delay,
            waited, o.timeout)
        return delay

    def run(self, attempt: Callable[[], T], *, stopping: Callable[[], bool],
            on_restart: Callable[[int], None]) -> T:
        """``attempt()`` until it succeeds: after a failure, wait :meth:`after`'s delay and
        call ``on_restart(failures)`` first; re-raise when :meth:`after` says the failure
        cannot be mended, or when ``stopping()`` (a graceful stop was requested)."""
        while True:
            try:
                return attempt()
            except Exception as exc:
                delay = self.after(exc)  # past the bound: RetriesExhaustedError
                if delay is None or stopping():
                    raise
            on_restart(self.failures)
            time.sleep(delay)
