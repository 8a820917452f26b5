"""Executor side: task connections reused across the tasks of one Python worker.

Connecting costs more than a small micro-batch's whole write (TCP, SCRAM authentication,
backend start: ~6-9 ms here), and Spark reuses its Python workers between tasks
(``spark.python.worker.reuse``, on by default). After ``PREPARE TRANSACTION`` the session
no longer owns the transaction, so the same connection can begin the next task's.

Only a connection that ended cleanly (prepared, session idle) is given back; one that
failed, was aborted or is in any doubt is closed. A reused connection that turns out dead
(the server restarted) is replaced by a fresh one, once, before the transaction begins:
nothing was written on it, so there is nothing to lose.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import psycopg
from psycopg.pq import TransactionStatus

__all__ = ["IDLE_SECONDS", "MAX_IDLE", "TaskConnections"]

logger = logging.getLogger("connectors.postgres")

#: A connection idle longer than this is closed rather than reused (servers and proxies
#: drop idle sessions; the check is cheaper than a failed first statement).
IDLE_SECONDS = 60.0
#: Idle connections kept per (conninfo, options) in one Python worker.
MAX_IDLE = 2

Connect = Callable[[], "psycopg.Connection[Any]"]


class TaskConnections:
    """Idle task connections of this process, keyed by a digest of the connection settings.

    The key is a SHA-256 digest: the conninfo (with its password) is never kept as a key.
    """

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _idle: ClassVar[dict[str, list[tuple[psycopg.Connection[Any], float]]]] = {}

    @staticmethod
    def key(*parts: str) -> str:
        return hashlib.sha256("\x00".join(parts).encode()).hexdigest()

    @classmethod
    def take(cls, key: str) -> psycopg.Connection[Any] | None:
        """An idle, healthy connection for ``key``, or ``None``."""
        now = time.monotonic()
        while True:
            with cls._lock:
                idle = cls._idle.get(key)
                if not idle:
                    return None
                conn, since = idle.pop()
            if (
                now - since <= IDLE_SECONDS
                and not conn.closed
                and not conn.broken
                and conn.info.transaction_status is TransactionStatus.IDLE
            ):
                return conn
            cls._close(conn)

    @classmethod
    def give_back(cls, key: str, conn: psycopg.Connection[Any]) -> None:
        """Keep ``conn`` for the next task if it is idle and healthy, else close it."""
        if conn.closed or conn.broken or conn.info.transaction_status is not TransactionStatus.IDLE:
            cls._close(conn)
            return
        with cls._lock:
            idle = cls._idle.setdefault(key, [])
            if len(idle) < MAX_IDLE:
                idle.append((conn, time.monotonic()))
                return
        cls._close(conn)

    @classmethod
    def clear(cls) -> int:
        """Close every idle connection (tests, and processes about to fork)."""
        with cls._lock:
            conns = [c for idle in cls._idle.values() for c, _ in idle]
            cls._idle.clear()
        for conn in conns:
            cls._close(conn)
        return len(conns)

    @staticmethod
    def _close(conn: psycopg.Connection[Any]) -> None:
        try:
            conn.close()
        except Exception as exc:  # pragma: no cover - closing a dead socket
            logger.debug("closing an idle task connection failed: %s", type(exc).__name__)
