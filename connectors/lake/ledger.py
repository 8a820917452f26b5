"""The ledger of a sink into a table format (DeltaSink, IcebergSink): a
:class:`~connectors.core.ledgers.file_ledger.FileLedger` next to the table.

The table's own log is the source of truth for "batch N is committed": Delta's commit
carries the sink's ``txn`` action or ``userMetadata`` tag, Iceberg's snapshot the sink's
summary properties. The ledger adds what the table cannot hold: the binding sink ->
streaming query (and its generation), the last batch recorded, and a MERGE batch's
fingerprint, which is known only once the MERGE ran (observed during its job) and so cannot
be in that commit's own metadata. An append records none: its replay is compared with the
files its commit added.

Default location ``<table location>/_connectors/<sink_id>/``: Delta ignores ``_``-prefixed
directories when it reads, and VACUUM leaves them alone; Iceberg reads only the files its
metadata lists, and its orphan-file removal skips ``_``-prefixed directories (both tested).
``ledger_path=`` puts it elsewhere (needed when the table is not on a local/POSIX file
system and not on an object store: :mod:`connectors.lake.object_ledger`).

Two records serve a commit that carries no idempotency key the format enforces itself
(DeltaSink's default "tag" path; IcebergSink always):

- ``intents/<batch>.json``: written (fsynced) before the batch's commit is attempted.
  A batch with neither a decision nor an intent was never attempted, so it is written
  without asking the table; one with an intent and no decision has an unknown outcome
  (the driver died or the write failed after the intent), which the sink settles from the
  table's history (the commit's tag). Intents of recorded batches are pruned.
- ``lease``: an exclusive ``flock`` held by the driver process from the start of its run
  (:meth:`TableLedger.open_run`) until :meth:`close`. A second driver of the same sink
  waits :data:`LEASE_WAIT_S`, then fails with :class:`~connectors.core.errors.FencedError`
  naming the holder. The kernel drops the lock when its process dies (SIGKILL included),
  so a restarted driver gets it at once. It stands in for a conflict check on the
  idempotency key, which such a commit does not get.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from connectors.core.errors import ConfigurationError, FencedError
from connectors.core.ledgers.file_ledger import FileLedger, write_atomic
from connectors.lake.store import local_path

__all__ = [
    "LEASE_WAIT_S",
    "TableLedger",
    "intent_record",
    "ledger_root",
    "parse_intent",
    "refuse_lost_ledger",
]

#: How long a driver waits for the sink's lease before it fails: long enough for a previous
#: driver of the same sink that is still shutting down (its lease goes with its process).
LEASE_WAIT_S = 15.0
_LEASE_POLL_S = 0.2

# One lease per ledger directory and process: resolved root -> [fd, holders]. Two sink
# objects of one sink id in one process (a notebook re-creating its query) share it.
_LEASES: dict[str, list[int]] = {}
_LEASES_LOCK = threading.Lock()


def refuse_lost_ledger(where: str, sink_id: str, version: int | None) -> None:
    """A ledger found empty while the table records batch ``version`` of the sink's first
    app id was lost: refuse rather than guess which batches the sink wrote."""
    if version is not None:
        raise ConfigurationError(
            f"the sink's ledger at {where} is empty, but the table already "
            f"records batch {version} of app id {sink_id!r}: the ledger was "
            "deleted or ledger_path changed, so the sink can no longer tell which "
            "batches it wrote. Restore the ledger directory (or the old ledger_path), "
            "or write with a new sink_id",
            sink_id=sink_id,
        )


def intent_record(batch_id: int, app_id: str, run_id: str) -> bytes:
    """An intent's bytes: ``run_id`` is about to attempt ``batch_id`` under ``app_id``."""
    return json.dumps({"batch_id": batch_id, "app": app_id, "run_id": run_id,
                       "at": round(time.time(), 3)}).encode()


def parse_intent(data: bytes | None, batch_id: int, app_id: str) -> dict[str, Any] | None:
    """The intent in ``data`` if it is one of ``app_id`` (see :meth:`TableLedger.intent`)."""
    if data is None:
        return None
    try:
        found = dict(json.loads(data))
    except ValueError:  # torn by an operating-system crash: an attempt, time unknown
        return {"batch_id": batch_id, "app": app_id, "run_id": "?", "at": 0.0}
    return found if found.get("app") == app_id else None


def ledger_root(ledger_path: str | None, location: Callable[[], str], sink_id: str) -> Path:
    """The ledger's directory: ``ledger_path``, else ``<table location>/_connectors/<sink_id>``
    (``location()`` is asked only then; a table not on a local file system is refused)."""
    if ledger_path is not None:
        return Path(ledger_path)
    local = local_path(location())
    if local is None:
        raise ConfigurationError(
            f"the table at {location()} is not on a local file system, so the "
            "sink cannot keep its ledger next to it: pass ledger_path='/a/local/or/"
            "shared/posix/dir'",
            sink_id=sink_id,
        )
    return local / "_connectors" / sink_id


