"""A :class:`~connectors.core.ledgers.ledger.Ledger` kept as small objects in an object store.

The same layout as :class:`~connectors.core.ledgers.file_ledger.FileLedger` (one prefix per sink)::

    <root>/binding.json                      sink id -> query id (compare-and-swap)
    <root>/decisions/<batch>.json            the decision (created if absent: first wins)
    <root>/decisions/<batch>.committed       every transaction of it committed
    <root>/aborts/<batch>-<run>.json         run <run> may never decide <batch>
    <root>/lineage/<query>.json              query <query> took the sink over from a
                                             savepoint (resume_from; replaced if recorded again)

No ``flock``, no rename: an object store has neither. Every record is written with the
store's own atomic primitives, through :class:`ObjectStore`: *create* (only if absent: S3
``If-None-Match: *``, GCS ``ifGenerationMatch=0``, Azure ``If-None-Match: *``) and
*replace* (only if unchanged since read: S3/Azure ``If-Match: <etag>``, GCS the
generation). A decision is one create, so two drivers deciding one batch cannot both win;
the binding is a read-then-replace loop, so a reset cannot be lost. Reads see every
acknowledged write (S3, GCS and Azure are strongly consistent for reads and lists).

:meth:`ObjectLedger.decide` and :meth:`ObjectLedger.forbid_decision` are two objects, so the
two are ordered only by the sink's lease (:mod:`connectors.core.ledgers.object_lease`): a
sink's writers hold it, and no operator tool aborts a batch of a driver-committing sink.

While the sink's lease is held (:meth:`ObjectLedger.hold`) the ledger keeps the batch ids
it listed and decided in memory: it is then their only writer, so a batch costs no LIST.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from connectors.core.errors import FencedError
from connectors.core.ledgers.file_ledger import validate_query_file
from connectors.core.ledgers.ledger import Ledger, LedgerEntry, Lineage, check_binding
from connectors.core.naming import validate_sink_id
from connectors.core.states import BatchState

__all__ = ["ObjectLedger", "ObjectStore", "Versioned"]

logger = logging.getLogger(__name__)

#: An object's bytes and its version token (an ETag or a generation) as read.
Versioned = tuple[bytes, str]


class ObjectStore(ABC):
    """The four primitives of an object store the ledger needs, under one root prefix.

    Keys are relative to the root (``"decisions/00000000000000000007.json"``).
    Implementations raise :class:`~connectors.core.errors.TransientError` for failures
    worth retrying (a timeout, a 5xx), anything else for the rest.
    """

    @abstractmethod
    def read(self, key: str) -> Versioned | None:
        """The object's bytes and version token, or ``None`` when absent."""

    @abstractmethod
    def create(self, key: str, data: bytes) -> str | None:
        """Write ``data`` only if ``key`` is absent; its version token, or ``None`` if
        another writer created it first."""

    @abstractmethod
    def replace(self, key: str, data: bytes, version: str) -> str | None:
        """Write ``data`` only if ``key`` is still at ``version``; the new version token,
        or ``None`` if it changed (or was deleted) since."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write ``data`` unconditionally (records that are the same whoever writes them)."""

    @abstractmethod
    def keys(self, prefix: str) -> list[str]:
        """Every key under ``prefix`` (relative to the root), in no particular order."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete ``key``; an absent key is not an error."""

    def where(self, key: str = "") -> str:
        """The key's full address, for messages (``s3://bucket/prefix/key``)."""
        return key


def _batch_of(key: str) -> int | None:
    name = key.rsplit("/", 1)[-1]
    stem, _, suffix = name.partition(".")
    return int(stem) if stem.isdigit() and suffix == "json" else None


