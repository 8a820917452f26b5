"""The ledger of a sink into a table format beside a table on an object store (S3, GCS,
Azure).

The same records as :class:`~connectors.lake.ledger.TableLedger` under
``<table>/_connectors/<sink_id>/``, written with the store's own atomic primitives
(:class:`~connectors.core.ledgers.object_ledger.ObjectLedger`), and the same two records of the tag
path:

- ``intents/<batch>.json``: created before the batch's table commit is attempted (one PUT;
  an object store acknowledges a write only once it is durable);
- ``lease``: :class:`~connectors.core.ledgers.object_lease.ObjectLease`, a lease object renewed by
  compare-and-swap from the start of a driver run until :meth:`close`. A second driver of
  the sink is kept out (it sees the lease renewed and fails after
  :data:`~connectors.core.ledgers.object_lease.WAIT_S`); a driver restarted on the machine where
  the last one died takes it at once; one restarted elsewhere waits
  :data:`~connectors.core.ledgers.object_lease.EXPIRY_S`. Before each table commit the sink checks
  that it still holds the lease (:meth:`check_lease`).

What a batch costs the store once the run started (measured, ``ledger_requests``): the
intent (1 PUT), the decision (1 conditional PUT), the spent intent (1 DELETE): 3; once more
than ``keep_batches`` decisions are kept, pruning adds 1 GET and 1 DELETE of the oldest
decision: 5. The lease's renewal every 5 s in the background; no LIST.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from connectors.core.ledgers.object_lease import ObjectLease
from connectors.core.ledgers.object_ledger import ObjectLedger, ObjectStore
from connectors.lake.ledger import (
    TableLedger,
    intent_record,
    ledger_root,
    parse_intent,
    refuse_lost_ledger,
)
from connectors.lake.store import ObstoreStore, options_for, store_url

__all__ = ["TableObjectLedger", "open_ledger"]

# One lease per ledger prefix and process: its address -> [lease, holders]. Two sink
# objects of one sink id in one process (a notebook re-creating its query) share it.
_LEASES: dict[str, list[Any]] = {}
_LEASES_LOCK = threading.Lock()


class TableObjectLedger(ObjectLedger):
    """An :class:`ObjectLedger` that refuses to start empty beside a table that knows the
    sink, with the tag path's intents and a lease (see the module docstring).

    ``probe(app_id)`` returns the table's committed batch for an app id (or ``None``).
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        sink_id: str,
        probe: Callable[[str], int | None] | None = None,
    ) -> None:
        super().__init__(store, sink_id=sink_id)
        self._probe = probe
        self._lease_key: str | None = None
        self._intent_ids: set[int] | None = None  # while the lease is held
        self._requests_seen = 0

    def bind_query(self, query_id: str, *, reset: bool = False) -> int:
        if self.bound_query() is None and self._probe is not None:
            refuse_lost_ledger(self.store.where(), self.sink_id, self._probe(self.sink_id))
        return super().bind_query(query_id, reset=reset)

    def take_requests(self) -> int:
        """The requests this ledger made of its store since the last call (the lease's own
        renewals aside), for the batch's metrics; 0 where the store does not count them."""
        count = int(getattr(self.store, "requests", 0))
        taken, self._requests_seen = count - self._requests_seen, count
        return taken

    # ---- the lease ----
    def open_run(self, run_id: str) -> None:
        """Take the sink's lease (once per ledger object; kept until :meth:`close`)."""
        if self._lease_key is not None:
            return
        key = self.store.where("lease")
        with _LEASES_LOCK:
            held = _LEASES.get(key)
            if held is None:
                lease = ObjectLease(self.store, sink_id=self.sink_id)
                lease.acquire(run_id)
                held = _LEASES[key] = [lease, 0]
            held[1] += 1
            self._lease_key = key
        self.hold(True)
        self._intent_ids = {b for k in self.store.keys("intents/")
                            if (b := _intent_batch(k)) is not None}

    def check_lease(self) -> None:
        """Before a commit: this driver still holds the sink's lease
        (:meth:`ObjectLease.check <connectors.core.ledgers.object_lease.ObjectLease.check>`)."""
        if self._lease_key is None:
            return  # an operator tool's ledger: it never commits
        with _LEASES_LOCK:
            held = _LEASES.get(self._lease_key)
        if held is not None:
            held[0].check()

    def close(self) -> None:
        """Release the lease (the last holder in this process releases it)."""
        key, self._lease_key = self._lease_key, None
        self.hold(False)
        self._intent_ids = None
        if key is None:
            return
        with _LEASES_LOCK:
            held = _LEASES.get(key)
            if held is None:
                return
            held[1] -= 1
            if held[1] > 0:
                return
            del _LEASES[key]
        held[0].release()

    # ---- intents ----
    def intend(self, batch_id: int, app_id: str, run_id: str) -> None:
        """Record that ``run_id`` is about to attempt the commit of ``batch_id`` under
        ``app_id`` (kept if one of the same app id is there)."""
        if self.intent(batch_id, app_id) is not None:
            return
        self.store.put(_intent_key(batch_id), intent_record(batch_id, app_id, run_id))
        if self._intent_ids is not None:
            self._intent_ids.add(batch_id)

    def intent_where(self, batch_id: int) -> str:
        """Where ``batch_id``'s intent is kept (for messages that tell an operator what to
        remove)."""
        return self.store.where(_intent_key(batch_id))

    def intent(self, batch_id: int, app_id: str) -> dict[str, Any] | None:
        """The intent recorded for ``batch_id`` of ``app_id``, or ``None``."""
        if self._intent_ids is not None and batch_id not in self._intent_ids:
            return None
        found = self.store.read(_intent_key(batch_id))
        return parse_intent(found[0] if found else None, batch_id, app_id)

    def prune(self, keep: int) -> None:
        super().prune(keep)
        last = self.last_batch_id()
        if last is None:
            return
        ids = (set(self._intent_ids) if self._intent_ids is not None else
               {b for k in self.store.keys("intents/") if (b := _intent_batch(k)) is not None})
        for batch_id in sorted(ids):
            if batch_id <= last:
                self.store.delete(_intent_key(batch_id))
                if self._intent_ids is not None:
                    self._intent_ids.discard(batch_id)


def _intent_key(batch_id: int) -> str:
    return f"intents/{batch_id:020d}.json"


def _intent_batch(key: str) -> int | None:
    stem = key.rsplit("/", 1)[-1].split(".", maxsplit=1)[0]
    return int(stem) if stem.isdigit() else None


def open_ledger(
    ledger_path: str | None,
    location: Callable[[], str],
    sink_id: str,
    *,
    conf: Callable[[str], str | None],
    options: Mapping[str, str] | None,
    probe: Callable[[str], int | None],
) -> TableLedger | TableObjectLedger:
    """The sink's ledger: a :class:`TableLedger` in ``ledger_path`` or beside a local table;
    a :class:`TableObjectLedger` beside a table on an object store (its client's settings
    from the Spark confs ``conf`` reads, then ``options``); ``location()`` is asked only
    without ``ledger_path``."""
    url = None if ledger_path is not None else store_url(location(), sink_id)
    if url is not None:
        store = ObstoreStore(url, options_for(location(), conf, options))
        return TableObjectLedger(store, sink_id=sink_id, probe=probe)
    return TableLedger(ledger_root(ledger_path, location, sink_id), sink_id=sink_id,
                       probe=probe)
