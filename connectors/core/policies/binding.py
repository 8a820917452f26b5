"""How a driver run binds its sink to its query: as bound, reset, or resumed from a savepoint.

A sink is bound to one streaming query (its ledger's binding): another query is refused,
unless ``reset_binding`` rebinds it (forgetting the ledger: what the new query reads again
is written again), or ``resume_from`` lets the new query take over where a savepoint ended
(:func:`resume_rebinds`). Batch ids going backwards within one binding are refused too
(:func:`went_backwards`). :class:`Binding` is the template's choice, carried by the
coordinator's ``BindQuery``.

A new query (a new checkpoint, batch ids from 0 again) may take over a sink only where the
old one ended: the sink's ledger is bound to the savepoint's query, its last decision is
the savepoint's batch (the old query decided nothing after it), and the new query's
sources start exactly where the savepoint's ended (the savepoint checks that against the
new query's checkpoint: :meth:`ResumePoint.check_start`). Then the sink is rebound to the
new query, in a new generation, as ``reset_binding`` does, but without its cost: nothing
is read twice, nothing skipped. A restart of the new query finds the sink bound to it and
resumes nothing. Every refusal comes before anything of the new query's batch is written.

The savepoint itself is :class:`connectors.savepoints.Savepoint` (which reads Spark's
checkpoints); the core sees it through :class:`ResumePoint` only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from connectors.core.errors import ConfigurationError, QueryBindingError
from connectors.core.ledgers.ledger import Ledger, Lineage

__all__ = ["BOUND", "Binding", "Resume", "ResumePoint", "load_resume_point",
           "register_savepoint_loader", "resume_option", "resume_rebinds", "went_backwards"]

logger = logging.getLogger(__name__)


class ResumePoint(Protocol):
    """What the core needs of a savepoint (:class:`connectors.savepoints.Savepoint`; its
    ``sink_id`` too, read by the template's check that it is the sink's own)."""

    @property
    def query_id(self) -> str:
        """The query the savepoint was taken of."""
        ...

    @property
    def batch_id(self) -> int:
        """The last batch that query's sink decided."""
        ...

    def check_start(self, checkpoint: str, query_id: str) -> list[str]:
        """Check that the query ``query_id``, whose checkpoint is ``checkpoint``, starts its
        sources where this savepoint ended: raise
        :class:`~connectors.core.errors.QueryBindingError` naming both positions for a gap
        or an overlap; return a note for each source whose start cannot be checked."""
        ...


#: Reads a savepoint document (a path or its JSON text): :func:`connectors.load_savepoint`,
#: registered by ``connectors/__init__.py`` (the core imports no other package).
_loaders: list[Callable[[str], ResumePoint]] = []


def register_savepoint_loader(loader: Callable[[str], ResumePoint]) -> None:
    """Let ``resume_from`` take a savepoint's file (or JSON) as text: the DataSource form's
    option, and a path in the API."""
    if loader not in _loaders:
        _loaders.append(loader)


def load_resume_point(text: str) -> ResumePoint:
    """The savepoint in the file ``text`` names (or in ``text`` itself, as JSON)."""
    if not _loaders:  # pragma: no cover - connectors/__init__.py registers one
        raise ConfigurationError("no savepoint reader is registered: import connectors")
    try:
        return _loaders[0](text)
    except OSError as exc:
        raise ConfigurationError(f"resume_from: the savepoint {text!r} cannot be read "
                                 f"({exc.strerror or exc})") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigurationError(f"resume_from: {text!r} holds no savepoint ({exc!r})"
                                 ) from None


@dataclass(frozen=True)
class Resume:
    """A sink's ``resume_from``: the savepoint and the new query's checkpoint."""

    point: ResumePoint
    checkpoint: str


@dataclass(frozen=True)
class Binding:
    """A run's binding choice: ``reset`` (the template's ``reset_binding``) or ``resume``
    (its ``resume_from``); neither: the sink stays bound to its one query."""

    reset: bool = False
    resume: Resume | None = None


#: Neither reset nor resumed: the sink stays bound to its one query.
BOUND = Binding()


