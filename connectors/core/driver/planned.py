"""A split batch: a PREPARE_IN_TASK batch planned in one process and committed in another.

Spark's Python data sources (the DataSource form, ``docs/datasource.md``) give a sink no
single driver call around a batch. Spark calls the source's ``streamWriter`` in a planning
worker before the batch's tasks (no batch id yet), the writer's ``write`` in each task, and
``commit(messages, batch_id)`` or ``abort`` in a commit worker: three processes. The
batch's steps stay the coordinator's (:mod:`connectors.core.protocol.coordinator`), cut
at the tasks:

- :meth:`SinkDriver.plan <connectors.core.driver.sink_driver.SinkDriver.plan>` (steps:
  :func:`planning`), before the tasks: open a run (a fencing epoch in the ledger),
  RECONCILING (finish decided batches, roll back every undecided transaction of the sink:
  nothing of it is in flight between two batches), then plan the input (the sink's checks
  of the schema). Returns the :class:`RunTicket` the tasks carry;
- the tasks prepare under the ticket's run (:func:`~connectors.core.templates.tasks.prepare_task`);
- :meth:`SinkDriver.commit <connectors.core.driver.sink_driver.SinkDriver.commit>` (steps:
  :func:`split_commit`), after them: take the run up (:meth:`Ledger.resume_run`), bind
  to the query, then the coordinator's batch with the tasks' outcomes: a replay the ledger
  has is checked and what the tasks wrote again is rolled back (the sweep); otherwise
  decide, commit, sweep;
- :meth:`SinkDriver.abort <connectors.core.driver.sink_driver.SinkDriver.abort>`: the sweep
  (the tasks' transactions are undecided).

A step that fails in the commit with a transient error runs again under the sink's
``outage_timeout``, with the same outcomes: the ledger, not the attempt, says
whether the batch was decided. The ledger's resources are the sink's (its connection, kept
by the engine adapter across batches of a worker).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import pyarrow as pa

from connectors.core.batch import BatchInput, TaskFunction, TaskOutcome
from connectors.core.errors import ConfigurationError, ProtocolStateError
from connectors.core.fingerprint import Fingerprint
from connectors.core.protocol.commands import (
    BindQuery,
    OpenRun,
    PlanInput,
    Prune,
    ResumeRun,
    RunToken,
)
from connectors.core.protocol.coordinator import Coordinator, RunFacts, Steps

__all__ = ["PLANNING", "RunTicket", "SplitInput", "planning", "split_abort", "split_commit"]

#: The batch id of the planning step's hooks (``begin_run``, ``plan_input``): Spark plans
#: the write before it names the batch to the sink.
PLANNING = -1


@dataclass(frozen=True)
class RunTicket:
    """The run a planning step opened, as its tasks and its commit worker see it."""

    run_id: str
    #: The ledger's :meth:`~connectors.core.ledgers.ledger.Ledger.run_token` (its fencing epoch).
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


def planning(coordinator: Coordinator) -> Steps[RunTicket]:
    """The planning worker's steps, before the tasks: open a run (a fencing epoch in the
    ledger), RECONCILING, then plan the input (the sink's checks of the schema). Returns
    the run's ticket."""
    yield from coordinator.step(OpenRun(coordinator.run_id, PLANNING))
    yield from coordinator.reconcile()
    yield from coordinator.step(PlanInput(PLANNING))
    token = yield from coordinator.step(RunToken())
    return RunTicket(coordinator.run_id, cast("str | None", token))


def split_commit(coordinator: Coordinator, ticket: RunTicket, batch_id: int) -> Steps[None]:
    """The commit worker's steps, after the tasks (their outcomes are the batch input's):
    take the ticket's run up, bind, then the batch; a replay the ledger has rolls back
    what the tasks wrote again."""
    query_id = coordinator.query_id
    yield from coordinator.step(ResumeRun(ticket.run_id, ticket.token))
    yield from coordinator.step(BindQuery(query_id, coordinator.binding))
    yield from coordinator.open(batch_id, RunFacts(started=True, query_id=query_id,
                                                   swept=True))
    part = yield from coordinator.prepare(batch_id, swept=True)
    if part.done:  # a replay the ledger has: what the tasks wrote again is rolled back
        yield from coordinator.recovery.sweep()
    else:
        yield from coordinator.complete(part)
    yield from coordinator.step(Prune(coordinator.keep_batches))


def split_abort(coordinator: Coordinator, ticket: RunTicket | None) -> Steps[None]:
    """Spark gave the batch up: take the ticket's run up (if the planning opened one),
    then the sweep (roll back the sink's undecided transactions)."""
    if ticket is not None:
        yield from coordinator.step(ResumeRun(ticket.run_id, ticket.token))
    yield from coordinator.recovery.sweep()
