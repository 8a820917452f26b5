"""The commit protocol of one batch, as a pure state machine: no Spark, no I/O.

Three protocol families, because not every target can be prepared in a task and committed
by the driver:

=====================  ==========================================  =========================
family                 who commits, and how a replay stays exact   example
=====================  ==========================================  =========================
``PREPARE_IN_TASK``    tasks prepare, the driver records a         PostgreSQL (XA-style
                       decision and commits the prepared           prepared transactions)
                       transactions (Flink's two-phase commit)
``COMMIT_IN_TASK``     each slot's task commits its own            Kafka (a transaction
                       transaction with a replay marker; a replay  cannot outlive its
                       finds the marker and writes nothing         producer)
``COMMIT_ON_DRIVER``   the driver commits the whole batch once,    Delta Lake (txnAppId /
                       idempotently keyed by the batch id          txnVersion)
=====================  ==========================================  =========================

States of a batch (logs name them): ``OPEN -> PREPARED -> DECIDED -> COMMITTED``, or
``ABORTED`` before a decision. A driver that settles what an earlier run left is
``RECONCILING``. :class:`BatchProtocol` refuses any other transition with an error that
names it. The guard (:mod:`connectors.core.protocol.guard`) keeps one per batch and advances it from
the results of the coordinator's commands; what stops an illegal *side effect* (a commit
before a durable decision, say) is the same guard's check of every command before it is
performed.

Crash points are named places in the protocol where tests kill the process (see
:mod:`connectors.core.protocol.crash`); :data:`CRASH_POINTS` lists which apply to each family.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from connectors.core.errors import ProtocolStateError

__all__ = [
    "CRASH_POINTS",
    "BatchProtocol",
    "BatchState",
    "CrashPoint",
    "Family",
    "Side",
]


class Family(enum.Enum):
    """How a target commits; see the module docstring."""

    PREPARE_IN_TASK = "prepare_in_task"
    COMMIT_IN_TASK = "commit_in_task"
    COMMIT_ON_DRIVER = "commit_on_driver"


class BatchState(enum.Enum):
    """The state of one batch: ``OPEN -> PREPARED -> DECIDED -> COMMITTED``, or ``ABORTED``
    before a decision (see the module docstring and :class:`BatchProtocol`)."""

    OPEN = "OPEN"
    PREPARED = "PREPARED"
    DECIDED = "DECIDED"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"


class Side(enum.Enum):
    DRIVER = "driver"
    TASK = "task"


class CrashPoint(enum.Enum):
    """Named places where a test may kill the process.

    The value is the name used in ``CONNECTORS_CRASH_AT``.
    """

    #: driver: the batch has begun (recovery, replay check and sweep done, its input
    #: checked and split), before any task or write job starts
    BEFORE_TASKS = "before_tasks"
    #: task: rows written, before flush + prepare (or the slot's in-task commit)
    BEFORE_PRECOMMIT = "before_precommit"
    #: task: prepared (or committed in the task), before the result reaches the driver
    AFTER_PRECOMMIT = "after_precommit"
    #: driver: every task result collected, nothing decided
    BEFORE_DECISION = "before_decision"
    #: driver: the decision is durable (COMMIT_ON_DRIVER: the target's own commit is
    #: done), nothing else committed or recorded
    AFTER_DECISION = "after_decision"
    #: driver: the first participant committed, the others not yet
    BETWEEN_COMMITS = "between_commits"
    #: driver: everything committed and recorded, before returning to Spark (so Spark's
    #: commit log does not have the batch and replays it)
    AFTER_COMMIT = "after_commit"

    @property
    def side(self) -> Side:
        return (
            Side.TASK
            if self in (CrashPoint.BEFORE_PRECOMMIT, CrashPoint.AFTER_PRECOMMIT)
            else Side.DRIVER
        )


CRASH_POINTS: Mapping[Family, tuple[CrashPoint, ...]] = {
    Family.PREPARE_IN_TASK: (
        CrashPoint.BEFORE_TASKS,
        CrashPoint.BEFORE_PRECOMMIT,
        CrashPoint.AFTER_PRECOMMIT,
        CrashPoint.BEFORE_DECISION,
        CrashPoint.AFTER_DECISION,
        CrashPoint.BETWEEN_COMMITS,
        CrashPoint.AFTER_COMMIT,
    ),
    Family.COMMIT_IN_TASK: (
        CrashPoint.BEFORE_TASKS,
        CrashPoint.BEFORE_PRECOMMIT,
        CrashPoint.AFTER_PRECOMMIT,
        CrashPoint.BEFORE_DECISION,
        CrashPoint.AFTER_COMMIT,
    ),
    Family.COMMIT_ON_DRIVER: (
        CrashPoint.BEFORE_TASKS,
        CrashPoint.BEFORE_DECISION,
        CrashPoint.AFTER_DECISION,
        CrashPoint.AFTER_COMMIT,
    ),
}

_S = BatchState
# For COMMIT_IN_TASK the tasks' commits are the PREPARED step (each slot is durable and
# marked), and the ledger record that all slots are done is the decision and the commit
# at once: PREPARED -> COMMITTED. For
# COMMIT_ON_DRIVER the target's idempotent commit is the decision itself.
_TRANSITIONS: Mapping[Family, Mapping[BatchState, frozenset[BatchState]]] = {
    Family.PREPARE_IN_TASK: {
        _S.OPEN: frozenset({_S.PREPARED, _S.ABORTED}),
        _S.PREPARED: frozenset({_S.DECIDED, _S.ABORTED}),
        _S.DECIDED: frozenset({_S.COMMITTED}),
    },
    Family.COMMIT_IN_TASK: {
        _S.OPEN: frozenset({_S.PREPARED, _S.ABORTED}),
        _S.PREPARED: frozenset({_S.COMMITTED}),
    },
    Family.COMMIT_ON_DRIVER: {
        _S.OPEN: frozenset({_S.DECIDED, _S.ABORTED}),
        _S.DECIDED: frozenset({_S.COMMITTED}),
    },
}

_WHY = {
    (_S.PREPARED, _S.COMMITTED): "a batch must be DECIDED (durably) before anything commits",
    (_S.OPEN, _S.COMMITTED): "a batch must be prepared and DECIDED before anything commits",
    (_S.OPEN, _S.DECIDED): "every task must have prepared before the decision",
    (_S.DECIDED, _S.ABORTED): "a DECIDED batch must be committed, never rolled back",
}


class BatchProtocol:
    """The state of one batch of one sink; every change goes through :meth:`advance`.

    Example::

        >>> p = BatchProtocol(Family.PREPARE_IN_TASK, "events", 7)
        >>> p.advance(BatchState.PREPARED); p.advance(BatchState.DECIDED)
        >>> p.advance(BatchState.COMMITTED); p.state
        <BatchState.COMMITTED: 'COMMITTED'>
    """

    __slots__ = ("batch_id", "family", "history", "sink_id", "state")

    def __init__(
        self,
        family: Family,
        sink_id: str,
        batch_id: int,
        state: BatchState = BatchState.OPEN,
    ) -> None:
        self.family = family
        self.sink_id = sink_id
        self.batch_id = batch_id
        self.state = state
        self.history: list[BatchState] = [state]

    def can_advance(self, to: BatchState) -> bool:
        return to in _TRANSITIONS[self.family].get(self.state, frozenset())

    def advance(self, to: BatchState) -> None:
        """Move to ``to``; raise :class:`ProtocolStateError` naming an illegal transition."""
        if not self.can_advance(to):
            why = _WHY.get((self.state, to), "not a transition of this protocol family")
            raise ProtocolStateError(
                f"illegal transition {self.state.value} -> {to.value} "
                f"({self.family.value}): {why}",
                sink_id=self.sink_id,
                batch_id=self.batch_id,
            )
        self.state = to
        self.history.append(to)

    @property
    def finished(self) -> bool:
        return self.state in (BatchState.COMMITTED, BatchState.ABORTED)

    def __repr__(self) -> str:
        return (
            f"BatchProtocol({self.family.value}, sink_id={self.sink_id!r}, "
            f"batch_id={self.batch_id}, state={self.state.value})"
        )
