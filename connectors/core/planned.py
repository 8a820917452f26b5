"""A split batch: a PREPARE_IN_TASK batch planned in one process and committed in another.

Spark's Python data sources (the DataSource form, ``docs/datasource.md``) give a sink no
single driver call around a batch. Spark calls the source's ``streamWriter`` in a planning
worker before the batch's tasks (no batch id yet), the writer's ``write`` in each task, and
``commit(messages, batch_id)`` or ``abort`` in a commit worker: three processes. The
batch's steps stay the coordinator's (:mod:`connectors.core.coordinator`), cut at the tasks:

- :meth:`PlannedRun.plan`, before the tasks: open a run (a fencing epoch in the ledger),
  RECONCILING (finish decided batches, roll back every undecided transaction of the sink:
  nothing of it is in flight between two batches), then plan the input (the sink's checks
  of the schema). Returns the :class:`RunTicket` the tasks carry;
- the tasks prepare under the ticket's run (:func:`~connectors.core.tasks.prepare_task`);
- :meth:`PlannedRun.commit`, after them: take the run up (:meth:`Ledger.resume_run`), bind
  to the query, then the coordinator's batch with the tasks' outcomes: a replay the ledger
  has is checked and what the tasks wrote again is rolled back (the sweep); otherwise
  decide, commit, sweep;
- :meth:`PlannedRun.abort`: the sweep (the tasks' transactions are undecided).

A step that fails in :meth:`~PlannedRun.commit` with a transient error runs again under
the sink's ``outage_timeout``, with the same outcomes: the ledger, not the attempt, says
whether the batch was decided. The ledger's resources are the sink's (its connection, kept
by the engine adapter across batches of a worker).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from connectors.core.batch import BatchInput, TaskFunction, TaskOutcome
from connectors.core.commands import BindQuery, OpenRun, PlanInput, Prune
from connectors.core.coordinator import Coordinator, RunFacts, Steps
from connectors.core.crash import SimulatedCrash
from connectors.core.errors import ConfigurationError, ProtocolStateError
from connectors.core.executor import DriverState, Executor
from connectors.core.fingerprint import Fingerprint
from connectors.core.metrics import BatchMetrics
from connectors.core.protocol import Family
from connectors.core.restarts import BatchRestarts

if TYPE_CHECKING:
    from connectors.core.families import PreparedTransactionSink

__all__ = ["PLANNING", "PlannedRun", "RunTicket", "SplitInput"]

logger = logging.getLogger(__name__)

#: The batch id of the planning step's hooks (``begin_run``, ``plan_input``): Spark plans
#: the write before it names the batch to the sink.
PLANNING = -1


@dataclass(frozen=True)
class RunTicket:
    """The run a planning step opened, as its tasks and its commit worker see it."""

    run_id: str
    #: The ledger's :meth:`~connectors.core.ledger.Ledger.run_token` (its fencing epoch).
    token: str | None = None


class SplitInput(BatchInput):
    """A batch whose rows stay in Spark's tasks: its schema, and after the tasks their
    outcomes (returned by :meth:`run_tasks`, which runs nothing)."""

    def __init__(self, schema: pa.Schema, outcomes: Sequence[TaskOutcome] = (),
                 *, sink_id: str = "") -> None:
        self._schema = schema
        self._outcomes = list(outcomes)
        self._sink_id = sink_id

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def run_tasks(self, fn: TaskFunction, *, barrier: bool = False) -> list[TaskOutcome]:
        if barrier:  # pragma: no cover - PREPARE_IN_TASK never asks for it
            raise ProtocolStateError("a split batch cannot run a barrier stage")
        return list(self._outcomes)

    def slotted(self, slots: int, columns: list[str] | None = None, *,
                key: str | None = None, local_rows: int = 0) -> BatchInput:
        raise ConfigurationError(
            "the DataSource form cannot route rows to tasks (a Spark data source cannot "
            "ask for a distribution), and this sink routes them in its configuration "
            "(PostgresSink: modes upsert and changes, every row of a key to one task). "
            "Use the foreachBatch form: df.writeStream.foreachBatch(sink)",
            sink_id=self._sink_id)

    def fingerprint(self) -> Fingerprint:
        """The sum of the tasks' fingerprints (a task's error first: its rows are unknown)."""
        total = Fingerprint()
        for outcome in self._outcomes:
            if outcome.error is not None:
                raise outcome.error
            if outcome.commit is not None:
                total = total + outcome.commit.fingerprint
        return total

    def to_arrow(self) -> pa.Table:
        raise ProtocolStateError("a split batch's rows stayed in its tasks")

    def tasks_ended(self) -> bool:
        return False  # a commit worker cannot ask Spark: the next planning sweeps again


class PlannedRun:
    """The DataSource form's steps for one sink (see the module docstring)."""

    def __init__(self, sink: PreparedTransactionSink[Any]) -> None:
        if sink.family is not Family.PREPARE_IN_TASK:
            raise ConfigurationError(
                f"{type(sink).__name__} has no DataSource form (only prepared-transaction "
                "sinks have one): use df.writeStream.foreachBatch(sink)", sink_id=sink.sink_id)
        self.sink = sink

    def _coordinator(self, run_id: str, query_id: str, metrics: BatchMetrics) -> Coordinator:
        return self.sink._coordinator(run_id, query_id, metrics)  # the template's

    def plan(self, schema: pa.Schema) -> RunTicket:
        """Before the tasks: open a run, reconcile, check the input's schema."""
        state = DriverState(self.sink.create_ledger)
        metrics = BatchMetrics(self.sink.sink_id, PLANNING, Family.PREPARE_IN_TASK.value)
        coordinator = self._coordinator(state.run_id, "", metrics)

        def steps() -> Steps[None]:
            yield from coordinator.step(OpenRun(state.run_id, PLANNING))
            yield from coordinator.reconcile()
            yield from coordinator.step(PlanInput(PLANNING))

        Executor(self.sink, state, metrics, SplitInput(schema, sink_id=self.sink.sink_id)).run(
            steps())
        if metrics.reconciled or metrics.aborted:
            logger.info("sink %s: RECONCILING before a batch: %d finished, %d rolled back",
                        self.sink.sink_id, metrics.reconciled, metrics.aborted)
        return RunTicket(state.run_id, state.ledger.run_token())

    def _state(self, ticket: RunTicket) -> DriverState:
        state = DriverState(self.sink.create_ledger, run_id=ticket.run_id)
        state.ledger.resume_run(ticket.run_id, ticket.token)
        return state

    def commit(self, ticket: RunTicket, batch_id: int, query_id: str, schema: pa.Schema,
               outcomes: Sequence[TaskOutcome]) -> BatchMetrics:
        """After the tasks: bind, then the batch's steps with the tasks' ``outcomes``."""
        sink = self.sink
        metrics = BatchMetrics(sink.sink_id, batch_id, Family.PREPARE_IN_TASK.value)
        started = time.monotonic()
        state = self._state(ticket)
        batch = SplitInput(schema, outcomes, sink_id=sink.sink_id)
        restarts = BatchRestarts(sink.outage, sink.sink_id, batch_id,
                                 target=sink.describe_target)

        def attempt() -> None:
            coordinator = self._coordinator(ticket.run_id, query_id, metrics)
            Executor(sink, state, metrics, batch).run(self._commit_steps(coordinator, batch_id))

        try:
            restarts.run(attempt, stopping=lambda: False,
                         on_restart=lambda n: metrics.extra.__setitem__("batch_restarts", n))
        except SimulatedCrash:  # a test's stand-in for this process dying: nothing runs on
            metrics.outcome = "failed"
            raise
        except BaseException:
            # Refused (bad input, another query, a replay of other rows, a batch id going
            # backwards) or failed for good: Spark does not call abort after a failed
            # commit, so what the tasks prepared is rolled back here (best effort: else
            # at the next planning).
            metrics.outcome = "failed"
            self._roll_back(ticket, batch_id)
            raise
        finally:
            metrics.extra["total_ms"] = (time.monotonic() - started) * 1000
            sink._close_batch(metrics, batch)  # the template's one closing
        return metrics

    @staticmethod
    def _commit_steps(coordinator: Coordinator, batch_id: int) -> Steps[None]:
        query_id = coordinator.query_id
        yield from coordinator.step(BindQuery(query_id, coordinator.reset_binding))
        yield from coordinator.open(batch_id, RunFacts(started=True, query_id=query_id,
                                                       swept=True))
        part = yield from coordinator.prepare(batch_id, swept=True)
        if part.done:  # a replay the ledger has: what the tasks wrote again is rolled back
            yield from coordinator.recovery.sweep()
        else:
            yield from coordinator.complete(part)
        yield from coordinator.step(Prune(coordinator.keep_batches))

    def _roll_back(self, ticket: RunTicket, batch_id: int) -> None:
        try:
            self.abort(ticket, batch_id)
        except Exception as exc:
            logger.warning("sink %s batch %d: rolling back after the commit step failed did "
                           "not finish (%s); the next planning does it", self.sink.sink_id,
                           batch_id, type(exc).__name__)

    def abort(self, ticket: RunTicket | None, batch_id: int) -> None:
        """Spark gave the batch up (a failed task, a stopped query): roll back this sink's
        undecided transactions now (a task still running may prepare later: the next
        planning, or ``connectors recover``, rolls that one back)."""
        state = (self._state(ticket) if ticket is not None
                 else DriverState(self.sink.create_ledger))
        metrics = BatchMetrics(self.sink.sink_id, batch_id, Family.PREPARE_IN_TASK.value)
        coordinator = self._coordinator(state.run_id, "", metrics)
        Executor(self.sink, state, metrics).run(coordinator.recovery.sweep())
        metrics.outcome = "aborted"
        logger.info("sink %s batch %d: aborted by Spark; %d transaction(s) rolled back",
                    self.sink.sink_id, batch_id, metrics.aborted)
