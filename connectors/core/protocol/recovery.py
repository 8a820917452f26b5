"""Recovery: finishing decided batches and settling stray transactions, one loop for all.

The coordinator (:mod:`connectors.core.protocol.coordinator`) holds a :class:`Recovery` and runs it
at the start of every driver run (RECONCILING), around a PREPARE_IN_TASK batch (losing
attempts, a failed batch's transactions) and for ``connectors recover`` (an operator's
settling): the same commands through the same guard, so an operator's recovery can do
nothing a driver could not.

Example, the commands of a sweep that finds nothing prepared::

    >>> from connectors.core.protocol.commands import ListPrepared
    >>> from connectors.core.metrics import BatchMetrics
    >>> def door(command):  # what the coordinator's guard-checked door does
    ...     return (yield command)
    >>> steps = Recovery("events", door, BatchMetrics("events", 0, "prepare_in_task")).sweep()
    >>> next(steps)
    ListPrepared()
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from connectors.core.ledgers.ledger import LedgerEntry
from connectors.core.metrics import BatchMetrics
from connectors.core.naming import TransactionId
from connectors.core.protocol.commands import (
    Abort,
    Command,
    Commit,
    Crash,
    ForbidDecision,
    ListPrepared,
    MarkCommitted,
    ReadDecision,
    ReadUnfinished,
)
from connectors.core.states import BatchState, CrashPoint

__all__ = ["Door", "Recovery", "Settled"]

logger = logging.getLogger(__name__)

#: The coordinator's one door: checks a command with the guard, yields it, returns its result.
Door = Callable[[Command], Generator[Command, Any, Any]]


@dataclass
class Settled:
    """What a sweep did: transaction ids ``committed``, ``aborted`` (rolled back) and
    ``left`` (neither: kept by the caller's choice, or decided meanwhile)."""

    committed: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)


class Recovery:
    """Finishing and sweeping for one sink (see the module docstring)."""

    def __init__(self, sink_id: str, door: Door, metrics: BatchMetrics) -> None:
        self.sink_id = sink_id
        self._do = door
        self.metrics = metrics

    def finish(self, entry: LedgerEntry) -> Generator[Command, Any, None]:
        """Commit every transaction of a durable decision, then record the batch committed.

        Idempotent: runs again after any crash; the participant proves (never presumes)
        what is already committed."""
        for i, commit in enumerate(entry.commits):
            yield from self._do(Commit(entry.batch_id, commit))
            if i == 0 and len(entry.commits) > 1:
                yield from self._do(Crash(CrashPoint.BETWEEN_COMMITS, entry.batch_id))
        yield from self._do(MarkCommitted(entry.batch_id))

    def finish_unfinished(self) -> Generator[Command, Any, list[str]]:
        """Finish every decided, not yet committed batch of the ledger; the ids committed."""
        committed: list[str] = []
        for entry in cast("Sequence[LedgerEntry]", (yield from self._do(ReadUnfinished()))):
            logger.info("sink %s: RECONCILING batch %d: committing %d decided transaction(s)",
                        self.sink_id, entry.batch_id, len(entry.commits))
            yield from self.finish(entry)
            self.metrics.reconciled += len(entry.commits)
            committed += [c.transaction_id for c in entry.commits]
        return committed

    def settle(self, transactions: Sequence[str], *, commit_decided: bool,
               abort_undecided: bool, keep: frozenset[str]) -> Generator[Command, Any, Settled]:
        """An operator's recovery (``connectors recover``): finish the decided batches
        (``commit_decided``), then sweep ``transactions`` (those in ``keep`` are left)."""
        committed: list[str] = []
        if commit_decided:
            committed = yield from self.finish_unfinished()
        settled = yield from self.sweep(
            transactions, commit_decided=commit_decided, abort_undecided=abort_undecided,
            keep=keep, done=frozenset(committed))
        settled.committed[:0] = committed
        return settled

    def sweep(
        self,
        transactions: Sequence[str] | None = None,
        *,
        commit_decided: bool = True,
        abort_undecided: bool = True,
        keep: frozenset[str] = frozenset(),
        done: frozenset[str] = frozenset(),
    ) -> Generator[Command, Any, Settled]:
        """Settle the prepared transactions of exactly this sink (``transactions``, or the
        target's list when ``None``): commit what a decision lists (``commit_decided``),
        roll back the rest after forbidding its run's decision, presumed abort
        (``abort_undecided``; never those in ``keep``). Ids in ``done`` are skipped."""
        if transactions is None:
            transactions = cast("Sequence[str]", (yield from self._do(ListPrepared())))
        settled = Settled()
        for raw in transactions:
            tid = TransactionId.parse(raw)
            if tid is None or not tid.belongs_to(self.sink_id) or raw in done:
                continue  # another sink's, or not ours at all: never touched
            entry = cast("LedgerEntry | None",
                         (yield from self._do(ReadDecision(tid.batch_id))))
            if entry is None and abort_undecided and raw not in keep:
                # No decision: forbid this run's decision first (it may have come meanwhile).
                entry = yield from self._do(ForbidDecision(tid.batch_id, tid.run_id))
            listed = [c for c in entry.commits if c.transaction_id == raw] if entry else []
            if entry is not None and listed:
                if not commit_decided:
                    settled.left.append(raw)
                elif entry.state is BatchState.DECIDED:
                    yield from self.finish(entry)
                    settled.committed.append(raw)
                else:  # recorded committed, yet still prepared: commit again (idempotent)
                    yield from self._do(Commit(entry.batch_id, listed[0]))
                    settled.committed.append(raw)
                continue
            if not abort_undecided or raw in keep:
                settled.left.append(raw)
                continue
            logger.info("sink %s: rolling back undecided transaction %s (batch %d, run %s)",
                        self.sink_id, raw, tid.batch_id, tid.run_id)
            yield from self._do(Abort(tid.batch_id, raw))
            settled.aborted.append(raw)
        self.metrics.reconciled += len(settled.committed)
        self.metrics.aborted += len(settled.aborted)
        return settled
