"""A :class:`~connectors.core.ledgers.ledger.Ledger` in a directory of a POSIX file system.

Layout (one directory per sink)::

    <root>/binding.json                      sink id -> query id
    <root>/decisions/<batch>.json            the decision (first one wins)
    <root>/decisions/<batch>.committed       every transaction of it committed (a decision
                                             recorded COMMITTED says so itself)
    <root>/aborts/<batch>-<run>.json         run <run> may never decide <batch>
    <root>/lineage/<query>.json              query <query> took the sink over from a
                                             savepoint (resume_from)
    <root>/.lock                             flock: decide / abort / bind are serialized

Every file is written to a temporary name, fsynced, renamed, and the directory fsynced, so
a reader never sees half a record and a record that was acknowledged survives a crash
(decisions of a subclass with ``durable_decisions = False`` skip the fsyncs: see there).
``flock`` serializes processes on one machine (and on file systems that honour it, such as
NFSv4); for object stores use a ledger in a database instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

from connectors.core.errors import FencedError
from connectors.core.ledgers.ledger import Ledger, LedgerEntry, Lineage, check_binding
from connectors.core.naming import validate_sink_id
from connectors.core.states import BatchState

__all__ = ["FileLedger"]

logger = logging.getLogger(__name__)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def validate_query_file(query_id: str) -> str:
    """``query_id`` as a file name (Spark's query ids are UUIDs); anything else refused."""
    if not query_id or not all(c.isalnum() or c in "-_." for c in query_id) \
            or query_id.startswith("."):
        raise ValueError(f"not a query id: {query_id!r}")
    return query_id


def write_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (a reader sees all of it or nothing) and, with
    ``durable``, so that it survives an operating-system crash once this returns (without:
    it survives the death of the process, which is all the page cache needs)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if durable:
        _fsync_dir(path.parent)


class FileLedger(Ledger):
    """A ledger kept as small JSON files under ``root`` (see the module docstring).

    Example::

        ledger = FileLedger("/data/out/_connectors_ledger", sink_id="files")
    """

    #: Whether decisions are fsynced. A subclass may turn it off only where the target
    #: itself durably holds what a decision says (the decision is then a cache of it): a
    #: decision lost or torn by an operating-system crash reads as "no decision", and the
    #: template's reconcile path asks the target. An fsync costs 1-3 ms while Spark writes.
    durable_decisions: ClassVar[bool] = True

    def __init__(self, root: str | os.PathLike[str], *, sink_id: str) -> None:
        self.sink_id = validate_sink_id(sink_id)
        self.root = Path(root)
        self._decisions = self.root / "decisions"
        self._aborts = self.root / "aborts"

    def __repr__(self) -> str:
        return f"FileLedger({str(self.root)!r}, sink_id={self.sink_id!r})"

    def _ensure(self) -> None:
        for d in (self.root, self._decisions, self._aborts):
            d.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self._ensure()
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _decision_path(self, batch_id: int) -> Path:
        return self._decisions / f"{batch_id:020d}.json"

    def _abort_path(self, batch_id: int, run_id: str) -> Path:
        return self._aborts / f"{batch_id:020d}-{run_id}.json"

    @staticmethod
    def _read_json(path: Path) -> Any:
        return json.loads(path.read_text())

    def _load(self, path: Path) -> LedgerEntry:
        # The marker before the decision: prune deletes the decision first, so a prune
        # racing this read can make it fail (FileNotFoundError), never make a committed
        # batch look DECIDED.
        committed = path.with_suffix(".committed").exists()
        entry = LedgerEntry.from_json(self._read_json(path))
        return entry.committed() if committed else entry

    def _binding(self) -> dict[str, Any] | None:
        path = self.root / "binding.json"
        return dict(self._read_json(path)) if path.exists() else None

    def bound_query(self) -> str | None:
        binding = self._binding()
        return str(binding["query_id"]) if binding else None

    def generation(self) -> int:
        """How many times ``reset_binding`` rebound the sink (0 before the first)."""
        binding = self._binding()
        return int(binding.get("generation", 0)) if binding else 0

    def record_lineage(self, link: Lineage) -> None:
        name = f"{validate_query_file(link.query_id)}.json"
        folder = self.root / "lineage"
        if not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            _fsync_dir(self.root)
        write_atomic(folder / name, json.dumps(link.to_json()).encode())

    def lineage(self) -> list[Lineage]:
        folder = self.root / "lineage"
        return [Lineage.from_json(self._read_json(p)) for p in sorted(folder.glob("*.json"))
                ] if folder.is_dir() else []

    def bind_query(self, query_id: str, *, reset: bool = False) -> int:
        with self._locked():
            binding = self._binding()
            bound = str(binding["query_id"]) if binding else None
            generation = int(binding.get("generation", 0)) if binding else 0
            if not check_binding(self.sink_id, bound, query_id, reset=reset):
                return generation
            if binding is not None:  # a reset: batch ids restart, so does the ledger
                generation += 1
                for path in [*self._decisions.iterdir(), *self._aborts.iterdir()]:
                    path.unlink()
            payload = {"sink_id": self.sink_id, "query_id": query_id, "generation": generation}
            write_atomic(self.root / "binding.json", json.dumps(payload).encode())
            return generation

    def get(self, batch_id: int) -> LedgerEntry | None:
        path = self._decision_path(batch_id)
        try:
            return self._load(path)
        except FileNotFoundError:  # never decided, or pruned by another process
            return None
        except ValueError:
            if self.durable_decisions:
                raise
            # Only an operating-system crash can tear a decision that was not fsynced.
            logger.warning("sink %s: the decision of batch %d at %s is unreadable (torn by a "
                           "crash?); the target is asked instead", self.sink_id, batch_id, path)
            return None

    def decide(self, entry: LedgerEntry) -> LedgerEntry:
        with self._locked():
            existing = self.get(entry.batch_id)
            if existing is not None:
                return existing
            if self._abort_path(entry.batch_id, entry.run_id).exists():
                raise FencedError(
                    f"run {entry.run_id} of the sink was aborted for this batch by another "
                    "driver or an operator; its transactions were rolled back",
                    sink_id=self.sink_id,
                    batch_id=entry.batch_id,
                )
            # One file: an entry recorded COMMITTED (a driver-side commit) says so in its
            # state; only a DECIDED one later gets the ``.committed`` marker.
            write_atomic(
                self._decision_path(entry.batch_id),
                json.dumps(entry.to_json()).encode(),
                durable=self.durable_decisions,
            )
            return entry

    def forbid_decision(self, batch_id: int, run_id: str) -> LedgerEntry | None:
        with self._locked():
            existing = self.get(batch_id)
            if existing is not None and existing.run_id == run_id:
                return existing
            payload = {"batch_id": batch_id, "run_id": run_id}
            write_atomic(self._abort_path(batch_id, run_id), json.dumps(payload).encode())
            return None

    def mark_committed(self, batch_id: int) -> None:
        path = self._decision_path(batch_id).with_suffix(".committed")
        if not path.exists():
            write_atomic(path, b"", durable=self.durable_decisions)

    def _decision_files(self) -> list[Path]:
        """The decision files, in batch order (names only: nothing is read)."""
        if not self._decisions.exists():
            return []
        return sorted(self._decisions.glob("*.json"))

    def last_batch_id(self) -> int | None:
        files = self._decision_files()
        return int(files[-1].stem) if files else None

    def entries(self) -> Sequence[LedgerEntry]:
        entries = []
        for path in self._decision_files():
            entry = self.get(int(path.stem))
            if entry is not None:  # else pruned by another process since the listing
                entries.append(entry)
        return entries

    def prune(self, keep: int) -> None:
        files = self._decision_files()
        if len(files) <= keep:
            return
        cutoff = int(files[-keep].stem) if keep > 0 else int(files[-1].stem) + 1
        with self._locked():
            for path in files:
                batch_id = int(path.stem)
                if batch_id >= cutoff:
                    break
                entry = self.get(batch_id)
                if entry is None:  # another process of the sink pruned it already
                    continue
                if entry.state is BatchState.COMMITTED:
                    # Decision first: a crash in between leaves a stray marker, never a
                    # decision that looks unfinished.
                    # missing_ok: another process of the sink may have pruned it already.
                    path.unlink(missing_ok=True)
                    path.with_suffix(".committed").unlink(missing_ok=True)
            for path in self._aborts.glob("*.json"):
                if int(path.name.split("-")[0]) < cutoff:
                    path.unlink(missing_ok=True)
