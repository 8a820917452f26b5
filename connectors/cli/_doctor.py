"""``doctor``: compare a query's Spark checkpoint with its sink's ledger.

Spark plans batch N in ``<checkpoint>/offsets/N`` before running it and writes
``<checkpoint>/commits/N`` after ``foreachBatch`` returned. The sink records its decision
in between. So, for a healthy pair (batch ids as integers):

- the sink is bound to this checkpoint's query (``<checkpoint>/metadata``'s ``id``);
- the sink never holds a batch Spark did not plan (ledger last <= offsets last);
- the sink is at most one batch ahead of Spark's commit log (a crash between the sink's
  commit and Spark's commit leaves it exactly one ahead; the replay is then a no-op);
- every batch in Spark's commit log that the ledger still retains is COMMITTED there
  (DECIDED is allowed only after a database crash lost the asynchronous "committed"
  mark: the next run finishes it), and the ledger has no gaps.

A driver killed while Spark writes the query's first offset log entry leaves only that
write's temporary file (``offsets/.0.<uuid>.tmp``, and its ``..0.<uuid>.tmp.crc``): no batch
was planned and the sink wrote nothing, yet Spark >= 4.1 refuses to start the query
(``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``: the offset log "should be empty on batch
0", SPARK-53103). The doctor names those files and the one safe fix: remove them (only
them), then restart; the restart plans batch 0 anew and delivers every row once.

It also shows, per component (``jars:delta``, ``jars:kafka``), the jars
:func:`connectors.spark.get_session` would put on the class path, read from the jar cache
without starting Spark or Maven (:func:`connectors.spark.jar_report`); a cached Delta jar
of another minor version than delta-spark's is an error, as it is at session start.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from connectors.cli._model import Finding
from connectors.core.errors import ConfigurationError
from connectors.core.ledgers.ledger import BATCH_JOB_QUERY_ID, LedgerEntry
from connectors.core.states import BatchState

__all__ = ["Checkpoint", "check", "jar_findings", "offset_log_findings", "read_checkpoint"]


#: A temporary file of Spark's atomic checkpoint writes (CheckpointFileManager names it
#: ``.<name>.<uuid>.tmp``; a checksummed file system adds ``..<name>.<uuid>.tmp.crc``).
_TEMP_FILE = re.compile(r"^\.{1,2}\d+\.[^/]+\.tmp(\.crc)?$")


@dataclass(frozen=True)
class Checkpoint:
    path: str
    query_id: str | None
    offsets: list[int]
    commits: list[int]
    #: temporary files of interrupted offset log writes, by name (in ``offsets/``)
    offset_temps: tuple[str, ...] = ()


def _batch_ids(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def read_checkpoint(path: str) -> Checkpoint:
    """Read a local Spark checkpoint directory (``metadata``, ``offsets/``, ``commits/``)."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint {path} is not a directory")
    query_id = None
    meta = root / "metadata"
    if meta.is_file():
        try:
            query_id = json.loads(meta.read_text().splitlines()[0]).get("id")
        except (ValueError, IndexError):
            query_id = None
    offsets = root / "offsets"
    temps = tuple(sorted(p.name for p in offsets.iterdir() if _TEMP_FILE.match(p.name))) \
        if offsets.is_dir() else ()
    return Checkpoint(str(root), query_id, _batch_ids(offsets), _batch_ids(root / "commits"),
                      temps)


def offset_log_findings(ckpt: Checkpoint) -> list[Finding]:
    """What interrupted offset log writes left (none: no finding).

    Only temporary files and no offset: a driver died writing the first entry, and Spark
    >= 4.1 will not start the query until they are removed (an error, with the exact fix).
    Beside planned batches they are harmless (Spark ignores them): a warning.
    """
    if not ckpt.offset_temps:
        return []
    paths = [str(Path(ckpt.path) / "offsets" / name) for name in ckpt.offset_temps]
    fix = "rm -- " + " ".join(shlex.quote(p) for p in paths)
    if not ckpt.offsets:
        return [Finding("first-offset-write", False,
                        f"a driver died while Spark wrote this query's first offset log entry: "
                        f"offsets/ holds only {', '.join(ckpt.offset_temps)}. No batch was "
                        "planned, so the sink wrote nothing for this query, yet Spark >= 4.1 "
                        "refuses to start it (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY). The "
                        f"safe fix, with the query stopped: remove only those files ({fix}), "
                        "then restart the query: it plans batch 0 anew and delivers every "
                        "row once. Do not remove anything else of the checkpoint")]
    return [Finding("offset-temp-files", False,
                    f"offsets/ holds temporary files of an interrupted write "
                    f"({', '.join(ckpt.offset_temps)}): harmless, Spark ignores them; with "
                    f"the query stopped they may be removed ({fix})", severity="warning")]


