"""psycopg errors translated, in one table, into the library's own: by SQLSTATE, never by text.

What decides the error class:

- an error the server returned carries a SQLSTATE; psycopg turns it into one class of
  ``psycopg.errors`` (``NotNullViolation`` is ``23502`` whatever the server's
  ``lc_messages``), and :data:`_TABLE` maps those classes to the library's errors;
- a failure while connecting carries none (libpq keeps the server's code to itself):
  :class:`CannotConnectError`, one configuration error naming what to check, quoting
  the server's text with secrets removed, unless no server answers (or it answers "not
  now") at that address: then it is :class:`~connectors.postgres._reach.TargetDownError`,
  transient (libpq's ``PQping`` tells, see :mod:`connectors.postgres._reach`). When the same
  settings connected before in this process (a server restart, a network blip) it is a
  :class:`TransientError` whatever the server said;
- a connection lost mid-statement (no SQLSTATE) is a :class:`TransientError`.

Row values stay out of the message unless the sink's ``values_in_errors`` is ``True``:
by default a message names the table, column, constraint and data type from the error's
diagnostic fields, and never quotes the server's text of a statement error (its primary
message can quote a value, e.g. ``invalid input syntax for type integer: "abc"``; its
``DETAIL`` quotes whole rows: ``Failing row contains (...)``, ``Key (id)=(17) already
exists``). The translated error never references the psycopg exception either: raise it
outside the ``except`` block (see :func:`raise_translated`), so that neither ``__cause__``
nor ``__context__`` carries the values into a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg

from connectors.core.errors import (
    BadInputError,
    ConfigurationError,
    ConnectorError,
    FatalError,
    TransientError,
)
from connectors.core.translated import raise_translated as translated
from connectors.postgres._config import Conninfo
from connectors.postgres._reach import first_contact
from connectors.postgres._redact import redact

__all__ = ["CONNECT_ADVICE", "CannotConnectError", "raise_translated", "translate"]

T = TypeVar("T")

#: What every connect-time failure says (the server's text follows, redacted).
CONNECT_ADVICE = "cannot connect or authenticate: check host, user, password, dbname"
#: libpq's own words (English, from the client library: no SQLSTATE, no server language)
#: for a TLS failure at connect time, and the setting to fix. The first match wins; an
#: unrecognised failure keeps :data:`CONNECT_ADVICE`. A match that names a setting is a
#: configuration error at once; :data:`GENERIC_TLS` goes through ``PQping`` first.
TLS_ADVICE: tuple[tuple[str, str], ...] = (
    ("does not match host name",
     "TLS: the server's certificate is not for this host: with sslmode=verify-full, host "
     "must be a name (or address) the certificate lists"),
    ("certificate verify failed",
     "TLS: the server's certificate does not verify: sslrootcert must name the CA that "
     "signed it"),
    ("root certificate file",
     "TLS: sslrootcert names no readable CA file (every executor needs it at that path)"),
    ("private key",
     "TLS: the client key cannot be used: check sslkey and sslpassword (every executor "
     "needs the key at that path)"),
    ("certificate file",
     "TLS: sslcert names no readable client certificate (every executor needs it at that "
     "path)"),
    ("server does not support SSL",
     "TLS: the server does not accept TLS connections: check sslmode and the server's ssl "
     "setting"),
    ("SSL error",
     "TLS: the handshake failed: check sslmode, sslrootcert, sslcert and sslkey"),
)
#: The one entry of :data:`TLS_ADVICE` that names no setting: a server that restarts cuts
#: handshakes short with it too ("SSL error: unexpected eof while reading").
GENERIC_TLS = "SSL error"
#: Longest quotation of a server's or client's text in a message.
_MAX_QUOTE = 400


class CannotConnectError(ConfigurationError):
    """Connecting failed (wrong host, port, user, password or dbname; the server refused).

    A :class:`~connectors.core.errors.ConfigurationError`: the server gives a connect-time
    failure no SQLSTATE, so the sink cannot tell a wrong password from a full server, and
    names everything to check. The operator CLI exits with "unreachable" (3) for it.
    """

    #: Read by the operator CLI (``connectors status`` exits 3, not 2).
    cannot_connect = True


# Order matters: the first matching class wins. Every entry is a SQLSTATE class of
# ``psycopg.errors`` (a subclass matches too, as its SQLSTATE is in the class's family).
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
    ((pg.InvalidCatalogName,), ConfigurationError, "the database does not exist: check dbname"),
    ((pg.UndefinedTable,), BadInputError, "the table does not exist"),
    ((pg.UndefinedColumn,), BadInputError, "a column does not exist in the table"),
    ((pg.NotNullViolation,), BadInputError, "NULL in a NOT NULL column"),
    ((pg.UniqueViolation,), BadInputError, "a unique constraint of the table rejected a row"),
    (
        (pg.CheckViolation, pg.ForeignKeyViolation, pg.ExclusionViolation,
         pg.IntegrityConstraintViolation),
        BadInputError,
        "a constraint of the table rejected a row",
    ),
    (
        (pg.DataError, pg.DatatypeMismatch, pg.CannotCoerce),
        BadInputError,
        "a value does not fit its column",
    ),
    (
        (pg.LockNotAvailable, pg.DeadlockDetected, pg.SerializationFailure, pg.QueryCanceled),
        TransientError,
        "lock or statement timeout",
    ),
    (
        (pg.AdminShutdown, pg.CrashShutdown, pg.CannotConnectNow),
        TransientError,
        "the server is restarting",
    ),
    ((pg.TooManyConnections,), TransientError, "the server has no free connection"),
    ((pg.ProgramLimitExceeded,), BadInputError, "a value exceeds a PostgreSQL limit"),
    ((pg.DuplicateObject,), FatalError, "the transaction id is in use already"),
)

#: Only in the step that runs ``PREPARE TRANSACTION``: these SQLSTATEs mean a server limit.
_PREPARE_LIMITS: tuple[tuple[type[BaseException], str], ...] = (
    (
        pg.ObjectNotInPrerequisiteState,  # 55000
        "prepared transactions are disabled on the server (max_prepared_transactions = 0): "
        "set max_prepared_transactions to at least the number of tasks of a batch (e.g. 64) "
        "in postgresql.conf and restart PostgreSQL",
    ),
    (
        pg.OutOfMemory,  # 53200: no free prepared-transaction slot
        "the server's max_prepared_transactions is exhausted: raise it (and restart "
        "PostgreSQL), write with fewer partitions, or settle lingering prepared transactions "
        "(see pg_prepared_xacts, `connectors status`)",
    ),
)


def _where(exc: psycopg.Error) -> str:
    """The names the diagnostic fields give (never values): table, column, constraint."""
    diag = exc.diag
    parts = []
    if diag.table_name:
        table = f"{diag.schema_name}.{diag.table_name}" if diag.schema_name else diag.table_name
        parts.append(f"table {table}")
    if diag.column_name:
        parts.append(f"column {diag.column_name}")
    if diag.constraint_name:
        parts.append(f"constraint {diag.constraint_name}")
    if diag.datatype_name:
        parts.append(f"type {diag.datatype_name}")
    return "; ".join(parts)


def _quote(text: str, conninfo: Conninfo | None) -> str:
    """``text`` on one line, its secrets masked (also any secret keyword's value when no
    conninfo is known), cut to :data:`_MAX_QUOTE` characters."""
    text = " ".join(text.split())
    return (conninfo.redact(text) if conninfo is not None else redact(text))[:_MAX_QUOTE]


def _server_text(exc: psycopg.Error, conninfo: Conninfo | None) -> str:
    """The server's own words (only with ``values_in_errors``): primary, detail, context."""
    diag = exc.diag
    pieces = [diag.message_primary or str(exc)]
    if diag.message_detail:
        pieces.append(f"DETAIL: {diag.message_detail}")
    if diag.context:
        pieces.append(f"CONTEXT: {diag.context}")
    return _quote(" ".join(pieces), conninfo)


