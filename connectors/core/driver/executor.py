"""The executor: performs a program's commands against the ledger, the engine and the
sink's hooks.

This is where every protocol step becomes I/O, and the only place that does (with its
performers, :mod:`connectors.core.driver.performers`): the order of the steps is the
program's (:mod:`connectors.core.protocol.coordinator`,
:mod:`connectors.core.protocol.fanout_program`). A command's type is looked up in one
table and performed by one method; the I/O concerns live there:
retries of transient failures (counted in the metrics), the re-read after an ambiguous
decision write, timings, the task functions the engine runs, and crash points (a
:class:`~connectors.core.protocol.commands.Crash` command calls
:func:`~connectors.core.protocol.crash.crash_point`).

An exception a command raises is thrown into the program at the step that yielded it, so
the program decides what follows (e.g. fence every slot when the tasks failed), as
psycopg's generators receive their I/O errors.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from connectors.core.batch import BatchInput
from connectors.core.driver.driver_state import DriverState, run_steps
from connectors.core.driver.execution import Execution
from connectors.core.driver.performers import (
    HookPerformer,
    LedgerPerformer,
    Performers,
    TaskPerformer,
)
from connectors.core.errors import ConnectorError
from connectors.core.metrics import BatchMetrics
from connectors.core.policies.retry import RetryPolicy
from connectors.core.protocol.commands import Command, ForTarget, TargetFinished

if TYPE_CHECKING:  # the hooks' one declaration; the template imports the driver to run
    from connectors.core.templates.template import TwoPhaseCommitSink

__all__ = ["Executor"]


class Executor:
    """Performs commands for one sink and one batch (see the module docstring).

    Built only by :class:`~connectors.core.driver.sink_driver.SinkDriver`. A fan-out's executor
    performs the fan-out's own commands (``sink_id``, ``retry`` and ``state`` are the
    fan-out's; ``sink`` is its first target, whose ``begin_run`` opens a run, since the
    decisions' ledger may be of its kind) and routes
    :class:`~connectors.core.protocol.commands.ForTarget` to ``targets`` (by sink id); ``pool``
    runs a target's checks beside the other targets' work; ``finished(sink_id)`` closes a
    target's figures.
    """

    def __init__(
        self,
        sink: TwoPhaseCommitSink,
        state: DriverState,
        metrics: BatchMetrics,
        batch: BatchInput | None = None,
        *,
        sink_id: str | None = None,
        retry: RetryPolicy | None = None,
        targets: Mapping[str, Executor] | None = None,
        pool: ThreadPoolExecutor | None = None,
        finished: Callable[[str], None] | None = None,
    ) -> None:
        self.execution = Execution(sink, state, metrics, batch, sink_id=sink_id or sink.sink_id,
                                   retry=retry or sink.retry, pool=pool)
        self.targets = dict(targets or {})
        self.finished = finished
        self._table: Performers = {
            **LedgerPerformer(self.execution).table(),
            **HookPerformer(self.execution).table(),
            **TaskPerformer(self.execution).table(),
            ForTarget: self._for_target,
            TargetFinished: self._target_finished,
        }

    def run(self, steps: Generator[Command, Any, Any]) -> Any:
        """Drive ``steps`` to its end; what it returns."""
        return run_steps(steps, self.perform)

    def perform(self, command: Command) -> Any:
        """Perform one command; its result."""
        performer = self._table.get(type(command))
        if performer is None:
            raise TypeError(f"not a protocol command: {command!r}")
        return performer(command)

    # ---- a fan-out's routing ----
    def _for_target(self, command: ForTarget) -> Any:
        try:
            return self.targets[command.sink_id].perform(command.command)
        except ConnectorError as exc:
            if exc.sink_id is None:
                exc.sink_id = command.sink_id
            raise

    def _target_finished(self, command: TargetFinished) -> None:
        if self.finished is not None:
            self.finished(command.sink_id)
