"""A :class:`~connectors.core.ledger.Ledger` in a directory of a POSIX file system.

Layout (one directory per sink)::

    <root>/binding.json                      sink id -> query id
    <root>/decisions/<batch>.json            the decision (first one wins)
    <root>/decisions/<batch>.committed       every transaction of it committed
    <root>/aborts/<batch>-<run>.json         run <run> may never decide <batch>
    <root>/.lock                             flock: decide / abort / bind are serialized

Every file is written to a temporary name, fsynced, renamed, and the directory fsynced, so
a reader never sees half a record and a record that was acknowledged survives a crash.
``flock`` serializes processes on one machine (and on file systems that honour it, such as
NFSv4); for object stores use a ledger in a database instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from connectors.core.errors import FencedError
from connectors.core.ledger import Ledger, LedgerEntry, check_binding
from connectors.core.naming import validate_sink_id
from connectors.core.protocol import BatchState

__all__ = ["FileLedger"]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically and durably."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class FileLedger(Ledger):
    """A ledger kept as small JSON files under ``root`` (see the module docstring).

    Example::

        ledger = FileLedger("/data/out/_connectors_ledger", sink_id="files")
    """

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
        try:
            return self._load(self._decision_path(batch_id))
        except FileNotFoundError:  # never decided, or pruned by another process
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
            path = self._decision_path(entry.batch_id)
            write_atomic(path, json.dumps(entry.to_json()).encode())
            if entry.state is BatchState.COMMITTED:
                write_atomic(path.with_suffix(".committed"), b"")
            return entry

    def abort(self, batch_id: int, run_id: str) -> LedgerEntry | None:
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
            write_atomic(path, b"")

    def entries(self) -> Sequence[LedgerEntry]:
        if not self._decisions.exists():
            return []
        entries = []
        for path in sorted(self._decisions.glob("*.json")):
            try:
                entries.append(self._load(path))
            except FileNotFoundError:  # pruned by another process since the listing
                continue
        return entries

    def prune(self, keep: int) -> None:
        entries = self.entries()
        if len(entries) <= keep:
            return
        cutoff = entries[-keep].batch_id if keep > 0 else entries[-1].batch_id + 1
        with self._locked():
            for entry in entries:
                if entry.batch_id < cutoff and entry.state is BatchState.COMMITTED:
                    # Decision first: a crash in between leaves a stray marker, never a
                    # decision that looks unfinished.
                    # missing_ok: another process of the sink may have pruned it already.
                    self._decision_path(entry.batch_id).unlink(missing_ok=True)
                    marker = self._decision_path(entry.batch_id).with_suffix(".committed")
                    marker.unlink(missing_ok=True)
            for path in self._aborts.glob("*.json"):
                if int(path.name.split("-")[0]) < cutoff:
                    path.unlink(missing_ok=True)