def translate(
    exc: BaseException,
    *,
    doing: str,
    conninfo: Conninfo | None = None,
    values: bool = False,
    connecting: bool = False,
    connected_before: bool = False,
    preparing: bool = False,
    sink_id: str | None = None,
    batch_id: int | None = None,
    transaction_id: str | None = None,
) -> ConnectorError:
    """Map a psycopg error to the library's error tree (see the module docstring).

    Args:
        doing: what the sink was doing, for the message (names, never values).
        conninfo: the connection string whose secrets are masked wherever they could
            appear (:meth:`Conninfo.redact`).
        values: the sink's ``values_in_errors``: quote the server's text (with its values).
        connecting: ``exc`` came from ``psycopg.connect``.
        connected_before: the same settings connected in this process before.
        preparing: ``exc`` came from the step that runs ``PREPARE TRANSACTION``.
    """
    ids: dict[str, Any] = {
        "sink_id": sink_id, "batch_id": batch_id, "transaction_id": transaction_id}
    if isinstance(exc, ConnectorError):
        return exc
    if not isinstance(exc, psycopg.Error):  # e.g. the encoder's: its text may quote a value
        detail = f": {_quote(str(exc), conninfo)}" if values else ""
        return FatalError(f"{doing}: {type(exc).__name__}{detail}", **ids)
    sqlstate = exc.sqlstate
    name = type(exc).__name__
    if sqlstate is None:
        # No SQLSTATE: the client's or libpq's words, which quote no row (a connection
        # string's password is masked); a client-side DataError may quote a value.
        text = _quote(str(exc), conninfo)
        if connecting and isinstance(exc, psycopg.OperationalError):
            if connected_before:
                return TransientError(
                    f"{doing}: cannot reconnect (the same settings connected before: the "
                    f"server may be restarting): {text}", **ids)
            words, tls = next(((w, a) for w, a in TLS_ADVICE if w in str(exc)),
                              (None, None))
            if tls is not None and words != GENERIC_TLS:
                return CannotConnectError(f"{doing}: {tls} (server: {text})", **ids)
            # No settings named: a handshake cut short may be a server going down (its
            # restart's EOF), so PQping decides as for any other failure to connect.
            fallback = tls or CONNECT_ADVICE
            return first_contact(doing=doing, conninfo=conninfo, text=text, ids=ids,
                                 refused=lambda advice: CannotConnectError(
                                     f"{doing}: {advice or fallback} (server: {text})",
                                     **ids))
        if isinstance(exc, psycopg.OperationalError):
            return TransientError(f"{doing}: connection lost ({name}: {text})", **ids)
        if isinstance(exc, psycopg.DataError) and not values:
            return BadInputError(f"{doing}: a value does not fit its column ({name})", **ids)
        return FatalError(f"{doing}: psycopg refused the call ({name}: {text})", **ids)

    kind: type[ConnectorError] = FatalError
    what = "the server refused the statement"
    matched = False
    if preparing:
        for cls, limit in _PREPARE_LIMITS:
            if isinstance(exc, cls):
                kind, what, matched = ConfigurationError, limit, True
                break
    if not matched:
        for classes, error_class, description in _TABLE:
            if isinstance(exc, classes):
                kind, what, matched = error_class, description, True
                break
    if not matched and isinstance(exc, psycopg.OperationalError):
        kind, what = TransientError, "the server could not run the statement now"
    where = _where(exc)
    facts = f"{name}, SQLSTATE {sqlstate}" + (f"; {where}" if where else "")
    message = f"{doing}: {what} ({facts})"
    if values:
        message += f": {_server_text(exc, conninfo)}"
    return kind(message, **ids)


def raise_translated(
    call: Callable[[], T], translator: Callable[[psycopg.Error], ConnectorError]
) -> T:
    """``call()``, with a psycopg error raised as ``translator(exc)``, outside the handler
    (:func:`connectors.core.translated.raise_translated`: no ``__context__`` keeps the
    psycopg exception, whose text and diagnostics may quote rows)."""
    return translated(call, translator, psycopg.Error)
