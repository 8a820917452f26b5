"""The fingerprint of what a Delta commit wrote, recomputed from its files (replays only).

An append or overwrite writes the batch's rows unchanged into the files its commit adds.
So the sink need not hash every batch while writing it: on the rare replay of a batch that
is already committed, it reads the files that the batch's commit added (their paths and
partition values from the commit's JSON in ``_delta_log``) and fingerprints them with the
same Spark aggregation (:func:`connectors.delta._fingerprint.fingerprint_now`) that it runs
over the replayed batch: same rows, same fingerprint, whatever the file layout.

The files are read as plain Parquet (a later DELETE's deletion vectors or a compaction do
not matter: the files themselves still hold what the batch wrote), restricted to the
batch's columns in the batch's order and types; partition columns come from the commit's
``partitionValues``. When the files are gone (VACUUM after a rewrite), the table uses
column mapping (physical names differ) or the commit cannot be read, :class:`Unreadable`
is raised and the sink falls back to comparing the row count of the commit's metrics.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from connectors.core.fingerprint import Fingerprint
from connectors.delta._fingerprint import fingerprint_now

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Unreadable", "commit_actions", "committed_fingerprint"]

logger = logging.getLogger("connectors.delta")

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
    from delta.tables import DeltaTable

    detail = DeltaTable.forPath(session, location).detail().select("properties").first()
    props = dict(detail["properties"] or {}) if detail is not None else {}
    return str(props.get("delta.columnMapping.mode", "none"))


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
        selected = [F.col(f"`{present[f.name.lower()]}`").cast(f.dataType).alias(f.name)
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
                 else F.col(f"`{f.name}`")).alias(f.name)
                for f in like.schema.fields
            ])
        else:
            shaped = files.select(*selected)
        return fingerprint_now(shaped)
    except Unreadable:
        raise
    except Exception as exc:  # files vacuumed, unreadable, a cast Spark refuses
        raise Unreadable(f"the files of Delta commit {version} cannot be read ({exc})") from exc
