"""The fingerprint of what a Delta commit wrote, recomputed from its files (replays only).

An append or overwrite writes the batch's rows unchanged into the files its commit adds.
So the sink need not hash every batch while writing it: on the rare replay of a batch that
is already committed, it reads the files that the batch's commit added (their paths and
partition values from the commit's JSON in ``_delta_log``) and fingerprints them with the
same Spark aggregation (:func:`connectors.spark.toolkit.spark_fingerprint`) that it runs
over the replayed batch: same rows, same fingerprint, whatever the file layout.

The files are read as plain Parquet (a later DELETE's deletion vectors or a compaction do
not matter: the files themselves still hold what the batch wrote), restricted to the
batch's columns in the batch's order and types; partition columns come from the commit's
``partitionValues``. When the files are gone (VACUUM after a rewrite), the table uses
column mapping (physical names differ) or the commit cannot be read, :class:`Unreadable`
is raised and the sink falls back to comparing the row count of the commit's metrics.

:class:`ReplayCheck` holds the checks a replay of a committed batch passes: against the
fingerprint of its commit's files, or by the row count of the commit's metrics.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from connectors.core.fingerprint import Fingerprint
from connectors.core.protocol.replay import check_replay
from connectors.delta._history import Commit
from connectors.delta._table import local_path
from connectors.lake.changes import ChangeSpec
from connectors.spark.toolkit import quoted
from connectors.spark.toolkit import spark_fingerprint as fingerprint_now

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from connectors.core.templates.template import ReplayPolicy

__all__ = ["ReplayCheck", "Unreadable", "commit_actions", "committed_fingerprint"]

logger = logging.getLogger(__name__)

_FILE_NAME = "__connectors_file_name"


class Unreadable(Exception):
    """The commit's files cannot be fingerprinted (the reason is the message)."""


def _log_file(location: str, version: int) -> str:
    return f"{location.rstrip('/')}/_delta_log/{version:020d}.json"


def commit_actions(
    session: SparkSession, location: str, version: int, local: Path | None
) -> list[dict[str, Any]]:
    """The actions of commit ``version`` (its JSON file), read locally or through Spark."""
    try:
        if local is not None:
            text = (local / "_delta_log" / f"{version:020d}.json").read_text(encoding="utf-8")
            lines = text.splitlines()
        else:
            lines = [r[0] for r in session.read.text(_log_file(location, version)).collect()]
    except Exception as exc:  # deleted by log retention, unreachable store, ...
        raise Unreadable(f"commit {version} of the Delta log cannot be read ({exc})") from exc
    return [json.loads(line) for line in lines if line.strip()]


def _file_uri(location: str, path: str) -> str:
    if "://" in path or path.startswith("/"):
        return path  # absolute (shallow clones)
    return f"{location.rstrip('/')}/{unquote(path)}"


def _column_mapping(actions: list[dict[str, Any]], session: SparkSession, location: str) -> str:
    for action in actions:
        meta = action.get("metaData")
        if meta is not None:
            return str((meta.get("configuration") or {}).get("delta.columnMapping.mode", "none"))
    import connectors.delta._api as delta_api

    return str(delta_api.properties(session, location).get("delta.columnMapping.mode", "none"))


