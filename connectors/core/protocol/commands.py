"""The commands a :class:`~connectors.core.protocol.coordinator.Coordinator` yields.

Each names one protocol step; an executor performs it and sends back the result named in
its docstring. Commands are plain data: they can be logged, compared and replayed by a test
without any I/O.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

from connectors.core.ledgers.ledger import LedgerEntry, TaskCommit
from connectors.core.policies.binding import BOUND, Binding
from connectors.core.protocol.transactions import SlotPlan
from connectors.core.states import CrashPoint

__all__ = [
    "Abort",
    "AdoptDecision",
    "AwaitChecks",
    "BindQuery",
    "CheckInput",
    "Command",
    "Commit",
    "CommitBatch",
    "CommittedFingerprint",
    "Crash",
    "Decide",
    "FenceAll",
    "ForTarget",
    "ForbidDecision",
    "InputFingerprint",
    "LastBatchId",
    "ListPrepared",
    "MarkCommitted",
    "NewRun",
    "NoteSwept",
    "OpenRun",
    "PlanInput",
    "PlanSlots",
    "Prune",
    "ReadDecision",
    "ReadUnfinished",
    "RecordIntent",
    "RecordSlots",
    "ResumeRun",
    "RunTasks",
    "RunToken",
    "TargetFinished",
    "TargetHasBatch",
    "TasksEnded",
]


@dataclass(frozen=True)
class Command:
    """Base of every command."""


# ---- reads ----
@dataclass(frozen=True)
class ReadDecision(Command):
    """The ledger's entry for ``batch_id`` -> ``LedgerEntry | None``."""

    batch_id: int


@dataclass(frozen=True)
class ReadUnfinished(Command):
    """The ledger's decided, not yet committed entries -> ``list[LedgerEntry]``."""


@dataclass(frozen=True)
class LastBatchId(Command):
    """The highest batch id the ledger records -> ``int | None``."""


@dataclass(frozen=True)
class ListPrepared(Command):
    """Ids of the sink's transactions prepared right now (``sink.list_prepared()``) ->
    ``list[str]``."""


@dataclass(frozen=True)
class InputFingerprint(Command):
    """The fingerprint of the batch's input -> ``Fingerprint | None`` (``None``: not
    checked)."""


@dataclass(frozen=True)
class CommittedFingerprint(Command):
    """COMMIT_ON_DRIVER: the fingerprint of what the target holds for the batch ->
    ``Fingerprint | None``."""

    batch_id: int


@dataclass(frozen=True)
class TargetHasBatch(Command):
    """COMMIT_ON_DRIVER: does the target itself record the batch committed -> ``bool``."""

    batch_id: int


# ---- the run and the query ----
@dataclass(frozen=True)
class OpenRun(Command):
    """Start the driver run with batch ``batch_id``: the sink's ``begin_run``, then the
    ledger (opened at the driver's first run) registers it (a lease, where the ledger has
    one) -> ``None``."""

    run_id: str
    batch_id: int


@dataclass(frozen=True)
class RunToken(Command):
    """What the run's start established that another process of the run needs (the
    ledger's ``run_token``, e.g. its fencing epoch) -> ``str | None``."""


@dataclass(frozen=True)
class ResumeRun(Command):
    """Take up run ``run_id``, opened in another process with ``token``, instead of
    opening a new one (the DataSource form's commit worker) -> ``None``."""

    run_id: str
    token: str | None


@dataclass(frozen=True)
class BindQuery(Command):
    """Bind the sink to its query (refusing another one unless ``binding`` resets it or
    resumes it from a savepoint) -> the binding's generation, ``int``."""

    query_id: str
    binding: Binding = BOUND


@dataclass(frozen=True)
class FenceAll(Command):
    """COMMIT_IN_TASK: fence every slot, so no transaction of a dead run stays open ->
    how many were fenced, ``int``."""


@dataclass(frozen=True)
class NewRun(Command):
    """End this driver run after a failed step: the next batch starts a new run (a new
    run id, RECONCILING again), so this run's leftovers may be swept and aborted in the
    ledger without fencing the retry -> ``None``."""


@dataclass(frozen=True)
class NoteSwept(Command):
    """Remember for the run's next batch whether this batch closed with a sweep after every
    task of it had ended (``swept``; see
    :class:`~connectors.core.protocol.coordinator.RunFacts`) -> ``None``."""

    swept: bool


