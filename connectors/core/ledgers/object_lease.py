"""One driver per sink on an object store: a lease object renewed by compare-and-swap.

An object store has no ``flock`` that dies with its process, so the lease is an object
(``<ledger>/lease``) that its holder rewrites every :data:`RENEW_S` seconds with
``replace`` (S3 ``If-Match``): each renewal changes its version token. Another driver of
the sink reads it and decides by what *it* sees, on its own monotonic clock (no clocks are
compared across machines):

- absent, or released by a clean ``close()``: it takes the lease (``create`` /
  ``replace``: one of several contenders wins);
- its holder provably dead: the same machine (boot id) and pid namespace, and that pid is
  gone or is another process (its start time differs): taken at once, so a driver
  restarted on the machine where it was SIGKILLed waits for nothing;
- renewed while it watches: a live holder. It waits up to :data:`WAIT_S` (a previous
  driver still shutting down), then fails with :class:`FencedError` naming the holder;
- unchanged for :data:`EXPIRY_S` of its own clock: the holder stopped renewing (killed
  on another machine, partitioned): taken over with ``replace`` on the version it watched.

The holder stops trusting its lease :data:`TRUST_S` after its last successful renewal
(:meth:`ObjectLease.check` raises, and a renewal that finds the object changed marks it
lost), before anyone else can take it over (:data:`EXPIRY_S` after that renewal at the
earliest): the margin between them bounds how long a driver may stall between its check
and its commit before a successor could start committing too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from connectors.core.errors import FencedError, TransientError
from connectors.core.ledgers.object_ledger import ObjectStore

__all__ = ["EXPIRY_S", "RENEW_S", "TRUST_S", "WAIT_S", "ObjectLease", "process_identity"]

logger = logging.getLogger(__name__)

#: The holder rewrites the lease this often.
RENEW_S = 5.0
#: The holder trusts its lease for this long after its last successful renewal.
TRUST_S = 20.0
#: A lease unchanged for this long (watched on the contender's own clock) is taken over.
EXPIRY_S = 35.0
#: How long a contender waits for a live holder before it fails.
WAIT_S = 15.0
_POLL_S = 0.5
_KEY = "lease"


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat)."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


def process_identity() -> dict[str, Any]:
    """What names this process across machines, containers and pid reuse: host name, boot
    id, pid namespace, pid and start time (Linux; elsewhere the last three may be ``None``,
    and a holder is then only ever taken over after :data:`EXPIRY_S`)."""
    try:
        pidns: str | None = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = None
    return {"host": socket.gethostname(), "boot": _read("/proc/sys/kernel/random/boot_id"),
            "pidns": pidns, "pid": os.getpid(), "started": _start_time(os.getpid())}


def _provably_dead(holder: dict[str, Any], me: dict[str, Any]) -> bool:
    if not me["boot"] or not me["pidns"] or holder.get("boot") != me["boot"] \
            or holder.get("pidns") != me["pidns"] or not holder.get("started"):
        return False
    pid = holder.get("pid")
    if not isinstance(pid, int):
        return False
    return bool(_start_time(pid) != holder["started"])  # gone, or another process


class ObjectLease:
    """The sink's lease in ``store`` (see the module docstring); ``acquire`` once per driver
    run, ``check`` before each commit, ``release`` at ``close``."""

    def __init__(self, store: ObjectStore, *, sink_id: str) -> None:
        self.store = store
        self.sink_id = sink_id
        self._version: str | None = None
        self._record: dict[str, Any] = {}
        self._renewed = 0.0  # monotonic time of the last successful write
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def held(self) -> bool:
        return self._version is not None and self._lost is None

    def _payload(self, beat: int, *, released: bool = False) -> bytes:
        return json.dumps({**self._record, "beat": beat, "released": released}).encode()

    def acquire(self, run_id: str) -> None:
        """Take the lease (waiting as the module docstring says), then renew it in a daemon
        thread until :meth:`release`."""
        if self.held:
            return
        me = process_identity()
        self._record = {"holder": {**me, "run_id": run_id, "since": round(time.time(), 3)}}
        started = time.monotonic()
        watched: tuple[str, float] | None = None  # (version, first seen at)
        renewed = False  # seen the holder renew it: alive
        while True:
            now = time.monotonic()  # before the read: what is seen is at least this fresh
            found = self.store.read(_KEY)
            if found is None:
                version = self.store.create(_KEY, self._payload(0))
            else:
                data, current = found
                record = json.loads(data)
                holder = record.get("holder") or {}
                if watched is None or watched[0] != current:
                    renewed = renewed or watched is not None
                    watched = (current, time.monotonic())  # after the read: a late start
                take = bool(record.get("released")) or _provably_dead(holder, me)
                unchanged = time.monotonic() - watched[1]
                if not take and unchanged >= EXPIRY_S:
                    logger.warning("sink %s: taking over the lease of %s, not renewed for "
                                   "%.0f s", self.sink_id, _who(holder), unchanged)
                    take = True
                if not take:
                    if now - started >= WAIT_S and renewed:
                        raise FencedError(
                            f"another driver holds the lease of this sink ({_who(holder)}, "
                            f"object {self.store.where(_KEY)}) and renews it: two drivers "
                            "must never write one sink at once. Stop the other query (or "
                            "wait for it to end); a driver that died stops renewing, and its "
                            f"lease is taken over {EXPIRY_S:.0f} s later",
                            sink_id=self.sink_id,
                        )
                    time.sleep(_POLL_S)
                    continue
                version = self.store.replace(_KEY, self._payload(0), current)
            if version is not None:
                acquired = now
                break
            watched, renewed = None, False  # another contender won the write: look again
        with self._lock:
            self._version, self._renewed, self._lost = version, acquired, None
        logger.info("sink %s: holds the lease %s", self.sink_id, self.store.where(_KEY))
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, daemon=True,
                                        name=f"connectors-lease-{self.sink_id}")
        self._thread.start()

    def _renew_loop(self) -> None:
        beat = 0
        while not self._stop.wait(RENEW_S):
            beat += 1
            with self._lock:
                version = self._version
            if version is None or self._lost is not None:
                return
            sent = time.monotonic()  # trusted from the request's start, not its answer
            try:  # not under the lock: check() never waits for the store
                new = self.store.replace(_KEY, self._payload(beat), version)
            except Exception as exc:  # a failed renewal: trusted until TRUST_S runs out
                logger.warning("sink %s: renewing the lease failed (%s); trusted for "
                               "%.0f s more", self.sink_id, type(exc).__name__,
                               max(0.0, TRUST_S - (time.monotonic() - self._renewed)))
                continue
            with self._lock:
                if self._version != version:  # released meanwhile
                    return
                if new is None:
                    self._lost = "the lease object changed: another driver took it over"
                    logger.error("sink %s: lost its lease: %s", self.sink_id, self._lost)
                    return
                self._version, self._renewed = new, sent

    def check(self) -> None:
        """Before a commit: raise :class:`FencedError` unless the lease is held and was
        renewed less than :data:`TRUST_S` ago (:class:`TransientError` when renewals only
        failed: the store may be back at the next try)."""
        with self._lock:
            if self._version is None:
                raise FencedError("the sink does not hold its lease", sink_id=self.sink_id)
            if self._lost is not None:
                raise FencedError(f"the sink lost its lease: {self._lost}; this driver must "
                                  "stop writing", sink_id=self.sink_id)
            age = time.monotonic() - self._renewed
        if age >= TRUST_S:
            raise TransientError(
                f"the sink's lease was last renewed {age:.0f} s ago (the object store did not "
                f"answer): it is not trusted after {TRUST_S:.0f} s", sink_id=self.sink_id)

    def release(self) -> None:
        """Stop renewing and mark the lease released (a successor takes it at once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=RENEW_S + 5)
            self._thread = None
        with self._lock:
            version, self._version = self._version, None
            lost = self._lost
        if version is not None and lost is None:
            with contextlib.suppress(Exception):
                self.store.replace(_KEY, self._payload(-1, released=True), version)


def _who(holder: dict[str, Any]) -> str:
    return (f"pid {holder.get('pid')} on {holder.get('host')}, run {holder.get('run_id')}, "
            f"since {holder.get('since')}")
