"""The ledger: the durable record of what a sink decided and committed.

The ledger answers "is batch N of sink S decided / committed?" so that a replayed batch is
finished rather than rewritten, holds the sink's binding to one streaming query, and is
where deciding and aborting are serialized: the decision for a batch is the *commit point*
of the two-phase protocol (presumed abort: no decision, no commit).

Each target keeps its ledger where its data lives (a PostgreSQL table, a compacted Kafka
topic, a Delta table's transaction log, a directory); they all implement :class:`Ledger`.
Implementations must make :meth:`Ledger.decide`, :meth:`Ledger.forbid_decision` and
:meth:`Ledger.bind_query` atomic against each other across processes.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from connectors.core.errors import ProtocolStateError, QueryBindingError
from connectors.core.fingerprint import Fingerprint
from connectors.core.states import BatchState

__all__ = [
    "BATCH_JOB_QUERY_ID",
    "Ledger",
    "LedgerEntry",
    "Lineage",
    "TaskCommit",
    "check_binding",
    "lineage_chain",
]

#: The query id a sink is bound to when it is called from a batch job (no streaming query).
BATCH_JOB_QUERY_ID = "batch-job"
#: The stored format of a task commit (and of a ledger entry). 2: no ``payload`` (format 1
#: carried one, base64; it is ignored when read: the task's figures now travel beside the
#: commit, in :class:`~connectors.core.batch.TaskOutcome`, never into a ledger).
_COMMIT_FORMAT = 2
#: The formats :meth:`TaskCommit.from_json` reads: ledgers written by earlier releases too.
_READABLE_COMMIT_FORMATS = (1, 2)


@dataclass(frozen=True)
class TaskCommit:
    """What one task sends to the driver: its transaction and the rows it holds.

    This is the *committable* (Flink's term): exactly what the driver's commit and a later
    run's recovery need, and nothing else. It is small, immutable and serialized with a
    format version, because it is stored in ledgers and read by later releases. What a
    task measured (its figures) travels beside it, in
    :attr:`TaskOutcome.figures <connectors.core.batch.TaskOutcome.figures>`, and is never
    stored.

    Attributes:
        transaction_id: the participant transaction (see :class:`~.naming.TransactionId`)
            or, for slot-based sinks, the slot's name.
        partition: the Spark partition (slot) the task wrote.
        task_attempt_id: Spark's application-unique id of the winning attempt.
        fingerprint: row count and order-independent digest of the task's rows.
        nbytes: Arrow bytes the task wrote (metrics).
        replayed: the task found its slot already committed and wrote nothing.
    """

    transaction_id: str
    partition: int
    task_attempt_id: int
    fingerprint: Fingerprint
    nbytes: int = 0
    replayed: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "v": _COMMIT_FORMAT,
            "txn": self.transaction_id,
            "partition": self.partition,
            "attempt": self.task_attempt_id,
            "fp": self.fingerprint.to_json(),
            "nbytes": self.nbytes,
            "replayed": self.replayed,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskCommit:
        """A stored task commit: this release's format, or format 1 (earlier releases'
        ledgers; its ``payload`` is ignored: nothing commits or recovers by it). A format
        this release does not know is refused."""
        version = data.get("v")
        if version not in _READABLE_COMMIT_FORMATS:
            raise ProtocolStateError(
                f"task commit format {version!r} is not supported by this release "
                f"(expected one of {list(_READABLE_COMMIT_FORMATS)}); upgrade connectors"
            )
        return cls(
            transaction_id=str(data["txn"]),
            partition=int(data["partition"]),
            task_attempt_id=int(data["attempt"]),
            fingerprint=Fingerprint.from_json(data["fp"]),
            nbytes=int(data.get("nbytes", 0)),
            replayed=bool(data.get("replayed", False)),
        )


@dataclass(frozen=True)
class LedgerEntry:
    """The decision (and then the outcome) for one batch of one sink."""

    sink_id: str
    batch_id: int
    run_id: str
    state: BatchState
    commits: tuple[TaskCommit, ...] = ()
    fingerprint: Fingerprint | None = None
    query_id: str | None = None
    decided_at: float = field(default_factory=time.time)

    def committed(self) -> LedgerEntry:
        return replace(self, state=BatchState.COMMITTED)

    def to_json(self) -> dict[str, Any]:
        return {
            "v": _COMMIT_FORMAT,
            "sink_id": self.sink_id,
            "batch_id": self.batch_id,
            "run_id": self.run_id,
            "state": self.state.value,
            "commits": [c.to_json() for c in self.commits],
            "fp": self.fingerprint.to_json() if self.fingerprint else None,
            "query_id": self.query_id,
            "decided_at": self.decided_at,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LedgerEntry:
        return cls(
            sink_id=str(data["sink_id"]),
            batch_id=int(data["batch_id"]),
            run_id=str(data["run_id"]),
            state=BatchState(data["state"]),
            commits=tuple(TaskCommit.from_json(c) for c in data["commits"]),
            fingerprint=Fingerprint.from_json(data["fp"]) if data.get("fp") else None,
            query_id=data.get("query_id"),
            decided_at=float(data.get("decided_at", 0.0)),
        )


@dataclass(frozen=True)
class Lineage:
    """One link of a sink's lineage: query ``query_id`` took the sink over from the
    savepoint of query ``from_query_id`` at batch ``batch_id`` (``resume_from``).

    ``taken_at``: when the savepoint was taken; ``resumed_at``: when the new query took
    the sink over (seconds since the epoch)."""

    query_id: str
    from_query_id: str
    batch_id: int
    taken_at: float
    resumed_at: float

    def to_json(self) -> dict[str, Any]:
        return {"query_id": self.query_id, "from_query_id": self.from_query_id,
                "batch_id": self.batch_id, "taken_at": self.taken_at,
                "resumed_at": self.resumed_at}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Lineage:
        return cls(str(data["query_id"]), str(data["from_query_id"]), int(data["batch_id"]),
                   float(data.get("taken_at", 0.0)), float(data.get("resumed_at", 0.0)))


def lineage_chain(links: Sequence[Lineage], bound: str | None) -> list[Lineage]:
    """The links that lead to the query ``bound``, oldest first: from ``bound`` back
    through each query's savepoint to the first query (a link recorded for a query that
    never took the sink over, a resume refused later, is no part of it)."""
    by_query = {link.query_id: link for link in links}
    chain: list[Lineage] = []
    current = bound
    while current is not None and current in by_query and len(chain) < len(by_query):
        link = by_query[current]
        chain.append(link)
        current = link.from_query_id
    return chain[::-1]


class Ledger(ABC):
    """Durable decisions of one sink. Called on the driver only.

    Connector authors implement it next to their target; the template calls it. Every
    method may raise :class:`~connectors.core.errors.TransientError` for a failure worth
    retrying.
    """

    sink_id: str

    def open_run(self, run_id: str) -> None:  # noqa: B027 - optional hook
        """Called when a driver run starts, before it reconciles (optional).

        A ledger shared by several processes can fence older drivers here, e.g. by bumping
        an epoch that :meth:`decide` and :meth:`forbid_decision` check.
        """

    def run_token(self) -> str | None:
        """What :meth:`open_run` established that another process of the same run needs
        to decide (the fencing epoch, say), as text; ``None`` (the default): nothing.

        The DataSource form opens a run where Spark plans a batch and decides it in
        another process Spark starts to commit it, which takes the run up with
        :meth:`resume_run`."""
        return None

    def resume_run(self, run_id: str, token: str | None) -> None:  # noqa: B027 - optional
        """Take up run ``run_id``, which :meth:`open_run` opened in another process and
        whose :meth:`run_token` was ``token``, instead of opening a new one (no new epoch:
        a run opened since still fences it). Default: nothing."""

    @abstractmethod
    def bound_query(self) -> str | None:
        """The query id the sink is bound to, or ``None`` before its first batch."""

    @abstractmethod
    def bind_query(self, query_id: str, *, reset: bool = False) -> int:
        """Bind the sink to ``query_id`` durably (atomic against other callers).

        Called by the template on the first batch of every driver run. A sink bound to
        another query raises :class:`QueryBindingError`, unless ``reset`` is true: then
        every retained entry is forgotten and the sink is bound to ``query_id``.
        Implementations may use :func:`check_binding` for the rule.

        Returns the binding's *generation*: 0 for the first binding, one more at every
        reset. Target-side idempotency keys (slot markers, Delta ``txnAppId``) include it,
        because batch ids restart at 0 after a reset.
        """

    @abstractmethod
    def get(self, batch_id: int) -> LedgerEntry | None:
        """The DECIDED or COMMITTED entry of ``batch_id``, if any."""

    @abstractmethod
    def decide(self, entry: LedgerEntry) -> LedgerEntry:
        """Record ``entry`` (state DECIDED or COMMITTED) as the decision for its batch.

        Atomic: if the batch already has a decision, return that one unchanged (the
        first insert wins; the caller compares ``run_id``); if :meth:`forbid_decision`
        forbade the decision to ``(entry.batch_id, entry.run_id)``, raise
        :class:`~connectors.core.errors.FencedError`. Durable when it returns.
        """

    @abstractmethod
    def forbid_decision(self, batch_id: int, run_id: str) -> LedgerEntry | None:
        """Record that run ``run_id`` must never decide ``batch_id`` (an *abort record*).

        Atomic with :meth:`decide`: if that run already decided the batch, record
        nothing and return its decision (which must then be committed, never rolled
        back); otherwise return ``None``, and the caller may roll the run's
        transactions back. It rolls no transaction back itself.
        """

    @abstractmethod
    def mark_committed(self, batch_id: int) -> None:
        """Record that every transaction of the batch's decision is committed."""

    @abstractmethod
    def entries(self) -> Sequence[LedgerEntry]:
        """Every retained decision, ordered by batch id."""

    @abstractmethod
    def prune(self, keep: int) -> None:
        """Forget COMMITTED decisions (and abort records) older than the last ``keep``."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the ledger may be used again afterwards."""

    def record_lineage(self, link: Lineage) -> None:  # noqa: B027 - optional hook
        """Record ``link`` durably, keyed by its ``query_id`` (recording one again replaces
        it). Called by ``resume_from`` before the sink is rebound to that query, so a
        crash in between leaves a link a restart records again. Optional: a ledger that
        keeps none (the default) shows no lineage."""

    def lineage(self) -> list[Lineage]:
        """Every link :meth:`record_lineage` recorded (in no particular order);
        :func:`lineage_chain` orders those of the current binding. Default: none."""
        return []

    # Derived queries, written once here.
    def unfinished(self) -> list[LedgerEntry]:
        """Decided batches whose transactions are not all committed yet."""
        return [e for e in self.entries() if e.state is BatchState.DECIDED]

    def last_batch_id(self) -> int | None:
        entries = self.entries()
        return entries[-1].batch_id if entries else None


def check_binding(sink_id: str, bound: str | None, query_id: str, *, reset: bool) -> bool:
    """The binding rule: return True when the binding must be (re)written.

    Raises :class:`QueryBindingError` when the sink is bound to another query and
    ``reset`` is false.
    """
    if bound == query_id:
        return False
    if bound is None or reset:
        return True
    raise QueryBindingError(
        f"sink {sink_id!r} is bound to query {bound!r}, not {query_id!r}: a new checkpoint "
        "restarts batch ids at 0 and this sink would skip them as already committed. Use the "
        "original checkpoint location, or choose a new sink_id. reset_binding=True binds this "
        "sink to the new query and forgets its ledger, at a cost: the new checkpoint reads "
        "the source again from where it starts, so rows this sink already wrote are written "
        "again (duplicates) unless that starting point is past them",
        sink_id=sink_id,
    )
