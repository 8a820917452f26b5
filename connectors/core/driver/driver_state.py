"""What one driver run of a sink holds (:class:`DriverState`), and the loop that drives a
program's commands (:func:`run_steps`)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from connectors.core.batch import BatchContext, BatchInput
from connectors.core.ledgers.ledger import Ledger
from connectors.core.naming import new_run_id
from connectors.core.protocol.commands import Command
from connectors.core.protocol.runs import RunFacts

__all__ = ["DriverState", "run_steps"]


@dataclass
class DriverState:
    """What one driver run of a sink holds: its ledger, run id and query binding.

    The ledger is opened by ``open_ledger`` on first use, which is the first run's start
    (:class:`~connectors.core.protocol.commands.OpenRun`, after the sink's ``begin_run``), and kept
    for the driver's later runs."""

    open_ledger: Callable[[], Ledger]
    run_id: str = field(default_factory=new_run_id)
    query_id: str | None = None
    generation: int = 0
    started: bool = False
    #: The run's last batch closed with a sweep after all its tasks ended (RunFacts).
    swept: bool = False
    _ledger: Ledger | None = field(default=None, repr=False)

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            self._ledger = self.open_ledger()
        return self._ledger

    def close(self) -> None:
        """Release the ledger's resources, if it was opened."""
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None

    def context(self, sink_id: str, batch_id: int, batch: BatchInput | None = None
                ) -> BatchContext:
        return BatchContext(sink_id, batch_id, self.run_id, self.generation, self.query_id,
                            batch=batch)

    def facts(self) -> RunFacts:
        """What the coordinator decides the run's start from."""
        return RunFacts(self.started, self.query_id, self.swept)

    def new_run(self) -> None:
        """Start a new run: new run id, and reconcile again before the next batch."""
        self.run_id = new_run_id()
        self.started = False
        self.swept = False


def run_steps(steps: Generator[Command, Any, Any], perform: Callable[[Command], Any]) -> Any:
    """Drive ``steps`` to its end: perform each command, send back its result (or throw
    its exception in); return what ``steps`` returns."""
    result: Any = None
    error: BaseException | None = None
    while True:
        try:
            command = steps.throw(error) if error is not None else steps.send(result)
        except StopIteration as stop:
            return stop.value
        error = None
        try:
            result = perform(command)
        except BaseException as exc:
            result, error = None, exc
