"""``status --watch``: what the watcher sees at each refresh, and how it is shown.

An :class:`Observer` asks every target for every sink's state once per refresh and returns
one :class:`WatchRow` per sink: the last committed batch, its lag behind Spark's offset log
(where a checkpoint of the sink's query was given), the unfinished batches, the lingering
transactions (open or prepared on the target) and the age of the oldest, and the error
that reaching the target or reading the sink raised. An error never ends the watch: the
row shows it, the target is built again at the next refresh (new connections), and the row
recovers when the target is back.

Rendered as a table (:func:`render_screen`) or one JSON document per refresh
(:func:`json_line`). Targets describe themselves with their secrets redacted; errors are
the library's own, which never carry secrets either.

Example::

    >>> row = WatchRow("orders", "postgres", "postgres host=db", last_committed=41,
    ...                lag=1, lingering=2, oldest_lingering_s=75.0)
    >>> print(render_table_of([row]).splitlines()[2].split())
    ['postgres', 'orders', '41', '1', '0', '2', '75', '-']
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from connectors.cli._doctor import Checkpoint, read_checkpoint
from connectors.cli._model import render_table
from connectors.cli._targets import Target
from connectors.core.errors import ConnectorError

__all__ = ["Observer", "Snapshot", "WatchRow", "json_line", "render_screen",
           "render_table_of"]

logger = logging.getLogger(__name__)

#: Longest error text shown in a table cell (``--json`` carries it whole).
ERROR_WIDTH = 100


@dataclass
class WatchRow:
    """One sink on one target at one refresh (``error`` set: the values are unknown)."""

    sink_id: str
    target: str  # the kind: "postgres", "kafka", "delta" or "iceberg"
    where: str  # the target described, secrets redacted
    reachable: bool = True
    query_id: str | None = None
    last_committed: int | None = None
    lag: int | None = None  # batches Spark planned beyond the last committed one
    unfinished: list[int] = field(default_factory=list)
    lingering: int = 0
    oldest_lingering_s: float | None = None
    error: str | None = None


@dataclass
class Snapshot:
    """Every row of one refresh, and when it was taken (seconds since the epoch)."""

    time: float
    rows: list[WatchRow]


def lag_of(checkpoints: Sequence[Checkpoint], query_id: str | None,
           last_committed: int | None) -> int | None:
    """Batches in the offset log of the sink's query's checkpoint past the last committed
    one; ``None`` without a checkpoint of that query."""
    for ckpt in checkpoints:
        if query_id is not None and ckpt.query_id == query_id and ckpt.offsets:
            return max(0, ckpt.offsets[-1] - (-1 if last_committed is None else last_committed))
    return None


class Observer:
    """Reads every sink of every target once per :meth:`refresh`.

    ``targets`` are the targets to watch; ``rebuild(kind)`` makes a fresh one of a kind
    after an error (its connections may be dead). ``sink_ids`` limits the sinks (empty:
    every sink a target knows); ``checkpoints`` are local Spark checkpoint directories.
    """

    def __init__(self, targets: Sequence[Target], rebuild: Callable[[str], Target],
                 sink_ids: Sequence[str] = (), checkpoints: Sequence[str] = ()) -> None:
        self._targets = list(targets)
        self._rebuild = rebuild
        self._sink_ids = list(sink_ids)
        self._checkpoints = list(checkpoints)
        #: The sinks last seen per target kind: an unreachable target's rows keep them.
        self._known: dict[str, list[str]] = {}
        self._broken: set[str] = set()

    def _read_checkpoints(self) -> list[Checkpoint]:
        out = []
        for path in self._checkpoints:
            try:
                out.append(read_checkpoint(path))
            except (OSError, ValueError) as exc:
                logger.info("checkpoint %s not readable: %s", path, exc)
        return out

    def refresh(self) -> Snapshot:
        checkpoints = self._read_checkpoints()
        rows: list[WatchRow] = []
        for i, old in enumerate(self._targets):
            target = old
            if old.kind in self._broken:
                try:
                    old.close()
                except Exception as exc:
                    logger.debug("closing %s: %s", old.kind, exc)
                try:
                    target = self._targets[i] = self._rebuild(old.kind)
                except Exception as exc:
                    rows += self._failed(old, exc)
                    continue
                self._broken.discard(old.kind)
            rows += self._rows(target, checkpoints)
        return Snapshot(time.time(), rows)

    def _failed(self, target: Target, exc: BaseException) -> list[WatchRow]:
        """The rows of a target that could not be read: the sinks last seen, the error."""
        self._broken.add(target.kind)
        return [WatchRow(s, target.kind, target.describe(), reachable=False, error=_text(exc))
                for s in self._sink_ids or self._known.get(target.kind) or ["-"]]

    def _rows(self, target: Target, checkpoints: list[Checkpoint]) -> list[WatchRow]:
        where = target.describe()
        try:
            sinks = self._sink_ids or target.sink_ids()
        except Exception as exc:  # any failure is shown in the rows; the watch goes on
            return self._failed(target, exc)
        self._known[target.kind] = list(sinks)
        rows = []
        for sink_id in sinks:
            try:
                status = target.status(sink_id)
            except Exception as exc:
                self._broken.add(target.kind)
                rows.append(WatchRow(sink_id, target.kind, where, reachable=False,
                                     error=_text(exc)))
                continue
            ages = [item.age_s for item in status.lingering if item.age_s is not None]
            rows.append(WatchRow(
                sink_id, target.kind, where, query_id=status.query_id,
                last_committed=status.last_committed,
                lag=lag_of(checkpoints, status.query_id, status.last_committed),
                unfinished=list(status.unfinished), lingering=len(status.lingering),
                oldest_lingering_s=max(ages) if ages else None))
        return rows

    def close(self) -> None:
        for target in self._targets:
            try:
                target.close()
            except Exception as exc:
                logger.debug("closing %s: %s", target.kind, exc)


def _text(exc: BaseException) -> str:
    """The library's errors as they are (they redact secrets), others with their type."""
    return str(exc) if isinstance(exc, ConnectorError) else f"{type(exc).__name__}: {exc}"


