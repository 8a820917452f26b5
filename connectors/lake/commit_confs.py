"""Session confs that tag one commit of a table format: set for the commit, then unset.

Some commits take their tag only from the session, not from a write option: Delta's MERGE
its ``userMetadata`` and txn id (``spark.databricks.delta.*``, delta-io/delta#3934), Iceberg's
SQL MERGE its snapshot summary (``spark.sql.iceberg.snapshot-property.<key>``). Session confs
are seen by every statement of the session, so :func:`commit_confs` decides who may share
them while they are set:

- classic ``foreachBatch``: the batch's session is the streaming query's own clone, so two
  queries never see each other's confs (no lock);
- a batch job's ``sink(df, run_id)`` may run on a session other threads share: commits on
  it are serialized by a process-wide lock;
- Spark Connect: every query of a client session runs its ``foreachBatch`` in a worker
  process of its own on the server's host, all on the client's one session: commits of one
  session are serialized across processes by a file lock named after the session.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from connectors.spark.toolkit import is_connect

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["commit_confs"]

#: Serializes tagged commits on a session that is not a streaming query's own clone.
_SHARED_SESSION_LOCK = threading.Lock()


@contextlib.contextmanager
def commit_confs(session: SparkSession, confs: Mapping[str, str], *, streaming: bool,
                 unset: Iterable[str] | None = None) -> Iterator[None]:
    """``confs`` set on ``session`` for the block, under the lock its kind of session needs
    (the module docstring); afterwards the keys of ``unset`` (default: ``confs``' keys)
    are unset, whether the block failed or not. ``streaming``: the session is a streaming
    query's own (``foreachBatch`` in classic PySpark)."""
    if is_connect(session):
        lock: contextlib.AbstractContextManager[object] = _session_file_lock(session)
    else:
        lock = contextlib.nullcontext() if streaming else _SHARED_SESSION_LOCK
    with lock:
        conf = session.conf
        try:
            for key, value in confs.items():
                conf.set(key, value)
            yield
        finally:
            for key in (confs if unset is None else unset):
                conf.unset(key)


@contextlib.contextmanager
def _session_file_lock(session: SparkSession) -> Iterator[None]:
    """An exclusive lock, across the processes of this host, on a Connect session."""
    import fcntl
    import tempfile
    from pathlib import Path

    name = "".join(c for c in str(getattr(session, "session_id", "")) if c.isalnum() or c == "-")
    path = Path(tempfile.gettempdir()) / f"connectors-merge-{name or 'session'}.lock"
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
