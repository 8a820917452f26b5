"""Operating IcebergSinks from outside their queries: their ledgers, and their snapshots.

The operator tools (``connectors status``, ``doctor``) read an Iceberg table through this
module, and so can a script; no Spark and no catalog client is needed. :class:`IcebergAdmin`
is one table by its location (a local path or a URI on an object store: ``s3a://``,
``s3://``, ``gs://``, ``abfss://``), with the sinks' ledgers under ``_connectors/`` beside
it (or under another root):

- :meth:`~IcebergAdmin.sink_ids`: every sink with a ledger there;
- :meth:`~IcebergAdmin.ledger`: a sink's ledger, read only (no lease is taken, so reading
  never fences a live driver);
- :meth:`~IcebergAdmin.last_batch_in_table`: the last batch the sink committed according to
  the table's retained snapshots (each commit of the sink is tagged
  ``connectors.{app,batch}`` in its snapshot summary), read from the table's current
  metadata file: ``metadata/version-hint.text`` names it in a Hadoop catalog's table; a
  table of another catalog (JDBC, REST, Hive, Glue) keeps that pointer in its catalog, so
  its newest ``<n>-<uuid>.metadata.json`` is taken, or the file ``metadata_location=``
  names (the catalog's pointer: ``SELECT file FROM <t>.metadata_log_entries``, the newest).

There is nothing to settle: an Iceberg commit is atomic, so nothing stays open or prepared.
What can be unfinished is the ledger: a batch the table committed that the ledger does not
record yet (the driver died between the two), which the sink's next run records without
writing it again; :meth:`~IcebergAdmin.last_batch_in_table` beside the ledger shows that gap.

Example (``path``: a directory holding no table; a table's location has ``metadata/``)::

    from connectors.core.errors import ConfigurationError
    from connectors.iceberg.admin import IcebergAdmin

    try:
        IcebergAdmin(path)
    except ConfigurationError as exc:
        print("refused:", "not an Iceberg table" in str(exc))
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from connectors.core.batch import BatchContext
from connectors.core.errors import ConfigurationError
from connectors.core.ledgers.file_ledger import FileLedger
from connectors.core.ledgers.object_ledger import ObjectLedger
from connectors.iceberg._snapshots import Snapshot, TableSnapshots
from connectors.iceberg._tag import SnapshotTag
from connectors.lake.store import OBJECT_SCHEMES, ObstoreStore, local_path, options_for

__all__ = ["IcebergAdmin"]

#: A catalog's metadata file name: ``<sequence>-<uuid>.metadata.json[.gz]``; a Hadoop
#: catalog's: ``v<version>.metadata.json[.gz]``.
_METADATA = re.compile(r"^(?:v)?(\d+)(?:-[0-9a-fA-F-]+)?(?:\.gz)?\.metadata\.json(?:\.gz)?$")


def _no_conf(key: str) -> str | None:
    """No Spark session here: no s3a confs (the environment gives the settings)."""
    return None


def _redact(location: str) -> str:
    parsed = urlparse(location)
    if parsed.password or parsed.username:
        return parsed._replace(netloc=parsed.hostname or "").geturl()
    return location


class IcebergAdmin:
    """An Iceberg table by its location, with the sinks' ledgers under ``_connectors/``
    beside it, or under ``ledger_root`` (the parent of IcebergSink's ``ledger_path``);
    ``metadata_location``: the table's current metadata file, where the catalog knows it
    (default: found under ``<location>/metadata``). Refuses a location without Iceberg
    metadata."""

    def __init__(self, location: str, ledger_root: str | None = None,
                 storage_options: dict[str, str] | None = None, *,
                 metadata_location: str | None = None) -> None:
        self.location = location.rstrip("/")
        self._options = dict(storage_options or {})
        self._local = local_path(self.location)
        if self._local is None and urlparse(self.location).scheme.lower() not in OBJECT_SCHEMES:
            raise ConfigurationError(
                f"{_redact(location)}: give a local path or an s3a://, s3://, gs:// or "
                "abfss:// URI of the Iceberg table's location")
        self.notes: list[str] = []
        self.metadata_location = metadata_location or self._current_metadata()
        root = ledger_root or f"{self.location}/_connectors"
        on_store = urlparse(root).scheme.lower() in OBJECT_SCHEMES
        self._root_url = root if on_store else None
        #: The ledgers' local directory (``None``: they are on an object store).
        self.ledger_root = None if on_store else (local_path(root) or Path(root))

    def describe(self) -> str:
        """The table for humans, its URI without credentials."""
        return f"iceberg {_redact(self.location)}"

    # ---- the table's metadata ----
    def _store(self, url: str) -> ObstoreStore:
        return ObstoreStore(url, options_for(url, _no_conf, self._options))

    def _read(self, location: str) -> bytes | None:
        local = local_path(location)
        if local is not None:
            return local.read_bytes() if local.is_file() else None
        parent, _, name = location.rpartition("/")
        got = self._store(parent).read(name)
        return None if got is None else got[0]

    def _names(self, folder: str) -> list[str]:
        local = local_path(folder)
        if local is not None:
            return [p.name for p in local.iterdir()] if local.is_dir() else []
        return [k.rsplit("/", 1)[-1] for k in self._store(folder).keys("")]

    def _current_metadata(self) -> str:
        folder = f"{self.location}/metadata"
        hint = self._read(f"{folder}/version-hint.text")
        if hint is not None and hint.strip().isdigit():
            version = int(hint.strip())
            names = set(self._names(folder))
            # (a writer may have renamed a newer version in and died before the hint)
            while f"v{version + 1}.metadata.json" in names:
                version += 1
            for name in (f"v{version}.metadata.json", f"v{version}.gz.metadata.json",
                         f"v{version}.metadata.json.gz"):
                if name in names:
                    return f"{folder}/{name}"
        found = [(int(m.group(1)), name) for name in self._names(folder)
                 if (m := _METADATA.match(name))]
        if not found:
            raise ConfigurationError(
                f"{_redact(self.location)} is not an Iceberg table (no "
                "metadata/*.metadata.json under it): give the table's location (the Location "
                "row of DESCRIBE TABLE EXTENDED)")
        newest = max(n for n, _ in found)
        same = sorted(name for n, name in found if n == newest)
        if len(same) > 1:
            self.notes.append(
                f"{len(same)} metadata files share sequence {newest} (a commit that lost a "
                "race leaves one); the newest by name is read: give --iceberg-metadata with "
                "the catalog's metadata_location to be sure")
        return f"{folder}/{same[-1]}"

    def metadata(self) -> dict[str, Any]:
        """The table's current metadata (JSON, gunzipped where it is compressed)."""
        data = self._read(self.metadata_location)
        if data is None:
            raise ConfigurationError(f"{_redact(self.metadata_location)} cannot be read")
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        loaded = json.loads(data)
        if not isinstance(loaded, dict):
            raise ConfigurationError(f"{_redact(self.metadata_location)} is not Iceberg "
                                     "table metadata")
        return loaded

    def snapshots(self) -> TableSnapshots:
        """The table's retained snapshots and its current one, from its metadata."""
        meta = self.metadata()
        by_id: dict[int, Snapshot] = {}
        for snap in meta.get("snapshots") or []:
            summary = {str(k): str(v) for k, v in (snap.get("summary") or {}).items()}
            sid = int(snap["snapshot-id"])
            parent = snap.get("parent-snapshot-id")
            by_id[sid] = Snapshot(sid, None if parent is None else int(parent),
                                  summary.get("operation", ""), SnapshotTag.parse(summary))
        main = (meta.get("refs") or {}).get("main") or {}
        current = main.get("snapshot-id", meta.get("current-snapshot-id"))
        current = None if current in (None, -1) else int(current)
        return TableSnapshots(_redact(self.location), current, by_id)

    # ---- the ledgers ----
    def sink_ids(self) -> list[str]:
        """Every sink id with a ledger under the ledger root."""
        if self.ledger_root is None:
            assert self._root_url is not None
            return sorted({k.split("/", 1)[0] for k in self._store(self._root_url).keys("")
                           if "/" in k})
        if not self.ledger_root.is_dir():
            return []
        return sorted(p.name for p in self.ledger_root.iterdir() if p.is_dir())

    def ledger(self, sink_id: str) -> FileLedger | ObjectLedger:
        """The sink's ledger, read only (no lease is taken); the caller closes it."""
        if self.ledger_root is None:
            assert self._root_url is not None
            return ObjectLedger(self._store(f"{self._root_url.rstrip('/')}/{sink_id}"),
                                sink_id=sink_id)
        return FileLedger(self.ledger_root / sink_id, sink_id=sink_id)

    def last_batch_in_table(self, sink_id: str) -> int | None:
        """The last batch the sink committed to the table according to its retained
        snapshots, under the ledger's current generation (the count of ``reset_binding``,
        part of the tag's app id); ``None`` when no retained snapshot has one."""
        ledger = self.ledger(sink_id)
        try:
            generation = ledger.generation()
        finally:
            ledger.close()
        app_id = BatchContext(sink_id, 0, "00000000", generation).app_id
        return self.snapshots().last_batch(app_id)

    def __repr__(self) -> str:
        return f"IcebergAdmin({_redact(self.location)!r})"
