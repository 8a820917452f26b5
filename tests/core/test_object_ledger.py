"""ObjectLedger and ObjectLease over an in-memory store with a real store's conditional
semantics (create if absent, replace if unchanged): first decision wins across writers,
binding compare-and-swap and generations, pruning, no LIST while the lease is held, and the
lease: a live holder keeps others out, a dead one on this machine is taken at once, one that
stopped renewing is taken after the expiry, a holder whose lease was taken notices."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from connectors.core.errors import FencedError, QueryBindingError, TransientError
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers import object_lease
from connectors.core.ledgers.ledger import LedgerEntry
from connectors.core.ledgers.object_lease import ObjectLease, process_identity
from connectors.core.ledgers.object_ledger import ObjectLedger
from connectors.core.states import BatchState
from connectors.testing import InMemoryObjectStore

SINK = "events"


class MemoryStore(InMemoryObjectStore):
    """The test kit's store (S3's conditional writes), as these tests name it."""


def committed(batch_id: int, run_id: str = "aaaaaaaa") -> LedgerEntry:
    return LedgerEntry(SINK, batch_id, run_id, BatchState.COMMITTED, (), Fingerprint(3, 7), "q")


def test_first_decision_wins_across_ledgers_of_one_store() -> None:
    store = MemoryStore()
    a, b = ObjectLedger(store, sink_id=SINK), ObjectLedger(store, sink_id=SINK)
    won = a.decide(committed(4, "aaaaaaaa"))
    lost = b.decide(committed(4, "bbbbbbbb"))
    assert won.run_id == lost.run_id == "aaaaaaaa"
    assert b.get(4) == won and b.last_batch_id() == 4
    assert [e.batch_id for e in b.entries()] == [4]


def test_binding_generations_and_reset_forget_the_decisions() -> None:
    store = MemoryStore()
    ledger = ObjectLedger(store, sink_id=SINK)
    assert ledger.bound_query() is None
    assert ledger.bind_query("q1") == 0
    ledger.decide(committed(0))
    with pytest.raises(QueryBindingError):
        ledger.bind_query("q2")
    assert ledger.bind_query("q2", reset=True) == 1
    assert ledger.bound_query() == "q2" and ledger.generation() == 1
    assert ledger.entries() == [] and ledger.last_batch_id() is None
    assert ObjectLedger(store, sink_id=SINK).bind_query("q2") == 1


def test_binding_is_compare_and_swap() -> None:
    """A writer that read the binding before another rebound it reads it again."""
    store = MemoryStore()
    ObjectLedger(store, sink_id=SINK).bind_query("q1")
    real_replace = store.replace
    raced = []

    def replace(key: str, data: bytes, version: str) -> str | None:
        if key == "binding.json" and not raced:  # another driver rebinds first
            raced.append(1)
            real_replace(key, json.dumps({"sink_id": SINK, "query_id": "q3",
                                          "generation": 1}).encode(), version)
        return real_replace(key, data, version)

    store.replace = replace  # type: ignore[method-assign]
    assert ObjectLedger(store, sink_id=SINK).bind_query("q2", reset=True) == 2
    assert json.loads(store.objects["binding.json"][0])["query_id"] == "q2"


def test_decided_batches_commit_and_prune() -> None:
    store = MemoryStore()
    ledger = ObjectLedger(store, sink_id=SINK)
    decided = LedgerEntry(SINK, 1, "aaaaaaaa", BatchState.DECIDED, (), None, "q")
    ledger.decide(decided)
    assert [e.batch_id for e in ledger.unfinished()] == [1]
    ledger.mark_committed(1)
    assert ledger.get(1) is not None and ledger.get(1).state is BatchState.COMMITTED  # type: ignore[union-attr]
    for b in range(2, 6):
        ledger.decide(committed(b))
    ledger.prune(2)
    assert [e.batch_id for e in ledger.entries()] == [4, 5]
    assert not any(k.endswith(".committed") for k in store.objects)


def test_abort_fences_a_run_and_a_decision_wins_over_its_abort() -> None:
    store = MemoryStore()
    ledger = ObjectLedger(store, sink_id=SINK)
    assert ledger.forbid_decision(3, "aaaaaaaa") is None
    with pytest.raises(FencedError):
        ledger.decide(committed(3, "aaaaaaaa"))
    ledger.decide(committed(3, "bbbbbbbb"))
    assert ledger.forbid_decision(3, "bbbbbbbb") == ledger.get(3)


def test_no_list_while_the_lease_is_held() -> None:
    store = MemoryStore()
    ledger = ObjectLedger(store, sink_id=SINK)
    ledger.hold(True)
    before = store.calls["list"]
    for b in range(10):
        assert ledger.get(b) is None
        ledger.decide(committed(b))
        assert ledger.last_batch_id() == b
        ledger.prune(3)
    assert store.calls["list"] == before
    assert [e.batch_id for e in ObjectLedger(store, sink_id=SINK).entries()] == [7, 8, 9]


# ---- the lease ----
@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(object_lease, "RENEW_S", 0.1)
    monkeypatch.setattr(object_lease, "TRUST_S", 0.6)
    monkeypatch.setattr(object_lease, "EXPIRY_S", 1.0)
    monkeypatch.setattr(object_lease, "WAIT_S", 0.5)
    monkeypatch.setattr(object_lease, "_POLL_S", 0.05)


def _holder_record(**holder: object) -> bytes:
    return json.dumps({"holder": {"host": "elsewhere", "pid": 1, "run_id": "r0", **holder},
                       "beat": 0, "released": False}).encode()


def test_a_live_holder_keeps_a_second_driver_out(fast: None) -> None:
    store = MemoryStore()
    first = ObjectLease(store, sink_id=SINK)
    first.acquire("run-a")
    try:
        with pytest.raises(FencedError, match="renews it"):
            ObjectLease(store, sink_id=SINK).acquire("run-b")
        first.check()
    finally:
        first.release()
    second = ObjectLease(store, sink_id=SINK)
    t0 = time.monotonic()
    second.acquire("run-b")  # released: taken at once
    assert time.monotonic() - t0 < 0.3
    second.release()


def test_a_dead_holder_on_this_machine_is_taken_at_once(fast: None) -> None:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    me = process_identity()
    store = MemoryStore()
    store.create("lease", _holder_record(**{**me, "pid": int(proc.stdout), "started": "1"}))
    lease = ObjectLease(store, sink_id=SINK)
    t0 = time.monotonic()
    lease.acquire("run-b")
    assert time.monotonic() - t0 < 0.3
    lease.release()


def test_a_holder_elsewhere_that_stopped_renewing_is_taken_after_the_expiry(fast: None) -> None:
    store = MemoryStore()
    store.create("lease", _holder_record(boot="another-machine"))
    lease = ObjectLease(store, sink_id=SINK)
    t0 = time.monotonic()
    lease.acquire("run-b")
    waited = time.monotonic() - t0
    assert object_lease.EXPIRY_S <= waited < object_lease.EXPIRY_S + 0.5
    assert json.loads(store.objects["lease"][0])["holder"]["run_id"] == "run-b"
    lease.release()


def test_a_holder_whose_lease_was_taken_over_stops(fast: None) -> None:
    store = MemoryStore()
    lease = ObjectLease(store, sink_id=SINK)
    lease.acquire("run-a")
    store.objects["lease"] = (_holder_record(run_id="run-b"), "taken")  # a successor's write
    time.sleep(0.3)
    with pytest.raises(FencedError, match="lost its lease"):
        lease.check()
    lease.release()
    assert store.objects["lease"][1] == "taken"  # a lost lease is never written again


def test_a_holder_that_cannot_renew_stops_trusting_its_lease(fast: None) -> None:
    store = MemoryStore()
    lease = ObjectLease(store, sink_id=SINK)
    lease.acquire("run-a")
    store.fail = True
    time.sleep(object_lease.TRUST_S + 0.1)
    with pytest.raises(TransientError, match="not trusted"):
        lease.check()
    store.fail = False
    time.sleep(0.3)  # renewed again: trusted
    lease.check()
    lease.release()
