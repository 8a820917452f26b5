"""``SinkDriver``: the driver side of one sink or one fan-out, for every way a batch runs.

It is the only object that builds a coordinator (:mod:`connectors.core.protocol.coordinator`), a
fan-out's program (:mod:`connectors.core.protocol.fanout_program`) or an executor
(:mod:`connectors.core.driver.executor`). It owns, for its lifetime on one driver:

- the run (:class:`~connectors.core.driver.driver_state.DriverState`: ledger, run id, binding);
- the program and one executor per attempt;
- batch restarts (:class:`~connectors.core.policies.restarts.BatchRestarts` under the
  ``outage_timeout``) and the graceful-stop guard
  (:func:`~connectors.core.policies.stopping.streaming_batch`);
- the batch's figures: created, counted, closed once per sink (``report_metrics``,
  ``last_metrics``, logged, published to the engine), also for a failed batch.

Entry points, and who calls them:

============================================  ===============================================
:meth:`SinkDriver.write`                      ``sink(df, batch_id)``, ``run_batch``,
                                              ``write_batch``; a ``FanOut`` the same
:meth:`~SinkDriver.plan`,                     the DataSource form: its planning worker, its
:meth:`~SinkDriver.commit`,                   commit worker (Spark gives a data source no
:meth:`~SinkDriver.abort`                     single driver call around a batch)
:meth:`~SinkDriver.settle`                    ``connectors recover`` (a run's start settles
                                              inside ``write`` and ``plan``)
============================================  ===============================================
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import pyarrow as pa

from connectors.core.batch import BatchInput, TaskOutcome
from connectors.core.driver.driver_state import DriverState
from connectors.core.driver.executor import Executor
from connectors.core.driver.planned import (
    PLANNING,
    RunTicket,
    SplitInput,
    planning,
    split_abort,
    split_commit,
)
from connectors.core.errors import ConfigurationError
from connectors.core.ledgers.ledger import BATCH_JOB_QUERY_ID, Ledger, LedgerEntry
from connectors.core.metrics import BatchMetrics, adopt_exporters
from connectors.core.policies.binding import Binding, Resume
from connectors.core.policies.restarts import BatchRestarts, Outage
from connectors.core.policies.retry import RetryPolicy
from connectors.core.policies.stopping import streaming_batch
from connectors.core.protocol.coordinator import Coordinator
from connectors.core.protocol.crash import SimulatedCrash
from connectors.core.protocol.fanout_program import FanOutProgram, FanOutTarget
from connectors.core.protocol.recovery import Settled
from connectors.core.states import Family

if TYPE_CHECKING:  # the sinks this drives; the template imports this module to run
    from connectors.core.templates.template import TwoPhaseCommitSink

__all__ = ["OPERATOR_QUERY_ID", "FanOutSettings", "SinkDriver"]

logger = logging.getLogger(__name__)

#: The query id an operator's settling records (``connectors recover``).
OPERATOR_QUERY_ID = "operator"


@dataclass(frozen=True)
class FanOutSettings:
    """What a fan-out's driver needs of :class:`~connectors.core.templates.fanout.FanOut`: its id,
    its targets in commit order, where its decisions are kept and its options."""

    sink_id: str
    targets: tuple[TwoPhaseCommitSink, ...]
    create_ledger: Callable[[], Ledger]
    retry: RetryPolicy
    outage: Outage
    reset_binding: bool = False
    #: ``resume_from`` of the fan-out: its own ledger and every target's bind with it.
    resume: Resume | None = None


def _coordinator(sink: TwoPhaseCommitSink, run_id: str, query_id: str,
                 metrics: BatchMetrics, binding: Binding | None = None) -> Coordinator:
    return Coordinator(
        sink.family, sink.sink_id, run_id=run_id, query_id=query_id,
        binding=binding or Binding(sink.reset_binding, sink.resume),
        on_replay_mismatch=sink.on_replay_mismatch,
        fingerprint_in_commit=sink.fingerprint_in_commit,
        keep_batches=sink.keep_batches, metrics=metrics,
    )


def _close_figures(sink: TwoPhaseCommitSink, metrics: BatchMetrics, batch: BatchInput) -> None:
    """A batch's figures are final: the sink's own (``report_metrics``), kept in its
    ``last_metrics``, logged, published to the engine; never failing the batch."""
    try:
        sink.report_metrics(metrics)
    except Exception as exc:  # figures must never fail a batch
        logger.warning("sink %s: report_metrics failed: %s", sink.sink_id, type(exc).__name__)
    sink.last_metrics = metrics
    metrics.emit()
    try:
        batch.publish_metrics(metrics.as_dict())
    except Exception as exc:  # figures must never fail a batch
        logger.warning("sink %s: publishing the batch's metrics failed: %s", sink.sink_id,
                       type(exc).__name__)


class SinkDriver:
    """The driver side of one sink (``SinkDriver(sink)``) or of a fan-out
    (``SinkDriver.fan_out(settings)``); see the module docstring."""

    def __init__(self, sink: TwoPhaseCommitSink | None = None, *,
                 fan_out: FanOutSettings | None = None) -> None:
        if (sink is None) == (fan_out is None):
            raise TypeError("a SinkDriver drives one sink or one fan-out")
        self._sink = sink
        self._fan_out = fan_out
        if fan_out is not None:
            self.sink_id: str = fan_out.sink_id
            #: The sinks whose figures a batch closes: the sink, or the fan-out's targets.
            self.sinks: tuple[TwoPhaseCommitSink, ...] = fan_out.targets
            self._open_ledger: Callable[[], Ledger] = fan_out.create_ledger
            self._outage: Outage = fan_out.outage
        else:
            assert sink is not None
            self.sink_id, self.sinks = sink.sink_id, (sink,)
            self._open_ledger, self._outage = sink.create_ledger, sink.outage
        self._state: DriverState | None = None
        #: Figures of the last batch, by sink id.
        self.last_metrics: dict[str, BatchMetrics] = {}

    @classmethod
    def fan_out(cls, settings: FanOutSettings) -> SinkDriver:
        """The driver of a fan-out: its own run and decisions; each target's run is the
        target's own driver's."""
        return cls(fan_out=settings)

    @property
    def state(self) -> DriverState:
        """This driver's run (its ledger is opened at the run's start)."""
        if self._state is None:
            self._state = DriverState(self._open_ledger)
        return self._state

    def close(self) -> None:
        """Release the ledger's resources; the driver may be used again."""
        if self._state is not None:
            self._state.close()
            self._state = None

    @property
    def _one(self) -> TwoPhaseCommitSink:
        if self._sink is None:
            raise ConfigurationError("a fan-out has no single-sink steps (plan, commit, "
                                     "abort, settle): settle its targets", sink_id=self.sink_id)
        return self._sink

    # ---- a batch ----
    def write(self, batch_id: int, inputs: Mapping[str, BatchInput],
              query_id: str | None) -> dict[str, BatchMetrics]:
        """Write batch ``batch_id`` exactly once (each sink's input by its sink id;
        ``query_id`` ``None`` for a batch job); each sink's figures by sink id. A
        streaming batch is refused with :class:`~connectors.core.errors.GracefulStop`,
        before any side effect, once a graceful stop of its query was requested."""
        first = inputs[self.sinks[0].sink_id]
        if query_id is None:
            return self._write(batch_id, inputs, None)
        with streaming_batch(query_id, batch_id, sink_id=self.sink_id,
                             stopping=lambda: first.stop_requested(query_id)):
            return self._write(batch_id, inputs, query_id)

    def _write(self, batch_id: int, inputs: Mapping[str, BatchInput],
               query_id: str | None) -> dict[str, BatchMetrics]:
        for sink in self.sinks:  # exporters that travelled with a sink (Spark Connect)
            adopt_exporters(sink.__dict__.get("_exporters", ()))
        metrics = {s.sink_id: BatchMetrics(s.sink_id, batch_id, s.family.value)
                   for s in self.sinks}
        started = time.monotonic()
        closed: set[str] = set()

        def close(sink_id: str) -> None:
            """A sink is done with the batch (or the batch failed): its figures, once."""
            if sink_id not in closed:
                closed.add(sink_id)
                m = metrics[sink_id]
                m.extra["total_ms"] = (time.monotonic() - started) * 1000
                sink = next(s for s in self.sinks if s.sink_id == sink_id)
                _close_figures(sink, m, inputs[sink_id])
                self.last_metrics[sink_id] = m

        def restarted(failures: int) -> None:
            for m in metrics.values():
                m.extra["batch_restarts"] = failures

        first = inputs[self.sinks[0].sink_id]
        restarts = BatchRestarts(self._outage, self.sink_id, batch_id, target=self._describe)
        qid = query_id or BATCH_JOB_QUERY_ID
        try:
            restarts.run(lambda: self._attempt(batch_id, inputs, qid, metrics, close),
                         stopping=lambda: query_id is not None and first.stop_requested(query_id),
                         on_restart=restarted)
        except BaseException:
            for sink_id, m in metrics.items():
                if sink_id not in closed:
                    m.outcome = "failed"
            raise
        finally:
            for sink in self.sinks:
                close(sink.sink_id)
        return metrics

    def _describe(self) -> str:
        return ", ".join(s.describe_target() for s in self.sinks)

    def _attempt(self, batch_id: int, inputs: Mapping[str, BatchInput], query_id: str,
                 metrics: Mapping[str, BatchMetrics], close: Callable[[str], None]) -> None:
        """One attempt, a new run of the program (and, in a fan-out, of every target)."""
        state = self.state
        if self._fan_out is None:
            sink = self._one
            coordinator = _coordinator(sink, state.run_id, query_id, metrics[sink.sink_id])
            executor = Executor(sink, state, metrics[sink.sink_id], inputs[sink.sink_id])
            executor.run(coordinator.write(batch_id, state.facts()))
            return
        fan = self._fan_out
        pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"fan-out-{self.sink_id}")
        try:
            targets, executors = [], {}
            # Resumed, every target rebinds from the fan-out's savepoint with it.
            follows = None if fan.resume is None else Binding(resume=fan.resume)
            for sink in fan.targets:
                run = sink.driver.state
                m = metrics[sink.sink_id]
                targets.append(FanOutTarget(sink.sink_id, sink.family,
                                            _coordinator(sink, run.run_id, query_id, m,
                                                         follows),
                                            run.facts(), sink.keep_batches))
                executors[sink.sink_id] = Executor(sink, run, m, inputs[sink.sink_id],
                                                   pool=pool)
            program = FanOutProgram(self.sink_id, run_id=state.run_id, query_id=query_id,
                                    facts=state.facts(), targets=targets,
                                    binding=Binding(fan.reset_binding, fan.resume))
            first = fan.targets[0]  # its begin_run opens the fan-out's run (see Executor)
            own = BatchMetrics(self.sink_id, batch_id, "fan_out")
            Executor(first, state, own, inputs[first.sink_id], sink_id=self.sink_id,
                     retry=fan.retry, targets=executors, finished=close,
                     ).run(program.write(batch_id))
        finally:
            pool.shutdown(wait=True)

    # ---- the DataSource form: a batch split across processes (connectors.core.driver.planned) ----
    def plan(self, schema: pa.Schema) -> RunTicket:
        """The planning worker, before the tasks: open a run, RECONCILING, check the
        input's schema. Returns the ticket the tasks and the commit worker carry."""
        sink = self._prepared_sink()
        state = DriverState(self._open_ledger)
        metrics = BatchMetrics(self.sink_id, PLANNING, Family.PREPARE_IN_TASK.value)
        coordinator = _coordinator(sink, state.run_id, "", metrics)
        ticket = Executor(sink, state, metrics, SplitInput(schema, sink_id=self.sink_id)).run(
            planning(coordinator))
        if metrics.reconciled or metrics.aborted:
            logger.info("sink %s: RECONCILING before a batch: %d finished, %d rolled back",
                        self.sink_id, metrics.reconciled, metrics.aborted)
        return cast("RunTicket", ticket)

    def _prepared_sink(self) -> TwoPhaseCommitSink:
        sink = self._one
        if sink.family is not Family.PREPARE_IN_TASK:
            raise ConfigurationError(
                f"{type(sink).__name__} has no DataSource form (only prepared-transaction "
                "sinks have one): use df.writeStream.foreachBatch(sink)", sink_id=self.sink_id)
        return sink

    def commit(self, ticket: RunTicket, batch_id: int, query_id: str, schema: pa.Schema,
               outcomes: Sequence[TaskOutcome]) -> BatchMetrics:
        """The commit worker, after the tasks: take the ticket's run up, bind, then the
        batch's steps with the tasks' ``outcomes`` (a transient failure runs them again
        under the sink's ``outage_timeout``; the ledger says whether the batch was
        decided). A batch refused or failed for good is rolled back (Spark calls no
        ``abort`` after a failed commit)."""
        sink = self._prepared_sink()
        metrics = BatchMetrics(self.sink_id, batch_id, Family.PREPARE_IN_TASK.value)
        started = time.monotonic()
        state = DriverState(self._open_ledger, run_id=ticket.run_id)
        batch = SplitInput(schema, outcomes, sink_id=self.sink_id)
        restarts = BatchRestarts(sink.outage, self.sink_id, batch_id,
                                 target=sink.describe_target)

        def attempt() -> None:
            coordinator = _coordinator(sink, ticket.run_id, query_id, metrics)
            Executor(sink, state, metrics, batch).run(split_commit(coordinator, ticket, batch_id))

        try:
            restarts.run(attempt, stopping=lambda: False,
                         on_restart=lambda n: metrics.extra.__setitem__("batch_restarts", n))
        except SimulatedCrash:  # a test's stand-in for this process dying: nothing runs on
            metrics.outcome = "failed"
            raise
        except BaseException:
            metrics.outcome = "failed"
            try:
                self.abort(ticket, batch_id)
            except Exception as exc:
                logger.warning("sink %s batch %d: rolling back after the commit step failed "
                               "did not finish (%s); the next planning does it", self.sink_id,
                               batch_id, type(exc).__name__)
            raise
        finally:
            metrics.extra["total_ms"] = (time.monotonic() - started) * 1000
            _close_figures(sink, metrics, batch)
            self.last_metrics[self.sink_id] = metrics
        return metrics

    def abort(self, ticket: RunTicket | None, batch_id: int) -> None:
        """Spark gave the batch up (a failed task, a stopped query): roll back this sink's
        undecided transactions now (a task still running may prepare later: the next
        planning, or ``connectors recover``, rolls that one back)."""
        sink = self._prepared_sink()
        state = (DriverState(self._open_ledger) if ticket is None
                 else DriverState(self._open_ledger, run_id=ticket.run_id))
        metrics = BatchMetrics(self.sink_id, batch_id, Family.PREPARE_IN_TASK.value)
        coordinator = _coordinator(sink, state.run_id, "", metrics)
        Executor(sink, state, metrics).run(split_abort(coordinator, ticket))
        metrics.outcome = "aborted"
        logger.info("sink %s batch %d: aborted by Spark; %d transaction(s) rolled back",
                    self.sink_id, batch_id, metrics.aborted)

    # ---- settling: connectors recover ----
    def settle(
        self,
        transactions: Sequence[str],
        *,
        commit_decided: bool,
        abort_undecided: bool,
        keep: frozenset[str] = frozenset(),
        adopt: Sequence[LedgerEntry] = (),
        ledger: Ledger | None = None,
    ) -> tuple[Settled, BatchMetrics]:
        """An operator's recovery (``connectors recover``): the steps a run's start runs,
        with the operator's choices (see :meth:`Coordinator.settle
        <connectors.core.protocol.coordinator.Coordinator.settle>`), as a run of its own under the
        ledger's serialization, so it never races a live driver. ``ledger``: an open
        ledger to use (the caller closes it); else the sink's, closed after. Returns what
        was settled and the run's figures (``reconciled``: slots fenced)."""
        sink = self._one
        state = DriverState((lambda: ledger) if ledger is not None else self._open_ledger)
        metrics = BatchMetrics(self.sink_id, -1, sink.family.value)
        try:
            coordinator = _coordinator(sink, state.run_id, OPERATOR_QUERY_ID, metrics)
            settled = Executor(sink, state, metrics).run(coordinator.settle(
                transactions, commit_decided=commit_decided, abort_undecided=abort_undecided,
                keep=keep, adopt=adopt))
        finally:
            if ledger is None:
                state.close()
        return cast("Settled", settled), metrics