# ---- the batch ----
@dataclass(frozen=True)
class PlanSlots(Command):
    """COMMIT_IN_TASK: the batch's slots (the sink's ``plan_slots``: the recorded count and
    placement, kept while a batch some slots committed is unfinished) -> ``SlotPlan``."""

    batch_id: int


@dataclass(frozen=True)
class RecordSlots(Command):
    """COMMIT_IN_TASK: record the batch's slots before any of its tasks runs (the sink's
    ``record_slots``: a changed count or placement in the ledger, the slots' marker
    partitions) -> ``None``."""

    batch_id: int
    plan: SlotPlan


@dataclass(frozen=True)
class PlanInput(Command):
    """Validate the input and split it into tasks (the sink's ``plan_input``) -> the
    number of tasks the protocol expects (COMMIT_IN_TASK: its slots), ``int | None``."""

    batch_id: int


@dataclass(frozen=True)
class RunTasks(Command):
    """Run the family's task on every partition -> one ``TaskOutcome`` per partition."""

    batch_id: int


@dataclass(frozen=True)
class TasksEnded(Command):
    """Has every attempt of the batch's tasks ended (retries and speculative copies
    included; ``False`` when the engine cannot tell) -> ``bool``."""

    batch_id: int


@dataclass(frozen=True)
class RecordIntent(Command):
    """COMMIT_ON_DRIVER: record in the ledger that this run is about to commit the batch
    (the sink's ``record_intent``; a no-op for sinks that need none), so that a crash
    after it is settled from the target -> ``None``."""

    batch_id: int


@dataclass(frozen=True)
class CommitBatch(Command):
    """COMMIT_ON_DRIVER: write and commit the whole batch, idempotently ->
    ``Fingerprint | None`` (the fingerprint the write observed)."""

    batch_id: int


# ---- decisions and their transactions ----
@dataclass(frozen=True)
class Decide(Command):
    """Record ``entry`` in the ledger, first writer wins -> the recorded
    ``LedgerEntry`` (another run's, if it decided first)."""

    entry: LedgerEntry


@dataclass(frozen=True)
class AdoptDecision(Command):
    """PREPARE_IN_TASK, at a run's start: record ``entry``, this sink's part of a decision a
    fan-out made durable in its own ledger (by an earlier run), as the sink's decision ->
    the recorded ``LedgerEntry`` (the sink's own, if it has one already)."""

    entry: LedgerEntry


@dataclass(frozen=True)
class ForbidDecision(Command):
    """Record that run ``run_id`` may never decide ``batch_id`` -> the batch's decision if
    there already is one, ``LedgerEntry | None``."""

    batch_id: int
    run_id: str


@dataclass(frozen=True)
class Commit(Command):
    """Commit one decided transaction (idempotent) -> ``None``."""

    batch_id: int
    commit: TaskCommit


@dataclass(frozen=True)
class Abort(Command):
    """Roll back one undecided transaction -> ``None``. ``quiet``: after a failed batch,
    a failure is logged and left to the next sweep."""

    batch_id: int
    transaction_id: str
    quiet: bool = False


@dataclass(frozen=True)
class MarkCommitted(Command):
    """Record the decided batch as committed -> ``None``."""

    batch_id: int


@dataclass(frozen=True)
class Prune(Command):
    """Drop all but the newest ``keep`` decisions from the ledger -> ``None``."""

    keep: int


@dataclass(frozen=True)
class Crash(Command):
    """A crash point: the executor calls ``crash_point`` -> ``None``."""

    point: CrashPoint
    batch_id: int


# ---- a fan-out's program (connectors.core.protocol.fanout_program) ----
@dataclass(frozen=True)
class ForTarget(Command):
    """``command`` of the fan-out's target ``sink_id``, already passed by that target's
    guard: performed by the target's executor -> ``command``'s result. An error that
    names no sink names the target."""

    sink_id: str
    command: Command


@dataclass(frozen=True)
class CheckInput(Command):
    """A fan-out's target that commits after the decision: start its checks of what it
    would refuse only while committing (``check_input``), beside the other targets'
    work -> a ``Future`` of their end (see :class:`AwaitChecks`)."""

    batch_id: int


@dataclass(frozen=True, eq=False)
class AwaitChecks(Command):
    """Wait for the targets' checks started by :class:`CheckInput`; the first failure is
    raised -> ``None``."""

    checks: tuple[Future[None], ...]


@dataclass(frozen=True)
class TargetFinished(Command):
    """The fan-out's target ``sink_id`` has its part of the batch (or the batch ended):
    its figures are final and are closed now, once -> ``None``."""

    sink_id: str
