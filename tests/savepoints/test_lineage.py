"""The lineage a ``resume_from`` records: every ledger kind keeps its links, the chain of
the bound query is ordered, and ``connectors status`` shows it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from connectors.cli._targets import describe_lineage
from connectors.core.ledgers.file_ledger import FileLedger
from connectors.core.ledgers.ledger import Ledger, Lineage, lineage_chain
from connectors.core.ledgers.object_ledger import ObjectLedger
from connectors.savepoints import take_savepoint
from connectors.testing import (
    InMemoryObjectStore,
    InMemoryPreparedSink,
    InMemoryTarget,
    LocalBatch,
)

A_TO_B = Lineage("q-b", "q-a", 4, 100.0, 200.0)
B_TO_C = Lineage("q-c", "q-b", 9, 300.0, 400.0)
STALE = Lineage("q-x", "q-b", 9, 300.0, 350.0)  # a resume refused after its link was kept


@pytest.fixture(params=["file", "object", "memory"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Ledger:
    if request.param == "file":
        return FileLedger(tmp_path / "ledger", sink_id="orders")
    if request.param == "object":
        return ObjectLedger(InMemoryObjectStore(), sink_id="orders")
    return InMemoryTarget().ledger("orders")


def test_every_ledger_keeps_its_links_and_a_link_recorded_again_replaces_it(
        ledger: Ledger) -> None:
    assert ledger.lineage() == []
    for link in (A_TO_B, B_TO_C, STALE, A_TO_B):
        ledger.record_lineage(link)
    assert sorted(ledger.lineage(), key=lambda link: link.query_id) == [A_TO_B, B_TO_C, STALE]
    assert lineage_chain(ledger.lineage(), "q-c") == [A_TO_B, B_TO_C]
    assert lineage_chain(ledger.lineage(), "q-b") == [A_TO_B]
    assert lineage_chain(ledger.lineage(), "q-a") == lineage_chain([], "q-c") == []


def test_a_file_ledger_refuses_a_query_id_that_is_no_file_name(tmp_path: Path) -> None:
    ledger = FileLedger(tmp_path / "ledger", sink_id="orders")
    with pytest.raises(ValueError, match="not a query id"):
        ledger.record_lineage(Lineage("../x", "q-a", 0, 0.0, 0.0))


def test_a_loop_of_links_ends() -> None:
    loop = [Lineage("q-a", "q-b", 1, 0, 0), Lineage("q-b", "q-a", 2, 0, 0)]
    assert len(lineage_chain(loop, "q-a")) == 2


def _ckpt(root: Path, query_id: str, batch: int, ends: dict[str, dict[str, int]]) -> str:
    (root / "offsets").mkdir(parents=True, exist_ok=True)
    (root / "metadata").write_text(json.dumps({"id": query_id}))
    (root / "offsets" / str(batch)).write_text(f"v1\n{{}}\n{json.dumps(ends)}\n")
    (root / "sources" / "0").mkdir(parents=True, exist_ok=True)
    return str(root)


def test_two_resumes_make_a_chain_that_status_shows(tmp_path: Path) -> None:
    target = InMemoryTarget()
    rows = LocalBatch(pa.table({"x": [1, 2]}))
    InMemoryPreparedSink(target, sink_id="orders").write_batch(rows, 0, query_id="q-a")
    ends = {"t": {"0": 2}}
    query = "q-a"
    for new in ("q-b", "q-c"):
        sp = take_savepoint(target.ledger("orders"),
                            _ckpt(tmp_path / query, query, 0, ends))
        ckpt = _ckpt(tmp_path / new, new, 0, ends)
        (Path(ckpt) / "sources" / "0" / "0").write_text("\x00v1\n" + json.dumps(ends))
        InMemoryPreparedSink(target, sink_id="orders", resume_from=sp,
                             checkpoint_location=ckpt).write_batch(rows, 0, query_id=new)
        query = new
    ledger = target.ledger("orders")
    chain = lineage_chain(ledger.lineage(), ledger.bound_query())
    assert [(link.from_query_id, link.batch_id, link.query_id) for link in chain] == [
        ("q-a", 0, "q-b"), ("q-b", 0, "q-c")]
    assert all(link.resumed_at >= link.taken_at > 0 for link in chain)
    text = describe_lineage([link.to_json() for link in chain])
    assert text == ("query q-a -> savepoint at batch 0 -> query q-b -> savepoint at batch 0 "
                    "-> query q-c")


def test_status_notes_the_lineage(tmp_path: Path) -> None:
    from connectors.cli._model import Lingering, RecoverReport, SinkStatus
    from connectors.cli._targets import Target

    store = InMemoryTarget()
    ledger = store.ledger("orders")
    ledger.bind_query("q-a")
    ledger.record_lineage(A_TO_B)
    ledger.bind_query("q-b", reset=True)

    class Memory(Target):
        kind = "memory"

        def describe(self) -> str:
            return "memory"

        def sink_ids(self) -> list[str]:
            return ["orders"]

        def ledger(self, sink_id: str) -> Ledger:
            return store.ledger(sink_id)

        def lingering(self, sink_id: str) -> list[Lingering]:
            return []

        def recover(self, sink_id: str, *, commit_decided: bool, abort_undecided: bool,
                    min_age_s: float) -> RecoverReport:
            return RecoverReport(sink_id, "memory")

    status: SinkStatus = Memory().status("orders")
    assert status.lineage == [A_TO_B.to_json()]
    assert "lineage: query q-a -> savepoint at batch 4 -> query q-b" in status.notes