def went_backwards(sink_id: str, batch_id: int, last: int) -> QueryBindingError:
    """The refusal of batch ``batch_id`` when the ledger already decided ``last`` > it."""
    return QueryBindingError(
        f"batch id went backwards: got {batch_id}, but batch {last} is already decided. "
        "Spark only replays the last batch; this is another query or a reused run id. Use "
        "the original checkpoint or a new sink_id; to change the query on a new checkpoint "
        "take a savepoint of the old one and pass it as resume_from (docs/savepoints.md); "
        "reset_binding=True forgets the ledger, and rows the new query reads again are then "
        "written again (duplicates)", sink_id=sink_id, batch_id=batch_id)


def resume_rebinds(ledger: Ledger, query_id: str, resume: Resume) -> bool:
    """Whether binding ``query_id`` must rebind the sink from the savepoint (``True``), or
    finds it bound to that query already (``False``: a restart of the resumed query).
    Raises :class:`QueryBindingError` when the savepoint does not fit the ledger or the
    new query's start (see the module docstring)."""
    sink_id, point = ledger.sink_id, resume.point
    bound = ledger.bound_query()
    if bound == query_id:
        return False
    if bound != point.query_id:
        raise QueryBindingError(
            f"resume_from: the savepoint is of query {point.query_id}, and the sink is bound "
            f"to {'no query' if bound is None else 'query ' + bound}: a savepoint resumes the "
            "query it was taken of (is this the sink's ledger, and the sink's savepoint?)",
            sink_id=sink_id)
    last = ledger.last_batch_id()
    if last != point.batch_id:
        raise QueryBindingError(
            f"resume_from: the savepoint ends at batch {point.batch_id} of query "
            f"{point.query_id}, but the sink's last decision is batch {last}: the old query "
            "ran on after the savepoint was taken. Take a new savepoint (with the old query "
            "stopped) and resume from that one", sink_id=sink_id)
    for note in point.check_start(resume.checkpoint, query_id):
        logger.warning("sink %s: resume_from: %s", sink_id, note)
    ledger.record_lineage(Lineage(query_id, point.query_id, point.batch_id,
                                  float(getattr(point, "taken_at", 0.0)), time.time()))
    logger.info("sink %s: resuming from the savepoint of query %s at batch %d: bound to "
                "query %s from now on", sink_id, point.query_id, point.batch_id, query_id)
    return True


def resume_option(sink_id: str, given: ResumePoint | str | None, checkpoint: str | None,
                  reset: bool) -> Resume | None:
    """A sink's (or FanOut's) ``resume_from`` and ``checkpoint_location``, checked: the
    :class:`Resume` its runs bind with, or ``None``."""
    try:
        point = load_resume_point(given) if isinstance(given, str) else given
    except ConfigurationError as exc:
        raise ConfigurationError(exc.message, sink_id=sink_id) from None
    if point is None:
        if checkpoint is not None:
            raise ConfigurationError("checkpoint_location is read by resume_from only: pass "
                                     "both, or neither", sink_id=sink_id)
        return None
    if reset:
        raise ConfigurationError("resume_from and reset_binding exclude each other: "
                                 "resume_from rebinds the sink where the savepoint ended, "
                                 "reset_binding wherever the new query starts", sink_id=sink_id)
    if not all(hasattr(point, a) for a in ("query_id", "batch_id", "check_start")):
        raise ConfigurationError("resume_from must be a savepoint (connectors.load_savepoint("
                                 "path), connectors.take_savepoint(...)) or its file's path",
                                 sink_id=sink_id)
    if (owner := getattr(point, "sink_id", None)) != sink_id:
        raise ConfigurationError(f"resume_from is a savepoint of sink {owner!r}, not of this "
                                 "sink", sink_id=sink_id)
    if not checkpoint:
        raise ConfigurationError("resume_from needs checkpoint_location: the new query's "
                                 "checkpoint, where its sources' starting positions are "
                                 "read and checked against the savepoint", sink_id=sink_id)
    return Resume(point, checkpoint)
