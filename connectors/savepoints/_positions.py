"""Each source's position at a savepoint, and the option a new query starts right after it
with (or why no option can).

The offset log names no source type: a line is recognized by its JSON's shape, each
shape checked whole (docs/design/savepoints.md has the table):

- Kafka: ``{"topic": {"partition": offset, ...}, ...}``, every offset the next record to
  read: the new query's ``startingOffsets`` is the same JSON;
- Delta Lake: ``{"sourceVersion", "reservoirId", "reservoirVersion", "index",
  "isStartingVersion"}``: resumable with ``startingVersion`` only at the start of a version
  (``index`` -1) outside the table's initial snapshot;
- rate (a number) and rate-micro-batch (``{"offset", "timestamp"}``), the file source
  (``{"logOffset"}``): no option starts them at a position: refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SourcePosition", "position_of"]

#: Delta's index of "nothing of this version read yet" as its offset log stores it.
_DELTA_BASE_INDEX = -1
_DELTA_KEYS = {"reservoirId", "reservoirVersion", "index", "isStartingVersion"}


@dataclass(frozen=True)
class SourcePosition:
    """Where one source of the query stood when the savepoint's batch ended.

    Attributes:
        index: the source's place in the query's plan (the offset log's order).
        kind: ``"kafka"``, ``"delta"``, ``"rate"``, ``"rate-micro-batch"``, ``"file"``,
            ``"none"`` (no offset yet) or ``"unknown"``.
        offset: the offset log's line for the source, as written (``None`` for ``-``).
        options: the reader options that start a new query right after the position
            (``{"startingOffsets": ...}`` for Kafka, ``{"startingVersion": ...}`` for Delta);
            empty when refused.
        refusal: why no option can start a new query there; ``None`` when resumable.
        detail: the position for people (topics and partitions, the table's version).
    """

    index: int
    kind: str
    offset: str | None
    options: dict[str, str] = field(default_factory=dict)
    refusal: str | None = None
    detail: str = ""

    @property
    def resumable(self) -> bool:
        return self.refusal is None

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "kind": self.kind, "offset": self.offset,
                "options": dict(self.options), "refusal": self.refusal, "detail": self.detail}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SourcePosition:
        return cls(int(data["index"]), str(data["kind"]), data.get("offset"),
                   {str(k): str(v) for k, v in (data.get("options") or {}).items()},
                   data.get("refusal"), str(data.get("detail", "")))


def _is_kafka(value: Any) -> bool:
    return (isinstance(value, dict) and bool(value) and all(
        isinstance(parts, dict) and bool(parts) and all(
            isinstance(p, str) and p.lstrip("-").isdigit() and isinstance(o, int)
            and not isinstance(o, bool) for p, o in parts.items())
        for parts in value.values()))


def _kafka(index: int, line: str, value: dict[str, dict[str, int]]) -> SourcePosition:
    detail = "; ".join(
        f"{topic}: " + ", ".join(f"{p}@{o}" for p, o in sorted(parts.items(),
                                                            key=lambda kv: int(kv[0])))
        for topic, parts in sorted(value.items()))
    return SourcePosition(index, "kafka", line, {"startingOffsets": line}, None, detail)


def _delta(index: int, line: str, value: dict[str, Any]) -> SourcePosition:
    version = int(value["reservoirVersion"])
    file_index = int(value["index"])
    detail = (f"table {value['reservoirId']}, version {version}, file index {file_index}"
              + (", initial snapshot" if value["isStartingVersion"] else ""))
    if value["isStartingVersion"]:
        refusal = (f"the batch ended inside the Delta table's initial snapshot (version "
                   f"{version}, file {file_index}): no reader option starts a query inside "
                   "a snapshot. Take the savepoint once the query reads the table's changes "
                   "(after its first batches)")
    elif file_index != _DELTA_BASE_INDEX:
        refusal = (f"the batch ended inside version {version} of the Delta table (after file "
                   f"index {file_index}); startingVersion={version} would read that "
                   "version's first files again. Take the savepoint when a batch ends at a "
                   "version's end (without maxFilesPerTrigger/maxBytesPerTrigger splitting "
                   "versions, every batch does)")
    else:
        return SourcePosition(index, "delta", line, {"startingVersion": str(version)}, None,
                              detail)
    return SourcePosition(index, "delta", line, {}, refusal, detail)


def position_of(index: int, line: str | None) -> SourcePosition:
    """The position of source ``index`` from its offset log line (``None``: ``-``)."""
    if line is None:
        return SourcePosition(index, "none", None, refusal=(
            "the source had no offset yet when the batch was planned (it had delivered "
            "nothing): start the new query's source as the old query's started"))
    try:
        value = json.loads(line)
    except ValueError:
        value = None
    if _is_kafka(value):
        return _kafka(index, line, value)
    if isinstance(value, dict) and value.keys() >= _DELTA_KEYS:
        return _delta(index, line, value)
    if isinstance(value, int) and not isinstance(value, bool):
        return SourcePosition(index, "rate", line, refusal=(
            "a rate source (its offset is a number): it cannot start at a position, a new "
            "query's rate source starts at 0"), detail=f"offset {value}")
    if isinstance(value, dict) and set(value) == {"offset", "timestamp"}:
        return SourcePosition(index, "rate-micro-batch", line, refusal=(
            "a rate-micro-batch source: it has no option to start at an offset"),
            detail=f"offset {value['offset']}")
    if isinstance(value, dict) and set(value) == {"logOffset"}:
        return SourcePosition(index, "file", line, refusal=(
            "a file source: Spark's file source has no starting position (the files it has "
            "read are listed only in the old checkpoint's sources/ log), so a new query "
            "would read every file again"), detail=f"log offset {value['logOffset']}")
    return SourcePosition(index, "unknown", line, refusal=(
        f"a source whose offset this release does not know ({line[:80]!r}): no starting "
        "option can be derived from it"))
