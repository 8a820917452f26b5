"""Graceful stops, the core's part: which queries were asked to stop, which are in a batch.

A graceful stop lets the batch in flight finish (in the target and in the engine's commit
log) and refuses the next one. The template asks :func:`stop_requested` at the start of
every streaming batch, before any side effect, and raises
:class:`~connectors.core.errors.GracefulStop` when a stop was requested and no other sink of
the query has begun that batch (a ``foreachBatch`` function that writes several sinks
finishes the batch in all of them): the engine then records no commit for that batch and
replays it at the next start. Between
:func:`enter_batch` and :func:`leave_batch` a query is *busy*: the stop helper
(:func:`connectors.stop_gracefully`) never stops a busy query itself; it waits for the
batch to end.

This registry is process memory: it serves the engine adapters whose sink runs in the
process that asks for the stop (classic PySpark). An engine whose sink runs elsewhere
(Spark Connect's foreachBatch worker) carries the request its own way as well (see
:mod:`connectors.spark._stop`); the template asks the batch input
(:meth:`~connectors.core.batch.BatchInput.stop_requested`), which asks both.

Example::

    >>> request_stop("q-1")
    >>> stop_requested("q-1"), stop_requested("q-2")
    (True, False)
    >>> withdraw_stop("q-1")
    >>> stop_requested("q-1")
    False
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

from connectors.core.errors import GracefulStop

__all__ = [
    "begun",
    "busy",
    "enter_batch",
    "leave_batch",
    "request_stop",
    "stop_requested",
    "streaming_batch",
    "withdraw_stop",
]

logger = logging.getLogger(__name__)
_lock = threading.Lock()
_requested: set[str] = set()
#: Batches in flight per query id (a query runs one batch at a time; a count is robust to
#: a second sink of the same query).
_in_batch: dict[str, int] = {}
#: The last batch id a sink of each query began in this process: the other sinks of one
#: ``foreachBatch`` function finish that batch even when a stop arrives in between.
_begun: dict[str, int] = {}


def request_stop(query_id: str) -> None:
    """Ask the sinks of query ``query_id`` to refuse their next batch."""
    with _lock:
        _requested.add(query_id)


def withdraw_stop(query_id: str) -> None:
    """Forget a stop request (the query stopped, or the caller changed its mind)."""
    with _lock:
        _requested.discard(query_id)


def stop_requested(query_id: str | None) -> bool:
    """Whether a graceful stop of ``query_id`` was requested in this process."""
    if query_id is None:
        return False
    with _lock:
        return query_id in _requested


def enter_batch(query_id: str, batch_id: int = -1) -> None:
    """A sink of ``query_id`` starts batch ``batch_id``."""
    with _lock:
        _in_batch[query_id] = _in_batch.get(query_id, 0) + 1
        _begun[query_id] = batch_id


def begun(query_id: str, batch_id: int) -> bool:
    """Whether a sink of ``query_id`` already began ``batch_id`` in this process (a stop
    requested since must not refuse the batch to the query's other sinks)."""
    with _lock:
        return _begun.get(query_id) == batch_id


def leave_batch(query_id: str) -> None:
    """A sink of ``query_id`` ended a batch (committed or failed)."""
    with _lock:
        left = _in_batch.get(query_id, 0) - 1
        if left > 0:
            _in_batch[query_id] = left
        else:
            _in_batch.pop(query_id, None)


def busy(query_id: str) -> bool:
    """Whether a sink of ``query_id`` is in a batch in this process."""
    with _lock:
        return _in_batch.get(query_id, 0) > 0


@contextlib.contextmanager
def streaming_batch(query_id: str, batch_id: int, *, stopping: Callable[[], bool],
                    sink_id: str) -> Iterator[None]:
    """The span of a streaming batch of ``sink_id`` (a sink or a fan-out): refused with
    :class:`~connectors.core.errors.GracefulStop`, before any side effect, when
    ``stopping()`` (a graceful stop was requested) and no other sink of the query began the
    batch (the engine then records no commit for it and replays it at the next start);
    while it runs, the query is busy (the stop helper waits for it to end)."""
    if not begun(query_id, batch_id) and stopping():
        logger.info("sink %s: graceful stop requested: batch %d is not started; it is "
                    "replayed when the query starts again", sink_id, batch_id)
        raise GracefulStop(
            f"a graceful stop of query {query_id} was requested: batch {batch_id} was "
            "not started (it is replayed when the query starts again)",
            sink_id=sink_id, batch_id=batch_id)
    enter_batch(query_id, batch_id)
    try:
        yield
    finally:
        leave_batch(query_id)
