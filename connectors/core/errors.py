"""The one exception tree of ``connectors``.

::

    ConnectorError                      base of everything the library raises
    +-- ConfigurationError              bad options or an environment that cannot give
    |                                   exactly-once; the message names the fix
    +-- DependencyError (ImportError)   an optional extra is not installed
    +-- TransientError                  worth retrying (network blip, lock timeout, ...)
    |   +-- RetriesExhaustedError       a retry policy gave up; carries the last error
    +-- FatalError                      retrying cannot help
    |   +-- FencedError                 another owner took over the transaction/slot
    |   +-- DataLossError               a decided transaction can no longer be committed
    +-- ProtocolStateError              an illegal state transition or out-of-order call
    +-- QueryBindingError               the sink is bound to another query, or batch ids
    |                                   went backwards
    +-- NonDeterministicReplayError     a replayed batch differs from what was committed
    +-- BadInputError                   the batch's rows cannot be written (schema, size)
    +-- GracefulStop                    a graceful stop refused the next batch (not a
                                        failure: ``connectors.await_termination`` ends
                                        normally on it)

Every error carries ``sink_id``, ``batch_id`` and ``transaction_id`` when known, is
picklable (they cross from executors to the driver) and never holds a secret: the
message is built by the library from redacted values only.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "GRACEFUL_STOP_TAG",
    "BadInputError",
    "ConfigurationError",
    "ConnectorError",
    "DataLossError",
    "DecisionUnknown",
    "DependencyError",
    "FatalError",
    "FencedError",
    "GracefulStop",
    "NonDeterministicReplayError",
    "ProtocolStateError",
    "QueryBindingError",
    "RetriesExhaustedError",
    "TransientError",
]


class ConnectorError(Exception):
    """Base class of every error raised by ``connectors``.

    Args:
        message: what went wrong and, where there is one, the fix.
        sink_id: the sink the error belongs to.
        batch_id: the micro-batch (or batch-job run id).
        transaction_id: the participant transaction concerned.
    """

    def __init__(
        self,
        message: str,
        *,
        sink_id: str | None = None,
        batch_id: int | None = None,
        transaction_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.sink_id = sink_id
        self.batch_id = batch_id
        self.transaction_id = transaction_id

    def _context(self) -> str:
        parts = []
        if self.sink_id is not None:
            parts.append(f"sink_id={self.sink_id!r}")
        if self.batch_id is not None:
            parts.append(f"batch_id={self.batch_id}")
        if self.transaction_id is not None:
            parts.append(f"transaction_id={self.transaction_id!r}")
        return ", ".join(parts)

    def __str__(self) -> str:
        ctx = self._context()
        return f"{self.message} [{ctx}]" if ctx else self.message

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuild from the keyword arguments so subclasses survive pickling (executors
        # send them to the driver) without each one writing its own __reduce__.
        return (_rebuild, (type(self), self.message, self._state()))

    def _state(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "message"}


def _rebuild(cls: type[ConnectorError], message: str, state: dict[str, Any]) -> ConnectorError:
    err = cls.__new__(cls)
    ConnectorError.__init__(err, message)
    err.__dict__.update(state)
    return err


class ConfigurationError(ConnectorError, ValueError):
    """Options or environment that cannot give exactly-once; the message names the fix."""


class DependencyError(ConnectorError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""


class TransientError(ConnectorError):
    """A failure that may pass: retried by the sink's retry policy."""


class RetriesExhaustedError(TransientError):
    """The retry policy gave up. ``attempts`` says how many were made."""

    def __init__(self, message: str, *, attempts: int = 0, **context: Any) -> None:
        super().__init__(message, **context)
        self.attempts = attempts


class DecisionUnknown(TransientError):
    """A decision was written, and neither its reply nor a re-read of the ledger says
    whether it landed. Nothing is rolled back: the next run's start reads the ledger and
    finishes the batch (decided) or rolls it back (not decided)."""


class FatalError(ConnectorError):
    """A failure that retrying cannot mend."""


class FencedError(FatalError):
    """Another owner (a newer producer, driver or operator) took over."""


class DataLossError(FatalError):
    """A decided transaction is neither committed nor committable any more.

    Raised instead of presuming a commit: an unknown transaction is never proof of one.
    """


class ProtocolStateError(ConnectorError):
    """An illegal transition of the commit protocol; the message names the transition."""


class QueryBindingError(ConnectorError):
    """The sink is bound to another streaming query, or batch ids went backwards.

    A new checkpoint restarts batch ids at 0: writing on would let the ledger answer
    "already committed" and silently drop data. Pass ``reset_binding=True`` to the sink
    only when the target's content for the old query is meant to be kept as it is.
    """


class NonDeterministicReplayError(ConnectorError):
    """A replayed batch holds other rows than the committed one.

    Spark replays a batch from the same offsets; the rows differ only when the query is
    non-deterministic (``rand()``, ``uuid()``, a source that changed). Make the query
    deterministic, or pass ``on_replay_mismatch="warn"`` to accept the committed content.
    """


class BadInputError(ConnectorError, ValueError):
    """The batch cannot be written as it is (schema, types, sizes); nothing was committed."""


#: Text every :class:`GracefulStop` message starts with: how a graceful stop is told apart
#: from a failure where only the text of the error survives (Spark's
#: ``StreamingQueryException``, classic and Connect alike).
GRACEFUL_STOP_TAG = "[CONNECTORS_GRACEFUL_STOP]"


class GracefulStop(ConnectorError):
    """A graceful stop was requested: the sink refused to start the next batch.

    Raised at the start of a batch, before any side effect, so Spark records no commit for
    that batch and replays it when the query starts again. Not a failure:
    :func:`connectors.stop_gracefully` reports it as a clean stop, and
    :func:`connectors.await_termination` returns normally when the query ended with it.
    """

    def __init__(self, message: str = "", **context: Any) -> None:
        super().__init__(
            message or "a graceful stop was requested: this batch was not started", **context)

    def __str__(self) -> str:
        return f"{GRACEFUL_STOP_TAG} {super().__str__()}"