class TableLedger(FileLedger):
    """A FileLedger that refuses to start empty next to a table that knows the sink.

    ``probe(app_id)`` returns the table's committed version for an app id (or ``None``);
    a ledger found empty while the table knows the sink's first app id was lost (deleted,
    or ``ledger_path`` changed): the sink refuses rather than guess.

    Decisions are not fsynced (``durable_decisions = False``): each is written after its
    table commit, which holds the sink's tag durably, so a decision that an operating-system
    crash loses or tears only sends the batch's replay through the reconcile path (the table
    has the batch: the replay is checked against it, an append's content or a MERGE's source
    row count, and the decision recorded again). The death of the process alone loses
    nothing (the page cache holds the file). The binding and abort records stay durable.
    Saves an fsync per batch, which on ext4 waits for the journal holding the Parquet files
    Spark wrote (what it costs: benchmarks/README.md).
    """

    durable_decisions = False

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        sink_id: str,
        probe: Callable[[str], int | None] | None = None,
    ) -> None:
        super().__init__(root, sink_id=sink_id)
        self._probe = probe
        self._intents = self.root / "intents"
        self._lease_key: str | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r}, sink_id={self.sink_id!r})"

    def bind_query(self, query_id: str, *, reset: bool = False) -> int:
        if self.bound_query() is None and self._probe is not None:
            refuse_lost_ledger(str(self.root), self.sink_id, self._probe(self.sink_id))
        return super().bind_query(query_id, reset=reset)

    # ---- the lease: one driver process per sink at a time ----
    def open_run(self, run_id: str) -> None:
        """Take the sink's lease (once per ledger object; kept until :meth:`close`)."""
        if self._lease_key is not None:
            return
        self._ensure()
        key = str(self.root.resolve())
        with _LEASES_LOCK:
            held = _LEASES.get(key)
            if held is not None:
                held[1] += 1
                self._lease_key = key
                return
            fd = os.open(self.root / "lease", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                self._flock(fd)
                holder = {"pid": os.getpid(), "host": socket.gethostname(), "run_id": run_id,
                          "since": round(time.time(), 3)}
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(holder).encode(), 0)
            except BaseException:
                os.close(fd)
                raise
            _LEASES[key] = [fd, 1]
            self._lease_key = key

    def _flock(self, fd: int) -> None:
        deadline = time.monotonic() + LEASE_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
            if time.monotonic() >= deadline:
                try:
                    holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
                except OSError:
                    holder = "?"
                raise FencedError(
                    f"another driver holds the lease of this sink ({holder or 'unknown'}, "
                    f"file {self.root / 'lease'}): two drivers must never write one sink at "
                    "once. Stop the other query (or wait for it to end); the lease goes "
                    "with its process",
                    sink_id=self.sink_id,
                )
            time.sleep(_LEASE_POLL_S)

    def close(self) -> None:
        """Release the lease (the last holder in this process closes it)."""
        key, self._lease_key = self._lease_key, None
        if key is not None:
            with _LEASES_LOCK:
                held = _LEASES.get(key)
                if held is not None:
                    held[1] -= 1
                    if held[1] <= 0:
                        del _LEASES[key]
                        with contextlib.suppress(OSError):
                            fcntl.flock(held[0], fcntl.LOCK_UN)
                        os.close(held[0])
        super().close()

    # ---- intents: "the commit of batch N is being attempted" ----
    def intend(self, batch_id: int, app_id: str, run_id: str) -> None:
        """Record, durably, that ``run_id`` is about to attempt the commit of ``batch_id``
        under app id ``app_id`` (the sink id and binding generation).

        Called by the driver before every attempt; an intent of the same app id is kept."""
        if self.intent(batch_id, app_id) is not None:
            return
        self._intents.mkdir(parents=True, exist_ok=True)
        write_atomic(self._intent_path(batch_id), intent_record(batch_id, app_id, run_id))

    def _intent_path(self, batch_id: int) -> Path:
        return self._intents / f"{batch_id:020d}.json"

    def intent_where(self, batch_id: int) -> str:
        """Where ``batch_id``'s intent is kept (for messages that tell an operator what to
        remove)."""
        return str(self._intent_path(batch_id))

    def intent(self, batch_id: int, app_id: str) -> dict[str, Any] | None:
        """The intent recorded for ``batch_id`` of ``app_id`` (keys ``batch_id``, ``app``,
        ``run_id``, ``at``: wall-clock seconds), or ``None``. One of another app id (an
        earlier binding generation, before a ``reset_binding``) is not this batch's."""
        try:
            data = self._intent_path(batch_id).read_bytes()
        except FileNotFoundError:
            return None
        return parse_intent(data, batch_id, app_id)

    def check_lease(self) -> None:
        """Before a commit: the ``flock`` is the kernel's until the process dies (nothing to
        check; the object-store ledger's lease can expire)."""

    def prune(self, keep: int) -> None:
        super().prune(keep)
        # An intent is spent once its batch is recorded (batches are recorded in order).
        last = self.last_batch_id()
        if last is None or not self._intents.is_dir():
            return
        for path in self._intents.glob("*.json"):
            stem = path.name.split(".")[0]
            if stem.isdigit() and int(stem) <= last:
                path.unlink(missing_ok=True)
