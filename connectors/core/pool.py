"""Executor side: clients a Python worker keeps between the tasks it runs.

Spark reuses its Python workers between tasks (``spark.python.worker.reuse``, on by
default), so a client that a task ended cleanly with (a PostgreSQL session after its
``PREPARE``, a Kafka slot producer after its commit, a marker reader after a clean read)
can serve the next task of the same worker instead of a new connection, handshake and
authentication. One :class:`IdlePool` per kind of client holds the idle ones:

- keyed by a SHA-256 digest of the client's settings (:meth:`IdlePool.key`), so that a
  secret in a connection string or client config is never kept in clear;
- at most ``max_idle`` per key; a newcomer to a full key evicts (closes) the oldest;
- a client idle longer than ``idle_seconds`` is closed instead of handed out (servers and
  brokers drop idle connections; the check is cheaper than a failed first request);
- ``usable`` is asked on the way in and on the way out: a client in any doubt is closed.

What makes reusing each kind of client safe is argued where it is used
(:mod:`connectors.postgres._pool`, :mod:`connectors.kafka._pool`).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["IdlePool"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _always(_item: object) -> bool:
    return True


def _drop(_item: object) -> None:
    """Closing by dropping the last reference (clients that close when collected)."""


class IdlePool(Generic[T]):
    """Idle clients of one kind in this process, by key (see the module docstring).

    Example::

        >>> pool: IdlePool[list[int]] = IdlePool("example", idle_seconds=60, max_idle=1)
        >>> key = IdlePool.key("postgresql://app:secret@db/prod", "30s")
        >>> pool.take(key) is None
        True
        >>> pool.give_back(key, [1])
        >>> pool.take(key)
        [1]
    """

    def __init__(
        self,
        what: str,
        *,
        idle_seconds: float,
        max_idle: int,
        usable: Callable[[T], bool] = _always,
        close: Callable[[T], None] = _drop,
    ) -> None:
        self.what = what
        self.idle_seconds = idle_seconds
        self.max_idle = max_idle
        self._usable = usable
        self._close = close
        self._lock = threading.Lock()
        self._idle: dict[str, list[tuple[T, float]]] = {}

    def __repr__(self) -> str:
        return f"IdlePool({self.what!r}, idle={sum(map(len, self._idle.values()))})"

    @staticmethod
    def key(*parts: str) -> str:
        """A key for ``parts`` (which may hold secrets: only their digest is kept)."""
        return hashlib.sha256("\x00".join(parts).encode()).hexdigest()

    def take(self, key: str) -> T | None:
        """The most recently kept usable client for ``key``, or ``None``."""
        now = time.monotonic()
        while True:
            with self._lock:
                idle = self._idle.get(key)
                if not idle:
                    return None
                item, since = idle.pop()
            if now - since <= self.idle_seconds and self._usable(item):
                return item
            self.close(item)

    def give_back(self, key: str, item: T) -> None:
        """Keep ``item`` for the next task if it is usable, else close it."""
        if not self._usable(item):
            self.close(item)
            return
        evicted: list[T] = []
        with self._lock:
            idle = self._idle.setdefault(key, [])
            idle.append((item, time.monotonic()))
            while len(idle) > self.max_idle:
                evicted.append(idle.pop(0)[0])
        for old in evicted:
            self.close(old)

    def clear(self) -> int:
        """Close every idle client (tests, and processes about to fork); how many."""
        with self._lock:
            items = [item for idle in self._idle.values() for item, _ in idle]
            self._idle.clear()
        for item in items:
            self.close(item)
        return len(items)

    def close(self, item: T) -> None:
        """Close ``item`` quietly (it is being dropped; its failure matters to no one)."""
        try:
            self._close(item)
        except Exception as exc:  # pragma: no cover - closing a broken client
            logger.debug("closing an idle %s failed: %s", self.what, type(exc).__name__)
