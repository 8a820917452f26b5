"""The input of one batch, as the protocol sees it: partitions run as tasks.

The driver-side protocol never touches Spark directly: it asks a :class:`BatchInput` to
run a task function on every partition and to hand back what each task returned. The
Spark implementation (:mod:`connectors.spark.frames`) runs the function in
``mapInArrow``; :class:`connectors.testing.LocalBatch` runs it in-process with simulated
retries and speculative attempts, so every crash point is testable in milliseconds.
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from connectors.core.errors import ConnectorError
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers.ledger import TaskCommit

__all__ = ["BatchContext", "BatchInput", "TaskFunction", "TaskInfo", "TaskOutcome"]


@dataclass(frozen=True)
class BatchContext:
    """Who is writing a batch: given to driver-side hooks of ``DriverCommitSink``.

    ``generation`` counts the sink's query bindings (0 until ``reset_binding`` rebinds it
    to a new query); batch ids restart at 0 in each generation, so an idempotency key at
    the target must hold both: :attr:`app_id` and ``batch_id`` are such a key.
    """

    sink_id: str
    batch_id: int
    run_id: str
    generation: int = 0
    query_id: str | None = None
    #: On the driver, the batch being written (the hooks of ``DriverCommitSink`` read it
    #: there); never shipped to a task (dropped when pickled), never compared.
    batch: BatchInput | None = field(default=None, compare=False, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["batch"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, value)

    @property
    def app_id(self) -> str:
        """Stable per sink and generation, e.g. Delta's ``txnAppId``."""
        return self.sink_id if self.generation == 0 else f"{self.sink_id}.g{self.generation}"


class TaskBarrier(Protocol):
    """The engine's barrier among the tasks of one barrier stage (Spark's
    ``BarrierTaskContext``), as a task of that stage sees it."""

    def tasks(self) -> int:
        """How many tasks this attempt of the stage runs (an engine may resubmit only
        some partitions of a failed stage)."""

    def all_gather(self, message: str) -> list[str]:
        """Wait for every task of the stage attempt; return their messages in order."""


@dataclass(frozen=True)
class TaskInfo:
    """Who a task attempt is (from Spark's ``TaskContext``); ``barrier``: the stage's
    barrier when the task runs in one (``run_tasks(..., barrier=True)`` on an engine that
    offers it), else ``None``."""

    partition: int
    attempt_number: int
    task_attempt_id: int
    barrier: TaskBarrier | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class TaskOutcome:
    """What a task returns: its commit, or a deterministic error; and its figures.

    Errors that retrying the task cannot mend (bad input, a non-deterministic replay) are
    returned rather than raised: Spark would retry the task, then hand the driver a
    ``PythonException`` holding only the traceback text. Returned, the driver re-raises the
    library's own error and aborts the batch's other transactions.

    ``figures``: what the task measured, as numbers by name (a slot's transaction time, its
    rows per write path; empty when it has none). They travel beside the commit, never in
    it: the commit is what the ledger stores, the figures reach the driver with this
    outcome and are never stored. For a batch's tasks the driver gathers them into
    :attr:`BatchMetrics.task_figures <connectors.core.metrics.BatchMetrics.task_figures>`,
    which the sink's ``report_metrics`` summarises; in a job a sink runs for itself (Kafka's
    record check) the sink reads them from the outcomes it gets back.
    """

    commit: TaskCommit | None = None
    error: ConnectorError | None = None
    figures: Mapping[str, float] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return pickle.dumps(self)

    @staticmethod
    def from_bytes(data: bytes) -> TaskOutcome:
        outcome = pickle.loads(data)  # noqa: S301 - written by our own tasks
        if not isinstance(outcome, TaskOutcome):
            raise TypeError("not a TaskOutcome")
        return outcome


#: A task: gets its identity and its partition's record batches, returns its outcome.
TaskFunction = Callable[[TaskInfo, Iterator[pa.RecordBatch]], TaskOutcome]


