"""What a coordinator decides a batch's steps from, and what the first half of a batch
leaves for the second (:mod:`connectors.core.protocol.coordinator`)."""

from __future__ import annotations

from dataclasses import dataclass

from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers.ledger import LedgerEntry, TaskCommit

__all__ = ["Part", "RunFacts"]


@dataclass(frozen=True)
class Part:
    """A batch after :meth:`Coordinator.prepare`, before :meth:`Coordinator.complete`.

    ``done``: nothing more to do (a replay the ledger had; a batch the target had).
    Else: PREPARE_IN_TASK its prepared ``commits`` and their ``fingerprint``;
    COMMIT_IN_TASK its ``slots``; COMMIT_ON_DRIVER the ``record`` to write once the
    target committed (and the input's ``fingerprint`` when it was computed).
    """

    batch_id: int
    done: bool = False
    commits: tuple[TaskCommit, ...] = ()
    fingerprint: Fingerprint | None = None
    slots: int = 0
    record: LedgerEntry | None = None


@dataclass(frozen=True)
class RunFacts:
    """What the driver run knows before a batch, from which the coordinator decides
    whether the run starts (RECONCILING) first.

    ``started``: this run reconciled and bound already; ``query_id``: the query it bound;
    ``swept``: the run's last batch closed with a sweep after every task of it had ended,
    so nothing of this sink can be prepared that the sweep did not settle (the next
    PREPARE_IN_TASK batch then skips its opening sweep: one listing of the target's
    prepared transactions per batch).
    """

    started: bool = False
    query_id: str | None = None
    swept: bool = False
