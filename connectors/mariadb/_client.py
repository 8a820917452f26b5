"""Connections to MariaDB (PyMySQL) and its errors translated into the library's, by code.

Every session the sink opens runs strict: ``sql_mode`` makes a truncated or invalid value
an error, never a warning; ``time_zone`` is UTC (a timestamp with a time zone is written
as its UTC wall time into ``DATETIME``/``TIMESTAMP``); ``innodb_lock_wait_timeout`` bounds
a wait on a lock (a prepared branch holds its locks until the driver commits it).

Errors are told apart by MariaDB's error number (the same in every language of the
server's messages), never by their text. A statement error's text can quote a row's value
(``Duplicate entry '17' for key 'PRIMARY'``, ``Incorrect integer value: 'abc'``): the
translated error names the number, the table and, where the server gives it, the column,
but quotes no text of the server's unless ``values_in_errors``. It is raised outside the
``except`` block (:func:`raise_translated`), so no traceback carries the driver's exception.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Callable
from typing import Any, TypeVar

from connectors._deps import require
from connectors.core.errors import (
    BadInputError,
    ConfigurationError,
    ConnectorError,
    TransientError,
)
from connectors.core.translated import raise_translated as translated
from connectors.mariadb._config import Address

__all__ = ["STRICT_SQL_MODE", "connect", "raise_translated", "translate"]

T = TypeVar("T")

#: The session's SQL mode: bad values are errors (``STRICT_ALL_TABLES``: also for
#: non-transactional tables and every row of a multi-row statement), no zero dates.
STRICT_SQL_MODE = ("STRICT_ALL_TABLES,NO_ZERO_DATE,NO_ZERO_IN_DATE,ERROR_FOR_DIVISION_BY_ZERO,"
                   "NO_ENGINE_SUBSTITUTION,NO_AUTO_VALUE_ON_ZERO")

#: Worth a retry: the connection went away, the server is starting or stopping, a lock
#: wait or deadlock, too many connections.
TRANSIENT = frozenset({1040, 1053, 1077, 1152, 1158, 1159, 1160, 1161, 1205, 1213, 1927,
                       2002, 2003, 2006, 2013, 2055, 4031})
#: The batch's values or columns: refused, nothing committed (1048 NULL into NOT NULL,
#: 1054 unknown column, 1062/1586 duplicate key, 1136 column count, 1264 out of range,
#: 1265 truncated, 1292 incorrect value, 1366 incorrect value for a column, 1406 too long,
#: 1452 foreign key, 3140 invalid JSON, 4025 CHECK constraint).
BAD_INPUT = frozenset({1048, 1054, 1062, 1136, 1264, 1265, 1292, 1366, 1406, 1451, 1452,
                       1586, 3140, 4025})
#: Settings: access denied, unknown database, no privilege.
CONFIGURATION = frozenset({1044, 1045, 1049, 1142, 1143, 1227, 1370, 1698})
#: A column the server's message names (``for column `db`.`t`.`c```, ``Column 'c'``): the
#: last one, since a message quotes the value before the column.
_COLUMN = re.compile(r"column (?:`[^`]*`\.)*[`']([^`']+)[`']", re.I)


def connect(address: Address, *, connect_timeout: int, lock_wait_timeout: int,
            local_infile: bool = False, autocommit: bool = True) -> Any:
    """A PyMySQL connection in the sink's strict, UTC session; errors translated."""
    pymysql = require("pymysql", extra="mariadb", feature="MariaDBSink")

    def open_() -> Any:
        return pymysql.connect(
            **address.connect_kwargs(), connect_timeout=connect_timeout,
            autocommit=autocommit, local_infile=local_infile, charset="utf8mb4",
            init_command=(f"SET SESSION sql_mode = '{STRICT_SQL_MODE}', time_zone = '+00:00', "
                          f"innodb_lock_wait_timeout = {int(lock_wait_timeout)}"))

    return raise_translated(open_, lambda exc: translate(
        exc, doing=f"connecting to MariaDB {address.where()}", address=address))


def error_code(exc: BaseException) -> int | None:
    """MariaDB's error number of a PyMySQL error (``None`` for anything else)."""
    try:
        import pymysql
    except ImportError:  # pragma: no cover - translate runs where a connection ran
        return None
    if isinstance(exc, pymysql.err.MySQLError) and exc.args and isinstance(exc.args[0], int):
        return int(exc.args[0])
    return None


def translate(exc: BaseException, *, doing: str, address: Address, sink_id: str | None = None,
              values: bool = False, **ids: Any) -> ConnectorError:
    """The library's error for ``exc`` (see the module docstring)."""
    if isinstance(exc, ConnectorError):
        return exc
    code = error_code(exc)
    text = address.redact(str(exc.args[1]) if len(exc.args) > 1 else str(exc))
    context: dict[str, Any] = {"sink_id": sink_id, **ids}
    if code is None:
        if isinstance(exc, OSError | EOFError | TimeoutError):
            return TransientError(f"{doing}: the connection failed ({type(exc).__name__})",
                                  **context)
        return ConnectorError(f"{doing}: {type(exc).__name__}", **context)
    said = f"MariaDB error {code}" + (f": {text}" if values else "")
    if isinstance(getattr(exc, "original_exception", None), ssl.SSLError):
        # A TLS handshake that failed (a certificate not verified, no TLS on the server):
        # settings, not an outage; PyMySQL keeps the ssl module's error beside its own.
        return ConfigurationError(
            f"{doing}: TLS failed: {text}: check ssl_ca (the CA that signed the server's "
            "certificate), ssl_verify_identity (the host name must be one the certificate "
            "names) and that the server has TLS enabled", **context)
    if code in TRANSIENT:
        # Connection and lock errors quote no row: the server's text helps.
        return TransientError(f"{doing}: MariaDB error {code}: {text}", **context)
    if code in CONFIGURATION:
        return ConfigurationError(f"{doing}: MariaDB error {code}: {text}: check the user, "
                                  "its password and privileges, and the database", **context)
    if code in BAD_INPUT:
        columns = _COLUMN.findall(text)
        where = f" (column {columns[-1]!r})" if columns else ""
        return BadInputError(
            f"{doing}: the server refused the batch's values{where}, {said}; nothing was "
            "committed. Fix the rows or the table (values_in_errors=True quotes the "
            "server's message, which may hold row values)", **context)
    return ConnectorError(f"{doing}: {said}" + ("" if values else
                          " (its message is not quoted: it may hold row values)"), **context)


def raise_translated(fn: Callable[[], T], error: Callable[[Exception], BaseException]) -> T:
    """``fn()``; a failure raised as ``error(exc)`` outside the ``except`` block
    (:func:`connectors.core.translated.raise_translated`: no ``__context__`` keeps the
    driver's exception, whose text may hold row values)."""
    return translated(fn, error, Exception)
