"""An in-memory :class:`~connectors.core.ledgers.object_ledger.ObjectStore` with a real store's
conditional semantics, for testing ledgers kept as objects without a store."""

from __future__ import annotations

import hashlib
import threading
from collections import Counter

from connectors.core.errors import TransientError
from connectors.core.ledgers.object_ledger import ObjectStore, Versioned

__all__ = ["InMemoryObjectStore"]


class InMemoryObjectStore(ObjectStore):
    """Objects in a dict, written as S3 writes them: ``create`` only if absent (S3's
    ``If-None-Match: *``), ``replace`` only at the version read (``If-Match``); every write
    gets a new version token. ``calls`` counts the requests by kind; with ``fail`` set
    every request raises :class:`~connectors.core.errors.TransientError` (a store that
    does not answer).

    Example::

        from connectors.core.ledgers.object_ledger import ObjectLedger

        store = InMemoryObjectStore()
        ledger = ObjectLedger(store, sink_id="events")
        assert ledger.bind_query("query-1") == 0 and ledger.bound_query() == "query-1"
        assert store.create("binding.json", b"{}") is None  # it exists: not created again
    """

    def __init__(self) -> None:
        self.objects: dict[str, Versioned] = {}
        self.calls: Counter[str] = Counter()
        self.fail = False
        self._lock = threading.Lock()
        self._writes = 0

    def _version(self, data: bytes) -> str:
        self._writes += 1
        return f"{hashlib.sha256(data).hexdigest()[:16]}-{self._writes}"

    def _call(self, what: str) -> None:
        self.calls[what] += 1
        if self.fail:
            raise TransientError("the store does not answer")

    def read(self, key: str) -> Versioned | None:
        self._call("read")
        with self._lock:
            return self.objects.get(key)

    def create(self, key: str, data: bytes) -> str | None:
        self._call("create")
        with self._lock:
            if key in self.objects:
                return None
            version = self._version(data)
            self.objects[key] = (data, version)
            return version

    def replace(self, key: str, data: bytes, version: str) -> str | None:
        self._call("replace")
        with self._lock:
            if key not in self.objects or self.objects[key][1] != version:
                return None
            new = self._version(data)
            self.objects[key] = (data, new)
            return new

    def put(self, key: str, data: bytes) -> None:
        self._call("put")
        with self._lock:
            self.objects[key] = (data, self._version(data))

    def keys(self, prefix: str) -> list[str]:
        self._call("list")
        with self._lock:
            return [k for k in self.objects if k.startswith(prefix)]

    def delete(self, key: str) -> None:
        self._call("delete")
        with self._lock:
            self.objects.pop(key, None)

    def where(self, key: str = "") -> str:
        return f"memory://{key}"
