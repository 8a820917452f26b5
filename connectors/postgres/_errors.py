"""psycopg errors translated, in one table, into the library's own."""

from __future__ import annotations

import psycopg
from psycopg import errors as pg

from connectors.core.errors import (
    BadInputError,
    ConfigurationError,
    ConnectorError,
    FatalError,
    TransientError,
)
from connectors.postgres._config import redact

__all__ = ["translate"]

# Order matters: the first matching class wins.
_TABLE: tuple[tuple[tuple[type[BaseException], ...], type[ConnectorError], str], ...] = (
    (
        (pg.InvalidPassword, pg.InvalidAuthorizationSpecification),
        ConfigurationError,
        "authentication failed: check the user and password in the conninfo",
    ),
    (
        (pg.InsufficientPrivilege,),
        ConfigurationError,
        "permission denied: grant the sink's role the privileges it needs",
    ),
    ((pg.UndefinedTable,), BadInputError, "the table does not exist"),
    ((pg.UndefinedColumn,), BadInputError, "a column does not exist in the table"),
    ((pg.NotNullViolation,), BadInputError, "NULL in a NOT NULL column"),
    (
        (pg.DataError, pg.DatatypeMismatch, pg.CannotCoerce),
        BadInputError,
        "a value does not fit its column",
    ),
    (
        (pg.UniqueViolation, pg.CheckViolation, pg.ForeignKeyViolation, pg.ExclusionViolation),
        BadInputError,
        "a constraint of the table rejected a row",
    ),
    (
        (pg.LockNotAvailable, pg.DeadlockDetected, pg.SerializationFailure, pg.QueryCanceled),
        TransientError,
        "lock or statement timeout",
    ),
    ((pg.AdminShutdown, pg.CannotConnectNow), TransientError, "the server is restarting"),
    ((psycopg.OperationalError,), TransientError, "connection failed"),
    ((pg.ProgramLimitExceeded,), BadInputError, "a value exceeds a PostgreSQL limit"),
)


def translate(
    exc: BaseException,
    *,
    doing: str,
    password: str | None,
    sink_id: str | None = None,
    batch_id: int | None = None,
    transaction_id: str | None = None,
) -> ConnectorError:
    """Map a psycopg error to the library's error tree, redacting the password."""
    text = str(exc).strip()
    detail = redact(" ".join(text.split()), password)[:400]
    if isinstance(exc, psycopg.OperationalError) and not isinstance(exc, pg.QueryCanceled):
        lowered = text.lower()
        if "authentication failed" in lowered or "no password supplied" in lowered:
            return ConfigurationError(
                f"{doing}: authentication failed: check the user and password in the "
                f"conninfo ({detail})",
                sink_id=sink_id, batch_id=batch_id, transaction_id=transaction_id,
            )
        if "does not exist" in lowered and "database" in lowered:
            return ConfigurationError(
                f"{doing}: the database does not exist: check dbname in the conninfo "
                f"({detail})",
                sink_id=sink_id, batch_id=batch_id, transaction_id=transaction_id,
            )
    lowered = text.lower()
    if "prepared transactions are disabled" in lowered:
        return ConfigurationError(
            f"{doing}: prepared transactions are disabled on the server "
            "(max_prepared_transactions = 0): set max_prepared_transactions to at least the "
            "number of tasks of a batch (e.g. 64) in postgresql.conf and restart PostgreSQL",
            sink_id=sink_id, batch_id=batch_id, transaction_id=transaction_id,
        )
    if "maximum number of prepared transactions reached" in lowered:
        return ConfigurationError(
            f"{doing}: the server's max_prepared_transactions is exhausted: raise it (and "
            "restart PostgreSQL), write with fewer partitions, or settle lingering prepared "
            f"transactions (see pg_prepared_xacts) ({detail})",
            sink_id=sink_id, batch_id=batch_id, transaction_id=transaction_id,
        )
    kind: type[ConnectorError] = FatalError
    message = f"{doing}: {type(exc).__name__}: {detail}"
    for classes, error_class, what in _TABLE:
        if isinstance(exc, classes):
            kind = error_class
            message = f"{doing}: {what} ({type(exc).__name__}: {detail})"
            break
    return kind(message, sink_id=sink_id, batch_id=batch_id, transaction_id=transaction_id)
