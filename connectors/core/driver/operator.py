"""What every database of prepared transactions gives the operator tools, settling included.

A database whose sinks leave prepared transactions (PostgreSQL's ``PREPARE TRANSACTION``,
MariaDB's XA branches) is read and settled from outside the queries by one admin class
per database (``connectors.postgres.admin.PostgresAdmin``,
``connectors.mariadb.admin.MariaDBAdmin``). :class:`PreparedAdmin` is what they share:

- the four questions each answers its own way: :meth:`~PreparedAdmin.sink_ids`,
  :meth:`~PreparedAdmin.ledger`, :meth:`~PreparedAdmin.prepared` (a
  :class:`PreparedTransaction` each, its age when the database knows it) and
  :meth:`~PreparedAdmin.describe`;
- :meth:`~PreparedAdmin.settle`, one way for all: an operator's instance of the sink
  (:meth:`~PreparedAdmin.operator_sink`: it settles, never writes) runs
  :meth:`SinkDriver.settle <connectors.core.driver.sink_driver.SinkDriver.settle>`, the
  steps and ledger serialization of a driver's start (the sink's recovery,
  :mod:`connectors.core.protocol.recovery`), so it never races a live driver: a roll-back
  first records "this run may never decide this batch" in the ledger, and a live driver
  then fails that batch (and retries it) instead of committing half of it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from connectors.core.ledgers.ledger import Ledger, LedgerEntry
from connectors.core.naming import TransactionId
from connectors.core.protocol.recovery import Settled

if TYPE_CHECKING:  # the sinks an admin settles through
    from connectors.core.templates.template import TwoPhaseCommitSink

__all__ = ["PreparedAdmin", "PreparedTransaction"]

A = TypeVar("A", bound="PreparedAdmin")


@dataclass(frozen=True)
class PreparedTransaction:
    """A transaction a sink prepared and nobody committed or rolled back yet."""

    transaction_id: TransactionId
    #: Seconds since it was prepared, by the server's clock; ``None``: the database does
    #: not tell (MariaDB's ``XA RECOVER``).
    age_s: float | None


class PreparedAdmin(ABC):
    """One database and one ledger table of the sinks that prepare transactions there,
    read and settled (see the module docstring). A context manager: :meth:`close` at
    its end."""

    @abstractmethod
    def describe(self) -> str:
        """The database and the ledger table for humans, secrets redacted."""

    @abstractmethod
    def prepared(self, sink_id: str | None = None) -> list[PreparedTransaction]:
        """The transactions the sinks prepared here (``sink_id``: that sink's only);
        another application's are never listed."""

    @abstractmethod
    def sink_ids(self) -> list[str]:
        """Every sink id with a ledger binding or a prepared transaction here."""

    @abstractmethod
    def ledger(self, sink_id: str) -> Ledger:
        """The sink's ledger, on a connection of its own; the caller closes it."""

    @abstractmethod
    def operator_sink(self, sink_id: str) -> TwoPhaseCommitSink:
        """An instance of the sink for settling only (it refuses to write); the caller
        closes it."""

    @abstractmethod
    def close(self) -> None:
        """Release the connection."""

    def settle(
        self,
        sink_id: str,
        transactions: Sequence[str],
        *,
        commit_decided: bool,
        abort_undecided: bool,
        keep: frozenset[str] = frozenset(),
        adopt: Sequence[LedgerEntry] = (),
    ) -> Settled:
        """Settle the sink's prepared ``transactions`` (ids, as :meth:`prepared` lists
        them) by its ledger, as a driver's start does: record ``adopt`` (a fan-out's
        decided parts for this sink: never rolled back), commit every decided batch
        (``commit_decided``), roll back each undecided transaction (``abort_undecided``)
        but those in ``keep``. Returns the ids committed, rolled back and left."""
        sink = self.operator_sink(sink_id)
        try:
            ledger = sink.create_ledger()
            try:
                settled, _metrics = sink.driver.settle(
                    transactions, commit_decided=commit_decided,
                    abort_undecided=abort_undecided, keep=keep, adopt=adopt, ledger=ledger)
            finally:
                ledger.close()
        finally:
            sink.close()
        return settled

    def __enter__(self: A) -> A:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
