"""Does a new query start where a savepoint ended? Read from the new query's checkpoint.

Before its first batch, Spark's Kafka source writes the offsets it starts from to
``<checkpoint>/sources/<i>/0`` (a NUL byte, ``v1``, then the same JSON as the offset log:
``{"topic": {"partition": offset}}``; ``-1``/``-2`` already resolved). So a sink resuming from
a savepoint compares, partition by partition, the savepoint's end offsets with the new
query's start before anything of its first batch is written: a start before the savepoint
would write records twice (an overlap), one after it would never write some (a gap). The
new query's Kafka source is found by its topics, so sources may be added or reordered.

Spark records no start for a Delta source before its first batch commits (only that batch's
end, in ``offsets/0``): its start cannot be checked, and a note says so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from connectors.core.errors import ConfigurationError, QueryBindingError
from connectors.savepoints._offset_log import local_path, read_query_id
from connectors.savepoints._positions import SourcePosition

__all__ = ["check_start", "kafka_starts"]

Offsets = dict[str, dict[str, int]]


def kafka_starts(checkpoint: str) -> dict[int, Offsets]:
    """The starting offsets of each Kafka source of the query whose checkpoint this is, by
    the source's place (``sources/<i>/0``)."""
    root = local_path(checkpoint)
    if root is None:
        raise ConfigurationError(
            f"checkpoint_location {checkpoint!r} is not a local directory: resume_from reads "
            "the new query's starting positions from a local checkpoint (or a file: URI) only")
    found: dict[int, Offsets] = {}
    sources = root / "sources"
    for entry in sorted(sources.iterdir()) if sources.is_dir() else []:
        initial = entry / "0"
        if not entry.name.isdigit() or not initial.is_file():
            continue
        lines = initial.read_text(encoding="utf-8", errors="replace").lstrip("\x00 ").splitlines()
        if len(lines) < 2 or lines[0].strip() != "v1":
            continue
        try:
            value = json.loads(lines[1])
        except ValueError:
            continue
        if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            found[int(entry.name)] = {t: {str(p): int(o) for p, o in parts.items()}
                                      for t, parts in value.items()}
    return found


def _compare(index: int, ends: Offsets, start: Offsets) -> list[str]:
    problems = []
    for topic, parts in sorted(ends.items()):
        for partition, end in sorted(parts.items(), key=lambda kv: int(kv[0])):
            begin = start.get(topic, {}).get(partition)
            where = f"source {index}, topic {topic} partition {partition}"
            if begin is None:
                problems.append(f"{where}: the savepoint ends at offset {end}, and the new "
                                "query does not read that partition")
            elif begin < end:
                problems.append(f"{where}: the new query starts at offset {begin}, the "
                                f"savepoint ends at {end}: records {begin}..{end - 1} would be "
                                "written twice (an overlap)")
            elif begin > end:
                problems.append(f"{where}: the new query starts at offset {begin}, the "
                                f"savepoint ends at {end}: records {end}..{begin - 1} would "
                                "never be written (a gap)")
    return problems


def check_start(sources: Sequence[SourcePosition], checkpoint: str, query_id: str
                ) -> list[str]:
    """Raise :class:`QueryBindingError` when the query ``query_id`` (its checkpoint:
    ``checkpoint``) does not start each savepoint source where it ended; the notes of the
    sources whose start cannot be checked."""
    refused = [f"source {s.index} ({s.kind}): {s.refusal}" for s in sources if s.refusal]
    if refused:
        raise ConfigurationError("resume_from: the savepoint cannot be resumed: "
                                 + "; ".join(refused))
    found = read_query_id(checkpoint)
    if found != query_id:
        raise ConfigurationError(
            f"checkpoint_location {checkpoint!r} is the checkpoint of query {found}, and the "
            f"query that runs the sink is {query_id}: pass the new query's own checkpoint")
    starts = kafka_starts(checkpoint)
    problems: list[str] = []
    notes: list[str] = []
    for source in sources:
        if source.kind == "delta":
            notes.append(f"source {source.index} ({source.detail}): Spark records a Delta "
                         "source's start nowhere before its first batch commits, so it is not "
                         f"checked: the new query must read it with {source.options}")
            continue
        ends: Offsets = json.loads(source.offset or "{}")
        mine = [i for i, start in starts.items() if set(ends) <= set(start)]
        if not mine:
            problems.append(f"source {source.index} (Kafka, topics {', '.join(sorted(ends))}): "
                            "the new query has no Kafka source that reads them")
            continue
        problems += _compare(source.index, ends, starts[mine[0]])
    if problems:
        raise QueryBindingError(
            "resume_from: the new query does not start where the savepoint ended, and "
            "nothing was written: " + "; ".join(problems) + ". Start it with the savepoint's "
            "options (savepoint.options(i)) on a new, empty checkpoint: Spark keeps a "
            f"source's first start in its checkpoint ({checkpoint.rstrip('/')}/sources/), "
            "so remove this one first")
    return notes
