"""Build and parse the names every sink derives from its ``sink_id``.

A transaction id is ``eos1|<sink_id>|<run>|<batch_id>|<task_attempt_id>``:

- ``sink_id`` is validated so that it never contains ``|``: parsing is exact, and sink
  ``events`` can never claim the transactions of sink ``events-2`` (no prefix matching).
- ``run`` is a per-driver-run nonce: two drivers (or a driver and its restarted self) never
  produce the same id for the same batch.
- ``task_attempt_id`` is Spark's application-unique task attempt id (``attemptNumber``
  restarts at 0 in every stage attempt, so it cannot tell two attempts apart).

The longest id is 94 characters: below PostgreSQL's 200-byte gid limit, and its parts fit
psycopg's 64-character ``gtrid``/``bqual`` (see :meth:`TransactionId.xid_parts`).
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from connectors.core.errors import ConfigurationError

__all__ = [
    "MAX_SINK_ID_LENGTH",
    "TransactionId",
    "new_run_id",
    "slot_name",
    "validate_sink_id",
]

#: Fits every target: psycopg's gtrid (64 chars) holds ``eos1|<sink_id>|<run>``,
#: Kafka transactional ids and topic names, Delta ``txnAppId`` strings, file names.
MAX_SINK_ID_LENGTH = 40
_SINK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_RUN_ID = re.compile(r"[0-9a-f]{8}")
#: A batch or task attempt id as ``str(int)`` writes it: ASCII digits, no leading zero.
_NUMBER = re.compile(r"0|[1-9][0-9]*")
_PREFIX = "eos1"
_SEP = "|"


def validate_sink_id(sink_id: object) -> str:
    """Return ``sink_id`` if it is a valid sink id, else raise :class:`ConfigurationError`.

    A sink id is 1 to 40 characters of ASCII letters, digits, ``-`` and ``_``, starting
    with a letter or digit. It must stay the same for the life of the sink's output: every
    transaction id and ledger key derives from it.

    Example::

        >>> validate_sink_id("events-pg")
        'events-pg'
    """
    if not isinstance(sink_id, str) or not sink_id:
        raise ConfigurationError(
            "sink_id is required: pass a stable name such as sink_id='events-pg'; "
            "every transaction id and ledger entry of the sink derives from it"
        )
    if len(sink_id) > MAX_SINK_ID_LENGTH or not _SINK_ID.fullmatch(sink_id):
        raise ConfigurationError(
            f"invalid sink_id {sink_id[:60]!r}: use 1 to {MAX_SINK_ID_LENGTH} characters of "
            "A-Z, a-z, 0-9, '-' and '_', starting with a letter or digit"
        )
    return sink_id


def new_run_id() -> str:
    """A fresh per-driver-run nonce (8 hex digits)."""
    return secrets.token_hex(4)


def slot_name(sink_id: str, slot: int) -> str:
    """The stable name of slot ``slot`` of a sink (e.g. a Kafka ``transactional.id``)."""
    return _SEP.join((_PREFIX, validate_sink_id(sink_id), "slot", str(int(slot))))


@dataclass(frozen=True, order=True)
class TransactionId:
    """The id of one task attempt's transaction in one batch of one sink."""

    sink_id: str
    run_id: str
    batch_id: int
    task_attempt_id: int

    def __post_init__(self) -> None:
        validate_sink_id(self.sink_id)
        if not _RUN_ID.fullmatch(self.run_id):
            raise ConfigurationError(f"invalid run id {self.run_id!r}: expected 8 hex digits")
        if self.batch_id < 0 or self.task_attempt_id < 0:
            raise ConfigurationError("batch id and task attempt id must be >= 0")

    def __str__(self) -> str:
        return _SEP.join(
            (_PREFIX, self.sink_id, self.run_id, str(self.batch_id), str(self.task_attempt_id))
        )

    def xid_parts(self) -> tuple[str, str]:
        """``(gtrid, bqual)`` for XA-style ids limited to 64 characters each."""
        return (
            _SEP.join((_PREFIX, self.sink_id, self.run_id)),
            f"{self.batch_id}.{self.task_attempt_id}",
        )

    @classmethod
    def parse(cls, text: str) -> TransactionId | None:
        """Parse a transaction id; ``None`` for anything this library did not build."""
        parts = text.split(_SEP)
        if len(parts) != 5 or parts[0] != _PREFIX:
            return None
        _, sink_id, run_id, batch, attempt = parts
        if not (_SINK_ID.fullmatch(sink_id) and len(sink_id) <= MAX_SINK_ID_LENGTH):
            return None
        if not (_RUN_ID.fullmatch(run_id) and _NUMBER.fullmatch(batch)
                and _NUMBER.fullmatch(attempt)):
            return None
        return cls(sink_id, run_id, int(batch), int(attempt))

    @classmethod
    def from_xid_parts(cls, gtrid: str, bqual: str) -> TransactionId | None:
        """Inverse of :meth:`xid_parts`; ``None`` for foreign ids."""
        batch, dot, attempt = bqual.partition(".")
        if not dot:
            return None
        return cls.parse(_SEP.join((gtrid, batch, attempt)))

    def belongs_to(self, sink_id: str) -> bool:
        """True only for exactly this sink (never a prefix match)."""
        return self.sink_id == sink_id
