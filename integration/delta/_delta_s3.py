"""What a Delta table on S3 (the test services' S3 API) and its sink's ledger hold, read
independently of the sink: the table's rows and history with delta-rs (``deltalake``, a
reader that shares no code with Spark or Delta's JVM), the ledger's objects with obstore.
"""

from __future__ import annotations

import collections
import json
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from connectors.delta import parse_user_metadata
from connectors.lake.store import ObstoreStore


def s3_uri(uri: str) -> str:
    """delta-rs's and obstore's name for an ``s3a://`` table."""
    return "s3://" + uri.split("://", 1)[1]


class S3Tables:
    """Readers of tables under the S3 service ``s3`` (the ``s3_service`` fixture)."""

    def __init__(self, s3: Any) -> None:
        self.options: dict[str, str] = dict(s3.storage_options())

    def table(self, uri: str) -> DeltaTable:
        return DeltaTable(s3_uri(uri), storage_options=self.options)

    def rows(self, uri: str, columns: list[str]) -> list[tuple[Any, ...]]:
        """Every row (``columns``; a timestamp column as microseconds), sorted."""
        data = self.table(uri).to_pyarrow_table()
        arrays = []
        for name in columns:
            col = data.column(name)
            if pa.types.is_timestamp(col.type):
                col = col.cast(pa.timestamp("us", tz=col.type.tz)).cast(pa.int64())
            arrays.append(col.to_pylist())
        return sorted(zip(*arrays, strict=True))

    def history(self, uri: str) -> list[dict[str, Any]]:
        """Every commit's commitInfo with its ``version``, oldest first."""
        table = self.table(uri)
        entries = table.history()
        newest = table.version()
        out = []
        for i, info in enumerate(entries):  # delta-rs lists the newest first
            out.append({**info, "version": info.get("version", newest - i)})
        return sorted(out, key=lambda e: int(e["version"]))

    def tagged_commits(self, uri: str, app_id: str) -> dict[int, list[int]]:
        """batch id -> table versions of the commits the sink tagged with ``app_id``."""
        out: dict[int, list[int]] = collections.defaultdict(list)
        for info in self.history(uri):
            tag = parse_user_metadata(info.get("userMetadata"))
            if tag is not None and tag.app_id == app_id:
                out[tag.batch_id].append(int(info["version"]))
        return dict(out)

    def operations(self, uri: str) -> list[str]:
        return [str(info.get("operation")) for info in self.history(uri)]

    def txn_version(self, uri: str, app_id: str) -> int | None:
        return self.table(uri).transaction_version(app_id)

    def _ledger(self, uri: str, sink_id: str) -> ObstoreStore:
        return ObstoreStore(f"{s3_uri(uri)}/_connectors/{sink_id}", self.options)

    def ledger_batches(self, uri: str, sink_id: str) -> dict[int, bool]:
        """Batches in the sink's ledger beside the table -> recorded COMMITTED."""
        store = self._ledger(uri, sink_id)
        keys = set(store.keys("decisions/"))
        out = {}
        for key in sorted(k for k in keys if k.endswith(".json")):
            found = store.read(key)
            if found is None:
                continue
            entry = json.loads(found[0])
            batch = int(key.rsplit("/", 1)[-1].split(".")[0])
            out[batch] = (entry["state"] == "COMMITTED"
                          or key.replace(".json", ".committed") in keys)
        return out

    def intent_batches(self, uri: str, sink_id: str) -> list[int]:
        store = self._ledger(uri, sink_id)
        return sorted(int(k.rsplit("/", 1)[-1].split(".")[0])
                      for k in store.keys("intents/"))

    def ledger_fingerprint(self, uri: str, sink_id: str, batch_id: int) -> dict[str, Any] | None:
        found = self._ledger(uri, sink_id).read(f"decisions/{batch_id:020d}.json")
        assert found is not None, (uri, sink_id, batch_id)
        fp = json.loads(found[0]).get("fp")
        return dict(fp) if fp else None

    def lease(self, uri: str, sink_id: str) -> dict[str, Any] | None:
        found = self._ledger(uri, sink_id).read("lease")
        return dict(json.loads(found[0])) if found else None
