"""Executor side: task connections reused across the tasks of one Python worker.

Connecting costs more than a small micro-batch's whole write (TCP, SCRAM authentication,
backend start: ~6-9 ms here), and Spark reuses its Python workers between tasks
(``spark.python.worker.reuse``, on by default). The task connections are autocommit
sessions whose transaction is plain SQL (``BEGIN`` ... ``PREPARE TRANSACTION``): after the
``PREPARE`` the session no longer owns the transaction and is idle, so the same connection
can ``BEGIN`` the next task's. No client-side two-phase-commit state is carried over.

Only a connection that ended cleanly (prepared, session idle) is given back, and only an
idle one is handed out; one that failed, was aborted or is in any doubt is closed. A
reused connection that turns out dead (the server restarted) is replaced by a fresh one,
once, before the transaction begins: nothing was written on it, so there is nothing to
lose. The pool itself is :class:`connectors.core.pool.IdlePool`.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from connectors.core.pool import IdlePool

__all__ = ["IDLE_SECONDS", "MAX_IDLE", "TaskConnections", "connected_before",
           "record_connected"]

#: A connection idle longer than this is closed rather than reused (servers and proxies
#: drop idle sessions; the check is cheaper than a failed first statement).
IDLE_SECONDS = 60.0
#: Idle connections kept per (conninfo, options) in one Python worker.
MAX_IDLE = 2


def _idle_session(conn: psycopg.Connection[Any]) -> bool:
    """Open, not broken, autocommit, and outside any transaction (the prepared one left
    the session)."""
    return (not conn.closed and not conn.broken and conn.autocommit
            and conn.info.transaction_status is TransactionStatus.IDLE)


#: Idle task connections of this process, keyed by a digest of the connection settings
#: (the conninfo, with its password, is never kept as a key).
TaskConnections: IdlePool[psycopg.Connection[Any]] = IdlePool(
    "task connection", idle_seconds=IDLE_SECONDS, max_idle=MAX_IDLE, usable=_idle_session,
    close=lambda conn: conn.close(),
)

#: Keys (digests, as in the pool) whose settings connected in this process at least once.
_REACHED: set[str] = set()


def record_connected(key: str) -> None:
    """The settings of ``key`` connected: a later failure to connect is not a bad setting."""
    _REACHED.add(key)


def connected_before(key: str) -> bool:
    """Did the settings of ``key`` connect in this process before?"""
    return key in _REACHED