def check(ckpt: Checkpoint, entries: list[LedgerEntry], bound_query: str | None) -> list[Finding]:
    """Every invariant between the checkpoint and the ledger, as findings."""
    out: list[Finding] = []
    ledger_ids = [e.batch_id for e in entries]
    last_offset = ckpt.offsets[-1] if ckpt.offsets else None
    last_commit = ckpt.commits[-1] if ckpt.commits else None
    last_ledger = ledger_ids[-1] if ledger_ids else None

    # 1. binding
    if bound_query is None:
        out.append(Finding("binding", ckpt.commits == [],
                           "the sink is bound to no query" + (
                               "" if not ckpt.commits else
                               f", yet Spark committed {len(ckpt.commits)} batch(es)")))
    elif bound_query == BATCH_JOB_QUERY_ID:
        out.append(Finding("binding", False, "the sink is bound to a batch job, not to this "
                           "streaming query: the query will refuse to write (reset_binding)"))
    elif ckpt.query_id is not None:
        same = bound_query == ckpt.query_id
        out.append(Finding("binding", same, f"sink bound to query {bound_query}, checkpoint "
                           f"belongs to {ckpt.query_id}" + ("" if same else
                           ": another checkpoint uses this sink id; the query will refuse "
                           "to write until reset_binding=True (rows the new query reads "
                           "again are then written again) or a new sink_id")))
    # 2. never ahead of Spark's plan
    if last_ledger is not None:
        ok = last_offset is not None and last_ledger <= last_offset
        out.append(Finding("not-ahead-of-plan", ok,
                           f"ledger's last batch {last_ledger}, Spark planned up to "
                           f"{last_offset}" + ("" if ok else ": the checkpoint is older than "
                           "the sink (restored or reset checkpoint?): batches would be "
                           "skipped as already committed")))
    # 3. at most one batch ahead of the commit log
    if last_ledger is not None:
        ahead = last_ledger - (last_commit if last_commit is not None else -1)
        ok = ahead <= 1
        out.append(Finding("at-most-one-ahead", ok,
                           f"ledger's last batch {last_ledger}, Spark's commit log "
                           f"{last_commit} ({ahead:+d})" + (
                               "" if ok else ": more than one batch ahead of Spark")))
    # 4. every committed Spark batch the ledger retains is committed in the sink
    if entries:
        first = entries[0].batch_id
        by_id = {e.batch_id: e for e in entries}
        missing = [b for b in ckpt.commits if b >= first and b not in by_id]
        out.append(Finding("spark-commits-in-ledger", not missing,
                           f"Spark committed {len(ckpt.commits)} batch(es); the ledger "
                           f"retains {first}..{last_ledger}" + (
                               f"; missing from the ledger: {missing[:10]}" if missing else "")))
        decided = [b for b in ckpt.commits if b in by_id
                   and by_id[b].state is BatchState.DECIDED]
        out.append(Finding("finished", not decided,
                           "every decided batch is committed" if not decided else
                           f"batches {decided} are decided but not marked committed: the "
                           "next run (or `connectors recover --commit-decided`) finishes them",
                           severity="warning"))
        gaps = sorted(set(range(first, (last_ledger or 0) + 1)) - set(ledger_ids))
        out.append(Finding("no-gaps", not gaps, "no gaps in the ledger" if not gaps else
                           f"batch ids missing from the ledger: {gaps[:10]}"))
    elif ckpt.commits:
        out.append(Finding("spark-commits-in-ledger", False,
                           f"Spark committed {len(ckpt.commits)} batch(es) but the sink's "
                           "ledger is empty: wrong sink id or ledger location?"))
    return out


def jar_findings() -> list[Finding]:
    """One finding per Spark component: the jars a session would get, from the cache alone.

    A component a session gets only by name (``"s3"``) that cannot be planned is a warning;
    one that has no release for the running Spark (``"iceberg"`` on Spark 4.2) is said, as
    a fact of this Spark, not a fault.
    """
    from connectors.spark import COMPONENTS, DEFAULT_COMPONENTS, jar_report
    from connectors.spark.jars import unavailable

    out: list[Finding] = []
    for component in COMPONENTS:
        why = unavailable(component)
        if why is not None:
            out.append(Finding(f"jars:{component}", True, f"not for this Spark: {why}"))
            continue
        try:
            (choice,) = jar_report([component])
        except ConfigurationError as exc:
            out.append(Finding(f"jars:{component}", False, str(exc),
                               severity="error" if component in DEFAULT_COMPONENTS
                               else "warning"))
            continue
        out.append(Finding(f"jars:{component}", True, choice.line().split(": ", 1)[1]))
    return out
