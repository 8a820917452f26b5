"""A first connection that failed: a server that is down, or settings it refused?

libpq gives a failure to connect no SQLSTATE, and its text is in the client's or the
server's language, so neither says whether to wait or to stop. libpq's documented
``PQping`` does (psycopg: :meth:`psycopg.pq.PGconn.ping`): it reports whether a server
answers at the settings' address and accepts connections, whatever the user, password or
database name:

- ``OK``: a server answered and would accept a connection: it refused *these* settings
  (password, role, database, ``pg_hba.conf``): a configuration error, at once;
- ``REJECT``: a server answered "not now" (starting, shutting down, in recovery: SQLSTATE
  57P03): it is restarting, a transient error;
- ``NO_RESPONSE``: nothing answered. Either the server is down (restarting, failing over)
  or host and port name no server. A host name that does not resolve is a configuration
  error at once; otherwise it is a transient error, :class:`TargetDownError`, which the
  sink rides out within its ``outage_timeout`` and which ends the batch past it, naming
  host and port among the things to check;
- ``NO_ATTEMPT``: the settings are unusable: a configuration error.

A TLS failure recognised by libpq's text is a configuration error before any ping: a
server with the wrong certificate answers nothing ``PQping`` counts as an answer.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import pq

from connectors.core.errors import ConnectorError, TransientError
from connectors.postgres._config import Conninfo

__all__ = ["PING_TIMEOUT", "TargetDownError", "first_contact"]

logger = logging.getLogger(__name__)

#: Seconds a ping may take (the conninfo's own ``connect_timeout`` when it is shorter).
PING_TIMEOUT = 5


class TargetDownError(TransientError):
    """No PostgreSQL server answers at the settings' address now (or it is starting).

    Transient: the sink waits for the server within its ``outage_timeout``. The operator
    CLI exits "unreachable" (3) for it, as for :class:`CannotConnectError`.
    """

    cannot_connect = True


def _ping(conninfo: Conninfo) -> pq.Ping:
    """libpq's ``PQping`` on the settings (bounded by :data:`PING_TIMEOUT`)."""
    timeout = conninfo.param("connect_timeout")
    bound = min(int(timeout), PING_TIMEOUT) if timeout and timeout.isdigit() else PING_TIMEOUT
    dsn = psycopg.conninfo.make_conninfo(conninfo.secret, connect_timeout=str(max(bound, 2)))
    return pq.Ping(pq.PGconn.ping(dsn.encode()))


def _unresolved(conninfo: Conninfo) -> list[str]:
    """The host names of the settings that do not resolve, when none of them does (and
    no ``hostaddr`` makes names irrelevant); else ``[]``."""
    if conninfo.param("hostaddr"):
        return []
    hosts = [h.strip() for h in (conninfo.param("host") or os.environ.get("PGHOST", "")).split(",")]
    names = [h for h in hosts if h and not h.startswith(("/", "@"))]
    if not names or len(names) < len([h for h in hosts if h]):
        return []  # a Unix socket directory among them: nothing to resolve
    missing = []
    for name in names:
        try:
            socket.getaddrinfo(name, None)
        except socket.gaierror as exc:
            if exc.errno != socket.EAI_NONAME:
                return []  # a DNS server that did not answer: may pass
            missing.append(name)
        else:
            return []
    return missing


def first_contact(
    *,
    doing: str,
    conninfo: Conninfo | None,
    text: str,
    refused: Callable[[str | None], ConnectorError],
    ids: dict[str, Any],
    ping: Callable[[Conninfo], pq.Ping] | None = None,
) -> ConnectorError:
    """The error for a failure of the first connect of these settings in this process
    (``text``: its words, secrets masked; ``refused(advice)``: the configuration error,
    with other advice than the default's when given).

    Example::

        >>> from connectors.core.errors import ConfigurationError
        >>> from connectors.postgres._config import Conninfo
        >>> err = first_contact(
        ...     doing="connecting", conninfo=Conninfo("host=localhost port=5433"),
        ...     text="connection refused", refused=lambda _: ConfigurationError("refused"),
        ...     ids={}, ping=lambda _: pq.Ping.NO_RESPONSE)
        >>> type(err).__name__, isinstance(err, TransientError)
        ('TargetDownError', True)
    """
    if conninfo is None:
        return refused(None)
    try:
        verdict = (ping or _ping)(conninfo)
    except Exception as exc:  # a ping that cannot run decides nothing
        # Its type only: a conninfo parser's text could quote the settings.
        logger.debug("PQping on %s could not run (%s)", conninfo.where(), type(exc).__name__)
        return refused(None)
    where = conninfo.where()
    if verdict is pq.Ping.REJECT:
        return TargetDownError(
            f"{doing}: the PostgreSQL server at {where} does not accept connections yet "
            f"(starting, shutting down or recovering): {text}", **ids)
    if verdict is not pq.Ping.NO_RESPONSE:
        return refused(None)
    if missing := _unresolved(conninfo):
        return refused(f"the host name {', '.join(missing)} does not resolve: check host")
    return TargetDownError(
        f"{doing}: no PostgreSQL server answers at {where}: if it is restarting, the sink "
        f"waits for it (its outage_timeout); if it never answers, check host and port "
        f"(server: {text})", **ids)
