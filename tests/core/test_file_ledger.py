"""FileLedger: first decision wins, decide/abort serialized, binding generations, pruning,
durability across instances, and atomicity across processes."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from connectors.core.errors import ConfigurationError, FencedError, QueryBindingError
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers.file_ledger import FileLedger
from connectors.core.ledgers.ledger import LedgerEntry, TaskCommit
from connectors.core.states import BatchState

SINK = "events"
RUN_A, RUN_B, RUN_C = "aaaaaaaa", "bbbbbbbb", "cccccccc"


def entry(
    batch_id: int, run_id: str = RUN_A, state: BatchState = BatchState.DECIDED
) -> LedgerEntry:
    commits = (
        TaskCommit(f"eos1|{SINK}|{run_id}|{batch_id}|1", 0, 1, Fingerprint(2, 11), 10),
        TaskCommit(f"eos1|{SINK}|{run_id}|{batch_id}|2", 1, 2, Fingerprint(3, 22), 20,
                   replayed=True),
    )
    return LedgerEntry(SINK, batch_id, run_id, state, commits, Fingerprint(5, 33), "query-1")


@pytest.fixture
def ledger(tmp_path: Path) -> FileLedger:
    return FileLedger(tmp_path / "ledger", sink_id=SINK)


def reopen(ledger: FileLedger) -> FileLedger:
    """The same ledger as a restarted driver sees it."""
    return FileLedger(ledger.root, sink_id=ledger.sink_id)


# --- basics ------------------------------------------------------------------------------


def test_empty_ledger(ledger: FileLedger) -> None:
    assert ledger.get(0) is None
    assert ledger.entries() == []
    assert ledger.unfinished() == []
    assert ledger.last_batch_id() is None
    assert ledger.bound_query() is None
    ledger.prune(3)  # nothing to do, nothing created on disk needed


def test_invalid_sink_id_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError):
        FileLedger(tmp_path, sink_id="bad id")


def test_repr_names_root_and_sink(ledger: FileLedger) -> None:
    assert repr(ledger) == f"FileLedger({str(ledger.root)!r}, sink_id='events')"


# --- decide / abort ----------------------------------------------------------------------


def test_decide_records_and_returns_the_entry(ledger: FileLedger) -> None:
    mine = entry(0)
    assert ledger.decide(mine) == mine
    assert ledger.get(0) == mine
    assert ledger.unfinished() == [mine]


def test_first_decision_wins(ledger: FileLedger) -> None:
    first = entry(0, RUN_A)
    ledger.decide(first)
    second = ledger.decide(entry(0, RUN_B))
    assert second == first
    assert second.run_id == RUN_A
    assert ledger.get(0) == first
    assert reopen(ledger).get(0) == first


def test_abort_then_decide_by_the_same_run_is_fenced(ledger: FileLedger) -> None:
    assert ledger.forbid_decision(0, RUN_A) is None
    with pytest.raises(FencedError) as info:
        ledger.decide(entry(0, RUN_A))
    assert RUN_A in str(info.value)
    assert info.value.batch_id == 0
    assert info.value.sink_id == SINK
    assert ledger.get(0) is None


def test_abort_of_one_run_does_not_fence_another(ledger: FileLedger) -> None:
    ledger.forbid_decision(0, RUN_A)
    mine = entry(0, RUN_B)
    assert ledger.decide(mine) == mine


def test_abort_of_one_batch_does_not_fence_another(ledger: FileLedger) -> None:
    ledger.forbid_decision(0, RUN_A)
    assert ledger.decide(entry(1, RUN_A)).run_id == RUN_A


def test_decide_then_abort_by_the_same_run_returns_the_decision(ledger: FileLedger) -> None:
    decided = ledger.decide(entry(0, RUN_A))
    assert ledger.forbid_decision(0, RUN_A) == decided
    assert ledger.get(0) == decided  # still decided: must be committed, never rolled back


def test_abort_by_another_run_after_a_decision_returns_none(ledger: FileLedger) -> None:
    decided = ledger.decide(entry(0, RUN_A))
    assert ledger.forbid_decision(0, RUN_B) is None
    assert ledger.get(0) == decided


def test_a_decision_found_first_wins_over_an_abort_record(ledger: FileLedger) -> None:
    decided = ledger.decide(entry(0, RUN_A))
    ledger.forbid_decision(0, RUN_B)
    # decide by the aborted run returns the existing decision (first wins), no error
    assert ledger.decide(entry(0, RUN_B)) == decided


def test_mark_committed(ledger: FileLedger) -> None:
    decided = ledger.decide(entry(0))
    ledger.mark_committed(0)
    got = ledger.get(0)
    assert got is not None
    assert got.state is BatchState.COMMITTED
    assert got == decided.committed()
    assert ledger.unfinished() == []
    ledger.mark_committed(0)  # idempotent
    assert reopen(ledger).get(0).state is BatchState.COMMITTED  # type: ignore[union-attr]


def test_deciding_a_committed_entry_records_it_committed(ledger: FileLedger) -> None:
    ledger.decide(entry(0, state=BatchState.COMMITTED))
    assert ledger.get(0).state is BatchState.COMMITTED  # type: ignore[union-attr]
    assert ledger.unfinished() == []
    # One file: the record says COMMITTED itself, no marker is needed.
    assert sorted(p.name for p in (ledger.root / "decisions").iterdir()) == [
        f"{0:020d}.json"
    ]
    assert reopen(ledger).get(0).state is BatchState.COMMITTED  # type: ignore[union-attr]


def test_entries_are_ordered_by_batch_id(ledger: FileLedger) -> None:
    for b in (10, 2, 100, 7, 0, 99):
        ledger.decide(entry(b))
    assert [e.batch_id for e in ledger.entries()] == [0, 2, 7, 10, 99, 100]
    assert ledger.last_batch_id() == 100


def test_unfinished_lists_only_decided_batches(ledger: FileLedger) -> None:
    for b in range(4):
        ledger.decide(entry(b))
    ledger.mark_committed(0)
    ledger.mark_committed(2)
    assert [e.batch_id for e in ledger.unfinished()] == [1, 3]


# --- durability --------------------------------------------------------------------------


def test_everything_survives_a_new_instance(ledger: FileLedger) -> None:
    assert ledger.bind_query("query-1") == 0
    first = ledger.decide(entry(0))
    ledger.mark_committed(0)
    second = ledger.decide(entry(1, RUN_B))
    ledger.forbid_decision(2, RUN_C)

    again = reopen(ledger)
    assert again.bound_query() == "query-1"
    assert again.bind_query("query-1") == 0
    assert again.entries() == [first.committed(), second]
    assert again.get(1) == second  # commits, fingerprints, decided_at
    assert again.get(1).commits[1].replayed  # type: ignore[union-attr]
    with pytest.raises(FencedError):
        again.decide(entry(2, RUN_C))


def test_no_temporary_files_are_left_behind(ledger: FileLedger) -> None:
    ledger.bind_query("q")
    for b in range(3):
        ledger.decide(entry(b))
        ledger.mark_committed(b)
    ledger.forbid_decision(3, RUN_B)
    leftovers = [p for p in ledger.root.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []


class CacheLedger(FileLedger):
    """A ledger whose decisions only cache what the target holds (like DeltaLedger)."""

    durable_decisions = False


def test_a_durable_ledger_fsyncs_every_decision(
    ledger: FileLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    ledger.decide(entry(0))
    ledger.mark_committed(0)
    assert len(calls) == 4  # file and directory, twice


def test_a_cache_ledger_skips_the_fsyncs_of_decisions_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    cache = CacheLedger(tmp_path / "ledger", sink_id=SINK)
    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    first = cache.decide(entry(0))
    cache.mark_committed(0)
    second = cache.decide(entry(1, state=BatchState.COMMITTED))
    assert calls == []
    assert CacheLedger(cache.root, sink_id=SINK).entries() == [first.committed(), second]
    cache.bind_query("q")  # the binding and abort records stay durable
    cache.forbid_decision(2, RUN_B)
    assert len(calls) == 4


@pytest.mark.parametrize("torn", [b"", b'{"v": 1, "sink_id": "ev'], ids=["empty", "cut"])
def test_a_torn_decision_of_a_cache_ledger_reads_as_absent_and_is_rewritten(
    tmp_path: Path, torn: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    cache = CacheLedger(tmp_path / "ledger", sink_id=SINK)
    for b in range(3):
        cache.decide(entry(b, state=BatchState.COMMITTED))
    (cache.root / "decisions" / f"{1:020d}.json").write_bytes(torn)  # an OS crash's leftover
    assert cache.get(1) is None
    assert "unreadable" in caplog.text
    assert [e.batch_id for e in cache.entries()] == [0, 2]
    assert cache.last_batch_id() == 2
    cache.prune(1)  # does not fail on it
    again = entry(1, RUN_B, state=BatchState.COMMITTED)
    assert cache.decide(again) == again  # the reconcile path records it again
    assert cache.get(1) == again


def test_a_torn_decision_of_a_durable_ledger_is_an_error(ledger: FileLedger) -> None:
    ledger.decide(entry(0))
    (ledger.root / "decisions" / f"{0:020d}.json").write_bytes(b"")
    with pytest.raises(ValueError):
        ledger.get(0)


# --- prune -------------------------------------------------------------------------------


def _decide_committed(ledger: FileLedger, batches: range) -> None:
    for b in batches:
        ledger.decide(entry(b))
        ledger.mark_committed(b)


def test_prune_keeps_the_last_n(ledger: FileLedger) -> None:
    _decide_committed(ledger, range(10))
    ledger.prune(3)
    assert [e.batch_id for e in ledger.entries()] == [7, 8, 9]
    assert ledger.get(6) is None
    # the pruned batches' files are gone, markers included
    assert sorted(p.name for p in (ledger.root / "decisions").iterdir()) == [
        f"{b:020d}.{ext}" for b in (7, 8, 9) for ext in ("committed", "json")
    ]


def test_prune_with_fewer_entries_than_keep_does_nothing(ledger: FileLedger) -> None:
    _decide_committed(ledger, range(3))
    ledger.prune(3)
    ledger.prune(100)
    assert [e.batch_id for e in ledger.entries()] == [0, 1, 2]


def test_prune_never_removes_a_decided_unfinished_batch(ledger: FileLedger) -> None:
    _decide_committed(ledger, range(10))
    (ledger.root / "decisions" / f"{2:020d}.committed").unlink()  # batch 2: not finished
    ledger.prune(3)
    assert [e.batch_id for e in ledger.entries()] == [2, 7, 8, 9]
    assert [e.batch_id for e in ledger.unfinished()] == [2]


def test_prune_forgets_old_abort_records_and_keeps_recent_ones(ledger: FileLedger) -> None:
    _decide_committed(ledger, range(10))
    ledger.forbid_decision(1, RUN_B)
    ledger.forbid_decision(8, RUN_B)
    ledger.forbid_decision(12, RUN_B)
    ledger.prune(3)
    names = sorted(p.name for p in (ledger.root / "aborts").iterdir())
    assert names == [f"{8:020d}-{RUN_B}.json", f"{12:020d}-{RUN_B}.json"]
    with pytest.raises(FencedError):
        ledger.decide(entry(12, RUN_B))


def test_concurrent_prune_from_a_stale_listing_does_not_fail(ledger: FileLedger) -> None:
    # Two drivers of one sink (a zombie and its replacement) may prune at once: the one
    # that listed the entries first must not fail on files the other already deleted.
    _decide_committed(ledger, range(6))
    other = reopen(ledger)
    stale = list(other.entries())
    ledger.prune(2)
    other.entries = lambda: stale  # type: ignore[method-assign]
    other.prune(2)
    assert [e.batch_id for e in reopen(ledger).entries()] == [4, 5]


def test_readers_racing_a_prune_never_see_a_committed_batch_as_unfinished(
    ledger: FileLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A restarted driver lists unfinished batches while another process of the sink
    # prunes: a pruned, committed batch must never look DECIDED (it would be committed
    # again, and a participant that cannot prove the old commit raises DataLossError).
    _decide_committed(ledger, range(4))
    pruner = reopen(ledger)
    original = FileLedger._read_json
    pruned = []

    def read_then_let_the_other_process_prune(path: Path) -> Any:
        data = original(path)
        if not pruned and path.parent.name == "decisions":
            pruned.append(path.name)
            pruner.prune(1)
        return data

    monkeypatch.setattr(
        FileLedger, "_read_json", staticmethod(read_then_let_the_other_process_prune)
    )
    reader = reopen(ledger)
    seen = reader.entries()
    assert pruned  # the race really happened
    assert [e for e in seen if e.state is not BatchState.COMMITTED] == []
    assert reader.unfinished() == []
    assert 3 in [e.batch_id for e in seen]


# --- query binding -----------------------------------------------------------------------


def test_first_binding_is_generation_0_and_rebinding_the_same_query_is_a_no_op(
    ledger: FileLedger,
) -> None:
    assert ledger.bind_query("q1") == 0
    ledger.decide(entry(0))
    assert ledger.bind_query("q1") == 0
    assert ledger.bind_query("q1", reset=True) == 0  # same query: nothing to reset
    assert ledger.bound_query() == "q1"
    assert ledger.get(0) is not None


def test_binding_another_query_is_refused_with_the_fix(ledger: FileLedger) -> None:
    ledger.bind_query("q1")
    ledger.decide(entry(0))
    with pytest.raises(QueryBindingError) as info:
        ledger.bind_query("q2")
    message = str(info.value)
    assert "'q1'" in message and "'q2'" in message
    assert "reset_binding=True" in message
    assert "new sink_id" in message
    assert "written again (duplicates)" in message  # what the reset costs
    assert info.value.sink_id == SINK
    assert ledger.bound_query() == "q1"
    assert ledger.get(0) is not None


def test_reset_rebinds_bumps_the_generation_and_forgets_everything(ledger: FileLedger) -> None:
    assert ledger.generation() == 0  # never bound
    ledger.bind_query("q1")
    assert ledger.generation() == 0
    _decide_committed(ledger, range(3))
    ledger.decide(entry(3))
    ledger.forbid_decision(4, RUN_B)
    assert ledger.bind_query("q2", reset=True) == 1
    assert ledger.bound_query() == "q2"
    assert ledger.entries() == []
    assert ledger.decide(entry(4, RUN_B)).run_id == RUN_B  # the abort record is gone too
    again = reopen(ledger)
    assert again.bind_query("q2") == 1
    assert again.bind_query("q3", reset=True) == 2
    assert reopen(ledger).generation() == 2
    with pytest.raises(QueryBindingError):
        reopen(ledger).bind_query("q2")


# --- across processes --------------------------------------------------------------------

_fork = multiprocessing.get_context("fork")


def _decide_in_child(root: str, run_id: str, barrier: Any, results: Any) -> None:
    ledger = FileLedger(root, sink_id=SINK)
    barrier.wait()
    got = ledger.decide(entry(0, run_id))
    results.put((run_id, got.run_id))


def test_concurrent_decide_from_processes_first_wins_exactly_once(ledger: FileLedger) -> None:
    runs = [f"{i:08x}" for i in range(6)]
    barrier = _fork.Barrier(len(runs))
    results = _fork.Queue()
    procs = [
        _fork.Process(target=_decide_in_child, args=(str(ledger.root), r, barrier, results))
        for r in runs
    ]
    for p in procs:
        p.start()
    got = [results.get(timeout=30) for _ in runs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    winners = {winner for _, winner in got}
    assert len(winners) == 1
    (winner,) = winners
    assert winner in runs
    assert sum(1 for mine, w in got if mine == w) == 1
    assert ledger.get(0).run_id == winner  # type: ignore[union-attr]
    assert len(list((ledger.root / "decisions").glob("*.json"))) == 1


def _decide_many(root: str, n: int, results: Any) -> None:
    ledger = FileLedger(root, sink_id=SINK)
    out = {}
    for b in range(n):
        try:
            ledger.decide(entry(b, RUN_A))
            out[b] = "decided"
        except FencedError:
            out[b] = "fenced"
    results.put(("decide", out))


def _abort_many(root: str, n: int, results: Any) -> None:
    ledger = FileLedger(root, sink_id=SINK)
    out = {b: ("saw decision" if ledger.forbid_decision(b, RUN_A) else "aborted")
           for b in range(n)}
    results.put(("abort", out))


def test_decide_and_abort_from_two_processes_are_serialized(ledger: FileLedger) -> None:
    n = 40
    results = _fork.Queue()
    procs = [
        _fork.Process(target=fn, args=(str(ledger.root), n, results))
        for fn in (_decide_many, _abort_many)
    ]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=30) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    for b in range(n):
        decided = got["decide"][b] == "decided"
        # Either the decision came first (the abort saw it and must not roll back), or
        # the abort came first (the decision was fenced): never both, never neither.
        assert decided == (got["abort"][b] == "saw decision"), b
        assert (ledger.get(b) is not None) == decided
