"""The sink's tag in an Iceberg snapshot's summary: which sink, app id and batch committed it.

Written through Iceberg's public write option ``snapshot-property.<key>`` (appends and
overwrites) or the session conf ``spark.sql.iceberg.snapshot-property.<key>`` (MERGE
INTO), and read back from the ``<table>.snapshots`` metadata table's ``summary`` map. The
identity is the sink id and its binding generation (the app id), never Spark's application
or query id: both change on a restart (how Flink's committer duplicated commits,
apache/iceberg#16008).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["PREFIX", "SnapshotTag"]

#: Every key the sink writes into a snapshot's summary starts with this.
PREFIX = "connectors."


@dataclass(frozen=True)
class SnapshotTag:
    """What one of the sink's commits says of itself (``connectors.*`` summary keys)."""

    sink_id: str
    app_id: str
    batch_id: int
    query_id: str = ""
    run_id: str = ""

    def properties(self) -> dict[str, str]:
        """The summary properties, by key (without ``snapshot-property.``)."""
        props = {f"{PREFIX}sink": self.sink_id, f"{PREFIX}app": self.app_id,
                 f"{PREFIX}batch": str(self.batch_id)}
        if self.query_id:
            props[f"{PREFIX}query"] = self.query_id
        if self.run_id:
            props[f"{PREFIX}run"] = self.run_id
        return props

    def write_options(self) -> dict[str, str]:
        """As DataFrameWriterV2 options: ``snapshot-property.<key>`` -> value."""
        return {f"snapshot-property.{k}": v for k, v in self.properties().items()}

    def session_confs(self) -> dict[str, str]:
        """As session confs (Iceberg >= 1.11), for a SQL MERGE, which takes no write
        options: ``spark.sql.iceberg.snapshot-property.<key>`` -> value."""
        return {f"spark.sql.iceberg.snapshot-property.{k}": v
                for k, v in self.properties().items()}

    @classmethod
    def parse(cls, summary: Mapping[str, str] | None) -> SnapshotTag | None:
        """The tag in a snapshot's summary, or ``None`` (another writer's snapshot, a
        compaction, or a summary not written by this library)."""
        if not summary:
            return None
        app = summary.get(f"{PREFIX}app")
        batch = summary.get(f"{PREFIX}batch")
        if not app or batch is None or not batch.lstrip("-").isdigit():
            return None
        return cls(sink_id=summary.get(f"{PREFIX}sink", ""), app_id=app, batch_id=int(batch),
                   query_id=summary.get(f"{PREFIX}query", ""),
                   run_id=summary.get(f"{PREFIX}run", ""))
