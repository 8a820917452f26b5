"""``FanOut``: one ``foreachBatch`` callable over several sinks, under one decision per
batch: a batch lands in all of them or in none (docs/fan-out.md). Public as
``connectors.FanOut``; its batch is a program (:mod:`connectors.core.protocol.fanout_program`) its
driver runs (:class:`~connectors.core.driver.sink_driver.SinkDriver`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from connectors.core.batch import BatchInput
from connectors.core.driver.sink_driver import FanOutSettings, SinkDriver
from connectors.core.engine import EngineCall, batch_input_for
from connectors.core.errors import ConfigurationError
from connectors.core.ledgers.ledger import Ledger
from connectors.core.metrics import BatchMetrics
from connectors.core.naming import validate_sink_id
from connectors.core.policies.binding import ResumePoint, resume_option
from connectors.core.policies.restarts import DEFAULT_OUTAGE_TIMEOUT, Outage
from connectors.core.policies.retry import DEFAULT_COMMIT_RETRY, RetryPolicy
from connectors.core.states import Family
from connectors.core.templates.template import TwoPhaseCommitSink

__all__ = ["FanOut", "Transform"]

logger = logging.getLogger(__name__)

#: Shapes the batch for one target (``df -> df``); deterministic, like the query.
Transform = Callable[[Any], Any]
#: Commit order: prepared targets first, then driver commits, task commits last (they
#: cannot hold a transaction past their task).
_ORDER = {Family.PREPARE_IN_TASK: 0, Family.COMMIT_ON_DRIVER: 1, Family.COMMIT_IN_TASK: 2}


class FanOut:
    """Several sinks written from one ``foreachBatch``, a batch in all of them or in none.

    No target shows batch N before every target has prepared or checked its part of N
    (PostgreSQL's transactions prepared, Delta's batch checked against its table, every
    Kafka record checked); then one durable decision names every part, and every target
    gets its part, at the latest when the query runs again. A batch one target refuses
    commits nothing anywhere and raises that target's error (its ``sink_id`` set).
    Between the first target's commit of N and the last one's, a reader of two targets
    can see N in one and not yet in the other (docs/fan-out.md: the window, the crash
    points and what each leaves).

    Args:
        *targets: two or more sinks (PostgresSink, KafkaSink, DeltaSink, a connector
            author's :class:`~connectors.sdk.TwoPhaseCommitSink`), each alone or as
            ``(sink, transform)`` where ``transform(df) -> df`` shapes the batch for that
            target (a topic's ``key``/``value``); a transform must be deterministic, like
            the query. Each keeps its own ledger entries (``connectors status`` shows
            each). They commit in family order: prepared transactions first, then driver
            commits, task commits (Kafka) last.
        sink_id: the fan-out's stable name (its decisions' key), distinct from every
            target's.
        ledger: where the decisions are kept; default: a ledger of the first target's
            kind (:meth:`~connectors.sdk.TwoPhaseCommitSink.create_ledger_for`), so with a
            PostgreSQL target, PostgreSQL's ledger table.
        persist: persist the batch once for all targets (unpersisted after).
        retry: the retry policy of the fan-out's own ledger writes.
        outage_timeout: seconds a batch may keep failing transiently (a target down) and
            run again, as for one sink.
        query_name: the streaming query's name; needed under Spark Connect, as for one
            sink.
        reset_binding: accept a new checkpoint for this ``sink_id`` (as for one sink).
        resume_from, checkpoint_location: the fan-out's savepoint (``take_savepoint(fan,
            ...)``) and the new query's checkpoint, as for one sink: the fan-out's ledger and
            every target's take the new query over where the savepoint ended, each checked
            (docs/savepoints.md). Give them to the fan-out, not to its targets.

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

    With Spark: ``df.writeStream.foreachBatch(FanOut(pg, (kafka, to_records), delta,
    sink_id="events-fan"))``; a batch job: ``fan.run_batch(df, run_id)`` (or
    ``fan(df, run_id)``).
    """

    #: Fewest targets (:class:`~connectors.delta.DeltaSinks` takes one).
    min_targets: ClassVar[int] = 2

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
        resume_from: ResumePoint | str | None = None,
        checkpoint_location: str | None = None,
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
            if sink.resume is not None:
                raise ConfigurationError(
                    f"target {sink.sink_id} has resume_from: give the fan-out's savepoint to "
                    "the FanOut (resume_from=, checkpoint_location=), whose ledger and every "
                    "target's move together", sink_id=sink_id)
            pairs.append((sink, transform))
        ids = [s.sink_id for s, _ in pairs]
        if len(pairs) < self.min_targets:
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
        #: ``resume_from`` and the new query's checkpoint (see the arguments).
        self.resume = resume_option(self.sink_id, resume_from, checkpoint_location,
                                    self.reset_binding)
        self._ledger = ledger
        self._driver: SinkDriver | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Spark Connect pickles the fan-out to its foreachBatch worker: the configuration
        # and the sinks (each pickles its own), never this driver's ledger or figures.
        state = self.__dict__.copy()
        state["_driver"] = None
        return state

    def __repr__(self) -> str:
        return f"FanOut({', '.join(repr(s) for s, _ in self.targets)}, sink_id={self.sink_id!r})"

    @property
    def sinks(self) -> list[TwoPhaseCommitSink]:
        return [s for s, _ in self.targets]

    @property
    def driver(self) -> SinkDriver:
        """The fan-out's driver side (:class:`~connectors.core.driver.sink_driver.SinkDriver`):
        its run and decisions on this driver; each target keeps its own."""
        if self._driver is None:
            self._driver = SinkDriver.fan_out(FanOutSettings(
                self.sink_id, tuple(self.sinks), self.create_ledger, self.retry, self.outage,
                self.reset_binding, self.resume))
        return self._driver

    @property
    def last_metrics(self) -> dict[str, BatchMetrics]:
        """Metrics of each target's last batch on this driver (by sink id)."""
        return self.driver.last_metrics if self._driver is not None else {}

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
        """Write ``df`` once in a batch job, as run ``run_id``: rerun with the same
        ``run_id`` after a crash, a greater one for a new run (as a sink's ``run_batch``;
        ``fan(df, run_id)`` does the same in classic PySpark). Each target's metrics."""
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
        return self.driver.write(batch_id, inputs, query_id)

    def close(self) -> None:
        """Release every target's and the fan-out's ledger resources."""
        for sink in self.sinks:
            sink.close()
        if self._driver is not None:
            self._driver.close()
            self._driver = None
