"""A savepoint: the sink's last decided batch and where that batch ended in each source.

The pair is read, never recorded apart (docs/design/savepoints.md): the sink's ledger holds
the last decision (the commit point of its batch), the query's checkpoint holds
``offsets/<that batch>``, which Spark made durable before the batch could be decided and
never rewrites. So a savepoint taken at any moment, after a graceful stop or a SIGKILL,
names a batch whose rows are (or, decided and unfinished, will be) in the target exactly
once, and the offsets right after its last row.

Taking one only reads the ledger and the checkpoint's files (the command line reads the
ledger without its lease, so a live driver is never fenced). It is refused, with the
reason, when the checkpoint belongs to another query than the one the sink's ledger is
bound to, when the sink has decided
nothing of that query yet, or when a fan-out's last batch is decided but not yet in every
target (its Kafka and Delta targets write after the decision, from the batch's rows, which
only the old query can replay).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from connectors.core.errors import ConfigurationError, ProtocolStateError
from connectors.core.ledgers.ledger import BATCH_JOB_QUERY_ID, Ledger
from connectors.core.protocol.fanout_program import TARGET_PREFIX
from connectors.core.states import BatchState
from connectors.savepoints._offset_log import (
    TextReader,
    local_reader,
    read_batch,
    read_query_id,
)
from connectors.savepoints._positions import SourcePosition, position_of
from connectors.savepoints._start_check import check_start

__all__ = ["Savepoint", "load_savepoint", "savepoint_from_ledger"]

#: The savepoint document's format; :meth:`Savepoint.from_json` refuses others.
SAVEPOINT_FORMAT = 1


@dataclass(frozen=True)
class Savepoint:
    """Where a query stood after the last batch its sink decided.

    Attributes:
        sink_id: the sink (or ``FanOut``) whose ledger holds the decision.
        query_id: the streaming query (its checkpoint's id) the sink was bound to.
        batch_id: the last batch the sink decided: its rows are in the target exactly once
            (``committed`` false: decided, and the sink's next run commits the rest of it
            before anything else).
        committed: every transaction of the batch is committed in the target.
        checkpoint: the checkpoint the positions were read from.
        sources: each source's position and starting option, in the query's order.
        taken_at: when the savepoint was taken (seconds since the epoch).
    """

    sink_id: str
    query_id: str
    batch_id: int
    committed: bool
    checkpoint: str
    sources: tuple[SourcePosition, ...]
    taken_at: float = field(default_factory=time.time)

    @property
    def resumable(self) -> bool:
        """Whether every source has an option that starts a new query right after it."""
        return all(s.resumable for s in self.sources)

    def options(self, source: int = 0) -> dict[str, str]:
        """The reader options that start source ``source`` (its place in the query, 0 for a
        one-source query) right after the savepoint, e.g.
        ``spark.readStream.format("kafka").options(**sp.options())``. Raises
        :class:`ConfigurationError` with the reason when the source cannot be resumed."""
        if not 0 <= source < len(self.sources):
            raise ConfigurationError(f"the savepoint has {len(self.sources)} source(s); no "
                                     f"source {source}", sink_id=self.sink_id)
        position = self.sources[source]
        if position.refusal is not None:
            raise ConfigurationError(f"source {source} cannot be resumed from this savepoint: "
                                     f"{position.refusal}", sink_id=self.sink_id)
        return dict(position.options)

    def to_json(self) -> dict[str, Any]:
        return {"format": SAVEPOINT_FORMAT, "sink_id": self.sink_id, "query_id": self.query_id,
                "batch_id": self.batch_id, "committed": self.committed,
                "checkpoint": self.checkpoint, "taken_at": self.taken_at,
                "resumable": self.resumable, "sources": [s.to_json() for s in self.sources]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Savepoint:
        if data.get("format") != SAVEPOINT_FORMAT:
            raise ProtocolStateError(f"savepoint format {data.get('format')!r} is not read by "
                                     f"this release (it reads {SAVEPOINT_FORMAT})")
        return cls(str(data["sink_id"]), str(data["query_id"]), int(data["batch_id"]),
                   bool(data["committed"]), str(data["checkpoint"]),
                   tuple(SourcePosition.from_json(s) for s in data["sources"]),
                   float(data["taken_at"]))

    def check_start(self, checkpoint: str, query_id: str) -> list[str]:
        """Whether the query ``query_id`` (its checkpoint: ``checkpoint``) starts where
        this savepoint ended: :class:`~connectors.core.errors.QueryBindingError` naming
        both positions for a gap or an overlap; the notes of sources whose start cannot be
        checked (what a sink's ``resume_from`` calls before it rebinds)."""
        return check_start(self.sources, checkpoint, query_id)

    def dumps(self) -> str:
        """The savepoint as a JSON document (what :func:`load_savepoint` reads)."""
        return json.dumps(self.to_json(), indent=2, sort_keys=True)

    def describe(self) -> str:
        """The savepoint for people: the batch, then each source's position and option."""
        state = "committed" if self.committed else "decided (its next run commits the rest)"
        lines = [f"savepoint of sink {self.sink_id}: query {self.query_id}, last batch "
                 f"{self.batch_id}, {state}",
                 f"read from checkpoint {self.checkpoint}"]
        for s in self.sources:
            lines.append(f"source {s.index} ({s.kind}): {s.detail or s.offset}")
            if s.refusal is None:
                lines += [f"  start a new query with .option({k!r}, {v!r})"
                          for k, v in s.options.items()]
            else:
                lines.append(f"  not resumable: {s.refusal}")
        lines.append("resumable: " + ("yes" if self.resumable else "no"))
        return "\n".join(lines)


def load_savepoint(text_or_path: str | Path) -> Savepoint:
    """A savepoint from its JSON document, or from the file holding it."""
    text = str(text_or_path)
    if not text.lstrip().startswith("{"):
        text = Path(text).read_text(encoding="utf-8")
    return Savepoint.from_json(json.loads(text))


def savepoint_from_ledger(ledger: Ledger, checkpoint: str, *,
                          reader: TextReader = local_reader,
                          clock: Callable[[], float] = time.time) -> Savepoint:
    """The savepoint of the sink whose ledger this is, read with the query's
    ``checkpoint`` (see the module docstring)."""
    sink_id = ledger.sink_id
    bound = ledger.bound_query()
    if bound is None:
        raise ConfigurationError("the sink is bound to no query yet: it has written nothing, "
                                 "so there is nothing to take a savepoint of", sink_id=sink_id)
    if bound == BATCH_JOB_QUERY_ID:
        raise ConfigurationError("the sink is bound to a batch job, not to a streaming query: "
                                 "a savepoint is a streaming query's", sink_id=sink_id)
    try:
        return _take(ledger, bound, checkpoint, reader, clock)
    except ConfigurationError as exc:  # the checkpoint's refusals: name the sink too
        if exc.sink_id is None:
            exc.sink_id = sink_id
        raise


def _take(ledger: Ledger, bound: str, checkpoint: str, reader: TextReader,
          clock: Callable[[], float]) -> Savepoint:
    sink_id = ledger.sink_id
    query_id = read_query_id(checkpoint, reader)
    if query_id != bound:
        raise ConfigurationError(
            f"the checkpoint {checkpoint!r} belongs to query {query_id}, and the sink is bound "
            f"to query {bound}: name the checkpoint of the query that writes into this sink",
            sink_id=sink_id)
    entries = [e for e in ledger.entries() if e.query_id in (None, bound)]
    if not entries:
        raise ConfigurationError(
            f"the sink has decided no batch of query {bound} yet: a new query should start "
            "its sources where this one started", sink_id=sink_id)
    last = entries[-1]
    if last.state is BatchState.DECIDED and any(
            c.transaction_id.startswith(TARGET_PREFIX) for c in last.commits):
        raise ConfigurationError(
            f"batch {last.batch_id} of this fan-out is decided but not yet in every target: "
            "the targets that write after the decision (Kafka, Delta) need the batch's rows, "
            f"which only the old query has. Run the old query once more on its checkpoint (it "
            f"replays batch {last.batch_id} and finishes it), stop it, then take the "
            "savepoint", sink_id=sink_id)
    planned = read_batch(checkpoint, last.batch_id, reader)
    sources = tuple(position_of(i, line) for i, line in enumerate(planned.sources))
    return Savepoint(sink_id, bound, last.batch_id, last.state is BatchState.COMMITTED,
                     checkpoint, sources, clock())
