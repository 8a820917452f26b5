"""``FanOut``: one ``foreachBatch`` callable over several sinks, under one decision per
batch: a batch lands in all of them or in none (docs/fan-out.md; issue 41).

Not in the public API yet: proved here on in-memory targets of the three families
(``tests/core/test_fanout.py``); the proof on PostgreSQL, Kafka and Delta together comes
before ``connectors.FanOut``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from connectors.core.batch import BatchInput
from connectors.core.engine import EngineCall, batch_input_for
from connectors.core.errors import ConfigurationError
from connectors.core.executor import DriverState
from connectors.core.fanout_batch import FanOutBatch
from connectors.core.ledger import BATCH_JOB_QUERY_ID, Ledger
from connectors.core.metrics import BatchMetrics, adopt_exporters
from connectors.core.naming import validate_sink_id
from connectors.core.protocol import Family
from connectors.core.restarts import DEFAULT_OUTAGE_TIMEOUT, BatchRestarts, Outage
from connectors.core.retry import DEFAULT_COMMIT_RETRY, RetryPolicy
from connectors.core.stopping import streaming_batch
from connectors.core.template import TwoPhaseCommitSink

__all__ = ["FanOut", "Transform"]

logger = logging.getLogger(__name__)

#: Shapes the batch for one target (``df -> df``); deterministic, like the query.
Transform = Callable[[Any], Any]
#: Commit order: prepared targets first, then driver commits, task commits last (they
#: cannot hold a transaction past their task).
_ORDER = {Family.PREPARE_IN_TASK: 0, Family.COMMIT_ON_DRIVER: 1, Family.COMMIT_IN_TASK: 2}


class FanOut:
    """Several sinks written from one ``foreachBatch``, a batch in all of them or in none.

    Each target is a sink, or ``(sink, transform)`` where ``transform(df) -> df`` shapes
    the batch for it. ``sink_id`` names the fan-out's decisions, kept in ``ledger`` (by
    default one of the first target's kind, :meth:`TwoPhaseCommitSink.create_ledger_for`).

    Example::

        >>> from connectors.testing import (InMemoryDriverCommitSink, InMemoryPreparedSink,
        ...     InMemoryTarget, LocalBatch, batch_rows)
        >>> db, lake = InMemoryTarget(), InMemoryTarget()
        >>> fan = FanOut(InMemoryPreparedSink(db, sink_id="db"),
        ...              InMemoryDriverCommitSink(lake, sink_id="lake"), sink_id="both")
        >>> batch = LocalBatch(batch_rows(0), partitions=2)
        >>> metrics = fan.write_batches({"db": batch, "lake": batch}, 0)
        >>> len(db.committed_rows()) == len(lake.committed_rows()) == batch_rows(0).num_rows
        True
    """

    def __init__(
        self,
        *targets: TwoPhaseCommitSink | tuple[TwoPhaseCommitSink, Transform],
        sink_id: str,
        ledger: Ledger | None = None,
        persist: bool = True,
        retry: RetryPolicy = DEFAULT_COMMIT_RETRY,
        outage_timeout: float = DEFAULT_OUTAGE_TIMEOUT,
        query_name: str | None = None,
        reset_binding: bool = False,
        min_targets: int = 2,
    ) -> None:
        self.sink_id = validate_sink_id(sink_id)
        pairs: list[tuple[TwoPhaseCommitSink, Transform | None]] = []
        for target in targets:
            sink, transform = target if isinstance(target, tuple) else (target, None)
            if not isinstance(sink, TwoPhaseCommitSink):
                raise ConfigurationError(
                    f"a FanOut target must be a sink (PostgresSink, KafkaSink, DeltaSink, a "
                    f"TwoPhaseCommitSink) or (sink, transform), got {type(sink).__name__}",
                    sink_id=sink_id)
            if transform is not None and not callable(transform):
                raise ConfigurationError(f"the transform of {sink.sink_id} is not callable",
                                         sink_id=sink_id)
            pairs.append((sink, transform))
        ids = [s.sink_id for s, _ in pairs]
        if len(pairs) < min_targets:  # DeltaSinks keeps taking a list of one
            raise ConfigurationError("a FanOut needs two targets or more", sink_id=sink_id)
        if dup := sorted({i for i in ids if ids.count(i) > 1} | ({sink_id} & set(ids))):
            raise ConfigurationError(
                f"sink id(s) {', '.join(dup)} repeat: each target and the fan-out need their "
                "own sink_id", sink_id=sink_id)
        #: The targets, in commit order (stable within a family).
        self.targets = sorted(pairs, key=lambda p: _ORDER[p[0].family])
        self.persist = bool(persist)
        self.retry = retry
        self.outage = Outage(timeout=outage_timeout)
        self.query_name = query_name
        self.reset_binding = bool(reset_binding)
        self._ledger = ledger
        self._state: DriverState | None = None
        #: Metrics of each target's last batch (by sink id).
        self.last_metrics: dict[str, BatchMetrics] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Spark Connect pickles the fan-out to its foreachBatch worker: the configuration
        # and the sinks (each pickles its own), never this driver's ledger or figures.
        state = self.__dict__.copy()
        state["_state"] = None
        state["last_metrics"] = {}
        return state

    def __repr__(self) -> str:
        return f"FanOut({', '.join(repr(s) for s, _ in self.targets)}, sink_id={self.sink_id!r})"

    @property
    def sinks(self) -> list[TwoPhaseCommitSink]:
        return [s for s, _ in self.targets]

    def create_ledger(self) -> Ledger:
        """The fan-out's ledger: the one given, or the first target's kind."""
        if self._ledger is not None:
            return self._ledger
        return self.sinks[0].create_ledger_for(self.sink_id)

    # ---- entry points ----
    def __call__(self, df: Any, batch_id: int) -> None:
        """``foreachBatch`` entry point."""
        self._call(df, batch_id, batch_job=False)

    def run_batch(self, df: Any, run_id: int) -> dict[str, BatchMetrics]:
        """A batch job's run ``run_id`` (as ``TwoPhaseCommitSink.run_batch``)."""
        return self._call(df, run_id, batch_job=True)

    def _call(self, df: Any, batch_id: int, *, batch_job: bool) -> dict[str, BatchMetrics]:
        if getattr(df, "isStreaming", False):
            raise ConfigurationError("the fan-out got a streaming DataFrame: use it as "
                                     "df.writeStream.foreachBatch(fan)", sink_id=self.sink_id)
        data = df.persist() if self.persist and hasattr(df, "persist") else df
        try:
            inputs: dict[str, BatchInput] = {}
            query_id: str | None = None
            for sink, transform in self.targets:
                call = EngineCall(sink.sink_id, sink.hash_rows_in_tasks,
                                  self.query_name or sink.query_name, batch_job)
                batch, query_id = batch_input_for(
                    transform(data) if transform is not None else data, call)
                inputs[sink.sink_id] = batch
            return self.write_batches(inputs, batch_id, query_id=query_id)
        finally:
            if data is not df:
                data.unpersist()

    def write_batches(self, inputs: Mapping[str, BatchInput], batch_id: int, *,
                      query_id: str | None = None) -> dict[str, BatchMetrics]:
        """Write batch ``batch_id`` (each target's input by its sink id) exactly once into
        every target under one decision; each target's metrics, by sink id."""
        if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
            raise ConfigurationError(f"batch id must be an int >= 0, got {batch_id!r}",
                                     sink_id=self.sink_id)
        if missing := sorted(set(s.sink_id for s in self.sinks) - set(inputs)):
            raise ConfigurationError(f"no input for target(s) {', '.join(missing)}",
                                     sink_id=self.sink_id)
        if query_id is None:
            return self._write(inputs, batch_id, None)
        first = inputs[self.sinks[0].sink_id]
        with streaming_batch(query_id, batch_id, sink_id=self.sink_id,
                             stopping=lambda: first.stop_requested(query_id)):
            return self._write(inputs, batch_id, query_id)

    def _write(self, inputs: Mapping[str, BatchInput], batch_id: int,
               query_id: str | None) -> dict[str, BatchMetrics]:
        if self._state is None:
            self._state = DriverState(self.create_ledger)
        state = self._state
        for sink in self.sinks:  # exporters that travelled with a sink (Spark Connect)
            adopt_exporters(sink.__dict__.get("_exporters", ()))
        metrics = {s.sink_id: BatchMetrics(s.sink_id, batch_id, s.family.value)
                   for s in self.sinks}
        restarts = BatchRestarts(self.outage, self.sink_id, batch_id,
                                 target=lambda: ", ".join(s.describe_target()
                                                          for s in self.sinks))
        started = time.monotonic()
        reported: set[str] = set()

        def report(sink: TwoPhaseCommitSink) -> None:
            """A target is done with the batch (or the batch failed): its figures, once."""
            if sink.sink_id not in reported:
                reported.add(sink.sink_id)
                m = metrics[sink.sink_id]
                m.extra["total_ms"] = (time.monotonic() - started) * 1000
                sink._close_batch(m, inputs[sink.sink_id])
                self.last_metrics[sink.sink_id] = m

        def attempt() -> None:  # each attempt a new run of the fan-out and of every target
            FanOutBatch(self.sink_id, state, self.sinks, inputs,
                        query_id or BATCH_JOB_QUERY_ID, metrics, retry=self.retry,
                        reset_binding=self.reset_binding, finished=report).run(batch_id)

        def restarted(failures: int) -> None:
            for m in metrics.values():
                m.extra["batch_restarts"] = failures

        try:
            restarts.run(attempt, on_restart=restarted, stopping=lambda: (
                query_id is not None
                and inputs[self.sinks[0].sink_id].stop_requested(query_id)))
        except BaseException:
            for sink in self.sinks:
                if sink.sink_id not in reported:
                    metrics[sink.sink_id].outcome = "failed"
            raise
        finally:
            for sink in self.sinks:
                report(sink)
        return metrics

    def close(self) -> None:
        """Release every target's and the fan-out's ledger resources."""
        for sink in self.sinks:
            sink.close()
        if self._state is not None:
            self._state.close()
            self._state = None