def committed_fingerprint(
    session: SparkSession, location: str, version: int, like: DataFrame, local: Path | None
) -> Fingerprint:
    """Fingerprint of the rows that commit ``version`` added, shaped like ``like``.

    Raises :class:`Unreadable` when that cannot be done faithfully.
    """
    from pyspark.sql import functions as F  # noqa: N812

    actions = commit_actions(session, location, version, local)
    adds = [a["add"] for a in actions if "add" in a and a["add"].get("dataChange", True)]
    if not adds:
        return Fingerprint()
    mode = _column_mapping(actions, session, location)
    if mode not in ("", "none"):
        raise Unreadable(f"the table uses column mapping ({mode!r})")
    lower = {f.name.lower(): f for f in like.schema.fields}
    partition_names = {k for a in adds for k in (a.get("partitionValues") or {})}
    part_cols = {p.lower(): p for p in partition_names}
    unknown = [part_cols[k] for k in part_cols if k not in lower]
    if unknown:
        raise Unreadable(f"partition column(s) {unknown} are not columns of the batch")
    data_cols = [f for f in like.schema.fields if f.name.lower() not in part_cols]
    paths = [_file_uri(location, str(a["path"])) for a in adds]
    try:
        files = session.read.parquet(*paths)
        present = {c.lower(): c for c in files.columns}
        missing = [f.name for f in data_cols if f.name.lower() not in present]
        if missing:
            raise Unreadable(f"the commit's files have no column(s) {missing}")
        selected = [F.col(quoted(present[f.name.lower()])).cast(f.dataType).alias(f.name)
                    for f in data_cols]
        if part_cols:
            order = sorted(part_cols)
            rows = [(Path(unquote(str(a["path"]))).name,
                     *[(a.get("partitionValues") or {}).get(part_cols[k]) for k in order])
                    for a in adds]
            from pyspark.sql.types import StringType, StructField, StructType

            names = [_FILE_NAME, *(f"__p{i}" for i in range(len(order)))]
            values = session.createDataFrame(
                rows, StructType([StructField(n, StringType()) for n in names]))
            files = files.select(*selected, F.col("_metadata.file_name").alias(_FILE_NAME))
            files = files.join(F.broadcast(values), _FILE_NAME)
            by_name = {k: F.col(f"__p{i}") for i, k in enumerate(order)}
            shaped = files.select(*[
                (by_name[f.name.lower()].cast(f.dataType) if f.name.lower() in by_name
                 else F.col(quoted(f.name))).alias(f.name)
                for f in like.schema.fields
            ])
        else:
            shaped = files.select(*selected)
        return fingerprint_now(shaped)
    except Unreadable:
        raise
    except Exception as exc:  # files vacuumed, unreadable, a cast Spark refuses
        raise Unreadable(f"the files of Delta commit {version} cannot be read ({exc})") from exc



@dataclass(frozen=True)
class ReplayCheck:
    """The replay ``df`` of batch ``batch_id`` compared with the commit that batch made
    (driver side: a replay the ledger recorded, or a batch committed but not recorded)."""

    session: SparkSession
    location: str
    df: DataFrame
    changes: ChangeSpec
    on_replay_mismatch: ReplayPolicy
    sink_id: str
    batch_id: int

    def committed_fingerprint(self, found: Commit | None) -> Fingerprint | None:
        """The fingerprint of the rows commit ``found`` added (:func:`committed_fingerprint`);
        where they cannot be read, the row counts are compared instead and ``None``
        returned (also, logged, when the history no longer shows the commit: ``None``)."""
        if found is None:
            logger.warning(
                "sink %s batch %d: the table's history no longer shows the commit of this "
                "batch (log retention?), so its replay is not compared",
                self.sink_id, self.batch_id,
            )
            return None
        fp = self.content(found[0])
        if fp is None:
            self.check_count(found)
        return fp

    def reconciled(self, found: Commit | None) -> None:
        """A batch committed to Delta but not recorded: an append's replay must hold the
        rows its commit ``found`` wrote (a MERGE's: as many source rows; no commit found:
        nothing to compare)."""
        if found is None:
            return
        if not self.changes.merges:
            committed = self.content(found[0])
            if committed is not None:
                check_replay(self.sink_id, self.on_replay_mismatch, self.batch_id, committed,
                             fingerprint_now(self.df))
                return
        self.check_count(found)

    def content(self, version: int) -> Fingerprint | None:
        """:func:`committed_fingerprint` of commit ``version``, or ``None`` (logged) where
        its files cannot be read: then the replay is compared by its row count only."""
        try:
            return committed_fingerprint(self.session, self.location, version, self.df,
                                         local_path(self.location))
        except Unreadable as exc:
            logger.warning(
                "sink %s batch %d: %s; the replay is compared by its row count only",
                self.sink_id, self.batch_id, exc,
            )
            return None

    def check_count(self, found: Commit) -> None:
        """The replay has as many rows as commit ``found`` wrote (a MERGE: as many
        deduplicated source rows: :meth:`ChangeSpec.source`), by its ``operationMetrics``; otherwise
        :class:`NonDeterministicReplayError` is raised, or logged with ``"warn"``."""
        version, metrics = found
        key = "numSourceRows" if self.changes.merges else "numOutputRows"
        if key not in metrics:
            return
        committed = int(metrics[key])
        actual = self.changes.source(self.df).count()
        if actual != committed:
            check_replay(self.sink_id, self.on_replay_mismatch, self.batch_id,
                         f"{committed} row(s) (Delta commit {version})", f"{actual} row(s)")