def _short(text: str | None) -> str:
    if not text:
        return "-"
    line = " ".join(text.split())
    return line if len(line) <= ERROR_WIDTH else line[:ERROR_WIDTH - 3] + "..."


def render_table_of(rows: Sequence[WatchRow]) -> str:
    """The rows as one table, one line per sink."""
    return render_table(
        ["target", "sink", "last committed", "lag", "unfinished", "lingering", "oldest s",
         "error"],
        [[r.target, r.sink_id,
          *(["-"] * 5 if r.error else
            [r.last_committed, r.lag, len(r.unfinished), r.lingering,
             None if r.oldest_lingering_s is None else f"{r.oldest_lingering_s:.0f}"]),
          _short(r.error)] for r in rows])


def render_screen(snapshot: Snapshot, interval: float) -> str:
    """A refresh as a human reads it: a heading, the table, the targets watched."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snapshot.time))
    lines = [f"connectors status --watch  every {interval:g} s  {stamp}  (Ctrl-C to stop)", ""]
    lines.append(render_table_of(snapshot.rows) if snapshot.rows else "no sinks found")
    lines.append("")
    lines += [f"{kind}: {where}" for kind, where in
              dict.fromkeys((r.target, r.where) for r in snapshot.rows)]
    return "\n".join(lines) + "\n"


def json_line(snapshot: Snapshot) -> str:
    """A refresh as one line of JSON (``{"time": ..., "sinks": [...]}``), no newline."""
    return json.dumps({"time": round(snapshot.time, 3),
                       "sinks": [asdict(r) for r in snapshot.rows]}, sort_keys=True)