class ObjectLedger(Ledger):
    """A ledger kept as small objects in ``store`` (see the module docstring).

    Example (any :class:`ObjectStore`; DeltaSink's is obstore's, here the test kit's)::

        from connectors.testing import InMemoryObjectStore

        ledger = ObjectLedger(InMemoryObjectStore(), sink_id="events")
        assert ledger.bind_query("query-1") == 0 and ledger.bound_query() == "query-1"
    """

    def __init__(self, store: ObjectStore, *, sink_id: str) -> None:
        self.sink_id = validate_sink_id(sink_id)
        self.store = store
        self._known: set[int] | None = None  # batch ids decided, while the lease is held
        self._aborted = False  # this object wrote an abort record

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.store.where()!r}, sink_id={self.sink_id!r})"

    def hold(self, held: bool) -> None:
        """The sink's lease is held (``True``: keep the decided batch ids in memory) or
        not (``False``: list them every time)."""
        if not held:
            self._known = None
        elif self._known is None:
            self._known = set(self._listed())

    # ---- records ----
    @staticmethod
    def _decision_key(batch_id: int) -> str:
        return f"decisions/{batch_id:020d}.json"

    @staticmethod
    def _abort_key(batch_id: int, run_id: str) -> str:
        return f"aborts/{batch_id:020d}-{run_id}.json"

    def _json(self, key: str) -> tuple[Any, str] | None:
        found = self.store.read(key)
        if found is None:
            return None
        return json.loads(found[0]), found[1]

    def _binding(self) -> tuple[dict[str, Any], str] | None:
        found = self._json("binding.json")
        return (dict(found[0]), found[1]) if found is not None else None

    def bound_query(self) -> str | None:
        binding = self._binding()
        return str(binding[0]["query_id"]) if binding else None

    def generation(self) -> int:
        """How many times ``reset_binding`` rebound the sink (0 before the first)."""
        binding = self._binding()
        return int(binding[0].get("generation", 0)) if binding else 0

    def record_lineage(self, link: Lineage) -> None:
        key = f"lineage/{validate_query_file(link.query_id)}.json"
        payload = json.dumps(link.to_json()).encode()
        while True:
            found = self.store.read(key)
            written = (self.store.create(key, payload) if found is None
                       else self.store.replace(key, payload, found[1]))
            if written is not None:
                return

    def lineage(self) -> list[Lineage]:
        found = [self._json(key) for key in self.store.keys("lineage/")]
        return [Lineage.from_json(f[0]) for f in found if f is not None]

    def bind_query(self, query_id: str, *, reset: bool = False) -> int:
        while True:
            binding = self._binding()
            record, version = binding if binding is not None else ({}, None)
            bound = str(record["query_id"]) if binding is not None else None
            generation = int(record.get("generation", 0))
            if not check_binding(self.sink_id, bound, query_id, reset=reset):
                return generation
            if binding is not None:
                # A reset: batch ids restart, so does the ledger. The old records go first:
                # a crash in between leaves the old binding, which a restart resets again.
                generation += 1
                for key in [*self.store.keys("decisions/"), *self.store.keys("aborts/")]:
                    self.store.delete(key)
                if self._known is not None:
                    self._known = set()
            payload = json.dumps({"sink_id": self.sink_id, "query_id": query_id,
                                  "generation": generation}).encode()
            written = (self.store.create("binding.json", payload) if version is None
                       else self.store.replace("binding.json", payload, version))
            if written is not None:
                return generation
            logger.info("sink %s: the binding changed while it was rebound; reading it again",
                        self.sink_id)

    def get(self, batch_id: int) -> LedgerEntry | None:
        if self._known is not None and batch_id not in self._known:
            return None
        key = self._decision_key(batch_id)
        found = self._json(key)
        if found is None:
            return None
        entry = LedgerEntry.from_json(found[0])
        if entry.state is BatchState.DECIDED and self.store.read(
                key.replace(".json", ".committed")) is not None:
            entry = entry.committed()
        return entry

    def decide(self, entry: LedgerEntry) -> LedgerEntry:
        existing = self.get(entry.batch_id)
        if existing is not None:
            return existing
        # While the lease is held only this object writes abort records (the GET is saved).
        may_be_aborted = self._known is None or self._aborted
        if may_be_aborted and self.store.read(
                self._abort_key(entry.batch_id, entry.run_id)) is not None:
            raise FencedError(
                f"run {entry.run_id} of the sink was aborted for this batch by another "
                "driver or an operator; its transactions were rolled back",
                sink_id=self.sink_id,
                batch_id=entry.batch_id,
            )
        written = self.store.create(self._decision_key(entry.batch_id),
                                    json.dumps(entry.to_json()).encode())
        if self._known is not None:
            self._known.add(entry.batch_id)
        if written is None:  # another writer decided first: its decision stands
            found = self._json(self._decision_key(entry.batch_id))
            assert found is not None
            return LedgerEntry.from_json(found[0])
        return entry

    def forbid_decision(self, batch_id: int, run_id: str) -> LedgerEntry | None:
        existing = self.get(batch_id)
        if existing is not None and existing.run_id == run_id:
            return existing
        payload = json.dumps({"batch_id": batch_id, "run_id": run_id}).encode()
        self._aborted = True
        self.store.put(self._abort_key(batch_id, run_id), payload)
        # A decision of that run written meanwhile wins (see the module docstring).
        existing = self.get(batch_id)
        return existing if existing is not None and existing.run_id == run_id else None

    def mark_committed(self, batch_id: int) -> None:
        self.store.put(self._decision_key(batch_id).replace(".json", ".committed"), b"")

    def _listed(self) -> list[int]:
        ids = {b for k in self.store.keys("decisions/") if (b := _batch_of(k)) is not None}
        return sorted(ids)

    def _batch_ids(self) -> list[int]:
        return sorted(self._known) if self._known is not None else self._listed()

    def last_batch_id(self) -> int | None:
        ids = self._batch_ids()
        return ids[-1] if ids else None

    def entries(self) -> Sequence[LedgerEntry]:
        entries = []
        for batch_id in self._batch_ids():
            entry = self.get(batch_id)
            if entry is not None:  # else pruned by another process since the listing
                entries.append(entry)
        return entries

    def prune(self, keep: int) -> None:
        ids = self._batch_ids()
        if len(ids) <= keep:
            return
        cutoff = ids[-keep] if keep > 0 else ids[-1] + 1
        for batch_id in ids:
            if batch_id >= cutoff:
                break
            key = self._decision_key(batch_id)
            found = self._json(key)
            if found is None:  # another process of the sink pruned it already
                continue
            marker = key.replace(".json", ".committed")
            recorded_committed = found[0].get("state") == BatchState.COMMITTED.value
            if not recorded_committed and self.store.read(marker) is None:
                continue  # DECIDED, not all committed yet: kept for the reconcile
            # Decision first: a crash in between leaves a stray marker, never a decision
            # that looks unfinished. A decision recorded COMMITTED never had a marker.
            self.store.delete(key)
            if self._known is not None:
                self._known.discard(batch_id)
            if not recorded_committed:
                self.store.delete(marker)
        for key in self.store.keys("aborts/") if self._has_aborts() else []:
            stem = key.rsplit("/", 1)[-1].split("-")[0]
            if stem.isdigit() and int(stem) < cutoff:
                self.store.delete(key)

    def _has_aborts(self) -> bool:
        """Whether abort records may exist: a driver-committing sink never writes one, so
        its ledger lists them only when it is not sure (no lease held)."""
        return self._known is None or self._aborted