class BatchInput(ABC):
    """One batch's rows, split into partitions that run as tasks."""

    @property
    @abstractmethod
    def schema(self) -> pa.Schema:
        """The Arrow schema of the rows."""

    @abstractmethod
    def run_tasks(self, fn: TaskFunction, *, barrier: bool = False) -> list[TaskOutcome]:
        """Run ``fn`` on every partition; return one outcome per partition.

        Only the outcome of the attempt that the engine accepted is returned for each
        partition; other attempts (failed, speculative) may have run and left
        transactions behind. With ``barrier``, all tasks start together (Spark's barrier
        execution mode).
        """

    @abstractmethod
    def slotted(self, slots: int, columns: list[str] | None = None, *,
                key: str | None = None, local_rows: int = 0) -> BatchInput:
        """The same rows in ``slots`` partitions, placed by a hash of their content (or of
        ``columns``).

        ``key``: the name of a column; rows where it is not null are placed by a hash of
        that column alone, so every row of a key lands in one slot, and the rows of each
        input partition keep their relative order within their slot.

        Deterministic: a replay of the same rows puts every row in the same slot, however
        the source partitioned them.

        ``local_rows`` (> 0): the task function may run in the calling process (thread-safe,
        its side effects the same wherever it runs), and an engine may run the slots of a
        batch of at most that many rows here instead of as tasks, each row in the same slot
        and each slot's rows in input order (an optimisation: the result must not differ).
        """

    @abstractmethod
    def fingerprint(self) -> Fingerprint:
        """The fingerprint of every row (runs a job over the batch)."""

    @abstractmethod
    def to_arrow(self) -> pa.Table:
        """Every row on the driver (for small batches and tests)."""

    def run_figures(self) -> dict[str, float]:
        """Figures of the last :meth:`run_tasks` for the batch's metrics (where its tasks
        ran, for example); default none."""
        return {}

    def estimated_partitions(self) -> int | None:
        """The number of tasks :meth:`run_tasks` will start, if known cheaply."""
        return None

    # Capabilities an engine front end may offer. A sink asks for them here, never for the
    # input's concrete type: a front end that lacks one keeps the default ("not offered").
    # Spark-only ones (the DataFrame, a derived input, the Arrow hand-over) are declared by
    # the adapter's own type, connectors.spark.inputs.SparkInput.

    def task_slots(self) -> int | None:
        """How many tasks the engine runs at once (``None``: unknown)."""
        return None

    def barrier_refusal(self) -> str | None:
        """Why the engine would refuse a barrier stage now (``None``: it would not). A
        barrier run of :meth:`run_tasks` that fails is retried by the engine as a whole,
        where the engine can (Spark: as a shuffle-map stage)."""
        return None

    def stop_requested(self, query_id: str | None) -> bool:
        """Whether a graceful stop of query ``query_id`` was requested (asked at the start
        of every streaming batch, before any side effect). Default: a request made in this
        process (:mod:`connectors.core.policies.stopping`); an engine whose sink runs away from the
        program that asks for the stop (Spark Connect) also reads its own channel."""
        from connectors.core.policies.stopping import stop_requested

        return stop_requested(query_id)

    def await_tasks_ended(self) -> None:  # noqa: B027 - optional
        """After :meth:`run_tasks` raised (the batch was interrupted: a stopped query, a
        cancelled job): wait, briefly and bounded, until no task of the batch still runs,
        so that the roll-back that follows sees every transaction a task could still
        prepare. Default: nothing (tasks ran in-process and are over)."""

    def tasks_ended(self) -> bool:
        """After :meth:`run_tasks` returned: has every attempt of the batch's tasks ended
        (failed attempts, speculative copies the engine is killing)? Asked without
        waiting; ``False`` when the engine cannot tell. Default: ``True`` (tasks ran
        in-process and are over)."""
        return True

    def publish_metrics(self, metrics: dict[str, object]) -> None:  # noqa: B027 - optional
        """After every batch (a failed one too): hand the batch's metrics
        (``BatchMetrics.as_dict()``) to the engine, where the program that started the
        query can read them when the sink runs elsewhere (Spark Connect: in a worker next
        to the server). Default: nothing (``sink.last_metrics`` is the caller's)."""
