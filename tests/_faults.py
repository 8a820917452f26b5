"""Fault injection for ledgers, shared by the unit and the integration tests."""

from __future__ import annotations

from collections.abc import Sequence

from connectors.core.errors import TransientError
from connectors.core.ledgers.ledger import Ledger, LedgerEntry

__all__ = ["LostReply"]


class LostReply(Ledger):
    """``inner``, whose first decision lands and then the ledger goes away: that write and
    the next ``unreachable`` calls of any kind raise :class:`TransientError`."""

    def __init__(self, inner: Ledger, *, unreachable: int) -> None:
        self.inner = inner
        self.sink_id = inner.sink_id
        self.unreachable = unreachable
        self.armed = True
        self.failed_calls = 0

    def _reach(self) -> None:
        if not self.armed and self.unreachable > 0:
            self.unreachable -= 1
            self.failed_calls += 1
            raise TransientError("the ledger's host does not answer")

    def decide(self, entry: LedgerEntry) -> LedgerEntry:
        self._reach()
        recorded = self.inner.decide(entry)
        if self.armed:
            self.armed = False
            raise TransientError("the connection dropped before the commit's reply")
        return recorded

    def get(self, batch_id: int) -> LedgerEntry | None:
        self._reach()
        return self.inner.get(batch_id)

    def open_run(self, run_id: str) -> None:
        self._reach()
        self.inner.open_run(run_id)

    def bound_query(self) -> str | None:
        return self.inner.bound_query()

    def bind_query(self, query_id: str, *, reset: bool = False) -> int:
        self._reach()
        return self.inner.bind_query(query_id, reset=reset)

    def forbid_decision(self, batch_id: int, run_id: str) -> LedgerEntry | None:
        self._reach()
        return self.inner.forbid_decision(batch_id, run_id)

    def mark_committed(self, batch_id: int) -> None:
        self._reach()
        self.inner.mark_committed(batch_id)

    def entries(self) -> Sequence[LedgerEntry]:
        self._reach()
        return self.inner.entries()

    def prune(self, keep: int) -> None:
        self._reach()
        self.inner.prune(keep)

    def close(self) -> None:
        self.inner.close()
