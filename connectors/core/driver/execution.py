"""What an executor's performers share for one sink and one attempt (:class:`Execution`):
the sink, its run, the batch's figures and input, and the two ways a step meets I/O
(retried under the sink's policy, timed into the figures)."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from connectors.core.batch import BatchContext, BatchInput
from connectors.core.driver.driver_state import DriverState
from connectors.core.metrics import BatchMetrics
from connectors.core.policies.retry import RetryPolicy, call_with_retry

if TYPE_CHECKING:  # the hooks' one declaration; the template imports the driver to run
    from connectors.core.templates.template import TwoPhaseCommitSink

__all__ = ["Execution"]


class Execution:
    """One sink's attempt as its performers see it (built by the executor).

    ``sink_id`` and ``retry`` are the sink's, or a fan-out's for the fan-out's own steps;
    ``batch`` is the batch's input (replaced by the planned one at ``PlanInput``);
    ``pool`` runs a fan-out target's checks beside the other targets' work.
    """

    def __init__(self, sink: TwoPhaseCommitSink, state: DriverState, metrics: BatchMetrics,
                 batch: BatchInput | None, *, sink_id: str, retry: RetryPolicy,
                 pool: ThreadPoolExecutor | None = None) -> None:
        self.sink = sink
        self.state = state
        self.metrics = metrics
        self.batch = batch
        self.sink_id = sink_id
        self.retry = retry
        self.pool = pool

    def context(self, batch_id: int) -> BatchContext:
        """The driver-side hooks' context: it carries the batch's input."""
        return self.state.context(self.sink_id, batch_id, self.batch)

    def input(self) -> BatchInput:
        if self.batch is None:
            raise RuntimeError("a batch step without a batch input")  # a coordinator bug
        return self.batch

    def retried(self, fn: Callable[[], Any], description: str, **ids: Any) -> Any:
        """``fn()`` under the retry policy; each retry counted in the figures."""
        def count(_attempt: int, _error: BaseException, _delay: float) -> None:
            self.metrics.retries += 1

        return call_with_retry(fn, policy=self.retry, description=description,
                               on_retry=count, sink_id=self.sink_id, **ids)

    def timed(self, name: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, its milliseconds added to the figure ``name``."""
        start = time.monotonic()
        try:
            return fn()
        finally:
            ms = (time.monotonic() - start) * 1000
            setattr(self.metrics, name, getattr(self.metrics, name) + ms)
