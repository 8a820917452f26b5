"""Spark's offset log, as a savepoint reads it: one planned batch of a query's checkpoint.

Spark plans batch N by writing ``<checkpoint>/offsets/N`` before it runs the batch, and never
rewrites it: a first line ``v1`` (the log's format), a line of JSON metadata (watermark,
batch time, the query's SQL settings), then one line per source in the order of the query's
plan: the offset where the batch *ends*, as that source's JSON, or ``-`` when the source
has no offset yet. ``<checkpoint>/metadata`` holds the query's id (``{"id": "..."}``).

The files are read from a local directory (or a ``file:`` URI) by default, or through any
:data:`TextReader` (the API passes one that reads through a Spark session, for checkpoints
on object stores and HDFS).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from connectors.core.errors import ConfigurationError

__all__ = ["OffsetLogEntry", "TextReader", "local_reader", "parse_offset_log", "read_batch",
           "read_query_id"]

#: Reads the text of ``<checkpoint>/<relative path>``; ``None`` when the file does not exist.
TextReader = Callable[[str, str], "str | None"]

#: The offset log formats this release reads (Spark 3.5 to 4.3 write ``v1``).
READABLE_FORMATS = ("v1",)


@dataclass(frozen=True)
class OffsetLogEntry:
    """``offsets/<batch_id>``: the batch's metadata and each source's end offset (the raw
    JSON text; ``None`` for ``-``), in the order of the query's sources."""

    batch_id: int
    metadata: dict[str, Any]
    sources: tuple[str | None, ...]


def local_path(checkpoint: str) -> Path | None:
    """The local directory of ``checkpoint`` (a path or a ``file:`` URI); ``None`` for
    another scheme (``s3a://``, ``hdfs://``, ``dbfs:/`` ...)."""
    parts = urlsplit(checkpoint)
    if parts.scheme == "file":
        return Path(unquote(parts.path))
    if parts.scheme and len(parts.scheme) > 1:  # "C:" is a drive, not a scheme
        return None
    return Path(checkpoint)


def local_reader(checkpoint: str, relative: str) -> str | None:
    """The :data:`TextReader` of local checkpoints."""
    root = local_path(checkpoint)
    if root is None:
        raise ConfigurationError(
            f"checkpoint {checkpoint!r} is not a local directory: the command line reads local "
            "checkpoints only; take the savepoint from a Spark session instead "
            "(connectors.savepoints.take_savepoint(sink, checkpoint, spark=spark) reads "
            "any file system Spark reads)")
    if not root.is_dir():
        raise ConfigurationError(f"checkpoint {checkpoint!r} is not a directory")
    path = root / relative
    return path.read_text(encoding="utf-8") if path.is_file() else None


def parse_offset_log(batch_id: int, text: str) -> OffsetLogEntry:
    """One offset log entry (the text of ``offsets/<batch_id>``)."""
    lines = text.splitlines()
    where = f"offsets/{batch_id}"
    if not lines or lines[0].strip() not in READABLE_FORMATS:
        found = lines[0].strip()[:20] if lines else "an empty file"
        raise ConfigurationError(
            f"{where} of the checkpoint is not an offset log entry this release reads (its "
            f"first line is {found!r}, expected one of {list(READABLE_FORMATS)}): a newer "
            "Spark's checkpoint? upgrade connectors")
    try:
        metadata = json.loads(lines[1]) if len(lines) > 1 and lines[1].strip() else {}
    except ValueError:
        raise ConfigurationError(f"{where}: its metadata line is not JSON") from None
    sources = tuple(None if line.strip() == "-" else line.strip() for line in lines[2:]
                    if line.strip())
    return OffsetLogEntry(batch_id, metadata if isinstance(metadata, dict) else {}, sources)


def read_batch(checkpoint: str, batch_id: int, reader: TextReader = local_reader
               ) -> OffsetLogEntry:
    """``offsets/<batch_id>`` of ``checkpoint``, or a :class:`ConfigurationError` saying why
    it cannot be read."""
    text = reader(checkpoint, f"offsets/{batch_id}")
    if text is None:
        raise ConfigurationError(
            f"the checkpoint {checkpoint!r} has no offsets/{batch_id}: Spark planned no batch "
            f"{batch_id} there, or no longer keeps it (it keeps the last "
            "spark.sql.streaming.minBatchesToRetain): is this the sink's query's checkpoint?")
    return parse_offset_log(batch_id, text)


def read_query_id(checkpoint: str, reader: TextReader = local_reader) -> str:
    """The id of the query whose checkpoint this is (``metadata``'s ``id``)."""
    text = reader(checkpoint, "metadata")
    if text is None:
        raise ConfigurationError(f"{checkpoint!r} has no metadata file: not a streaming "
                                 "query's checkpoint")
    try:
        found = json.loads(text.splitlines()[0]).get("id")
    except (ValueError, IndexError, AttributeError):
        found = None
    if not found:
        raise ConfigurationError(f"the metadata file of {checkpoint!r} names no query id")
    return str(found)
