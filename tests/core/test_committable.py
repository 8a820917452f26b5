"""The committable (``TaskCommit``) holds what commit and recovery need and is stored in
format 2; format 1 (earlier releases' ledgers, with a ``payload``) is still read. A task's
figures travel beside it in ``TaskOutcome.figures`` to the batch's metrics, never into a
ledger: for a sink's batch, a split batch (the DataSource form) and a replay."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from connectors.core.batch import TaskInfo, TaskOutcome
from connectors.core.errors import ProtocolStateError
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers.file_ledger import FileLedger
from connectors.core.ledgers.ledger import LedgerEntry, TaskCommit
from connectors.core.templates.tasks import prepare_task
from connectors.testing import InMemoryPreparedSink, InMemoryTarget, InMemoryTaskCommitSink
from tests._batches import QUERY, assert_exact, write

TXN = "eos1|events|abcd1234|3|17"


def _format_1(txn: str = TXN, payload: bytes = b'{"txn_ms": 12.5}') -> dict[str, Any]:
    """A task commit as an earlier release stored it (format 1: a base64 payload)."""
    return {"v": 1, "txn": txn, "partition": 2, "attempt": 17, "fp": Fingerprint(4, 99).to_json(),
            "payload": base64.b64encode(payload).decode(), "nbytes": 64, "replayed": False}


# --- the stored format --------------------------------------------------------------------


def test_a_task_commit_is_stored_in_format_2_with_only_what_commit_and_recovery_need() -> None:
    commit = TaskCommit(TXN, 2, 17, Fingerprint(4, 99), 64, replayed=True)
    stored = commit.to_json()
    assert stored == {"v": 2, "txn": TXN, "partition": 2, "attempt": 17,
                      "fp": Fingerprint(4, 99).to_json(), "nbytes": 64, "replayed": True}
    assert TaskCommit.from_json(json.loads(json.dumps(stored))) == commit


def test_format_1_of_earlier_releases_is_read_and_its_payload_ignored() -> None:
    assert TaskCommit.from_json(_format_1()) == TaskCommit(TXN, 2, 17, Fingerprint(4, 99), 64)
    entry = {"v": 1, "sink_id": "events", "batch_id": 3, "run_id": "abcd1234",
             "state": "DECIDED", "commits": [_format_1(), _format_1(payload=b"")],
             "fp": Fingerprint(8, 198).to_json(), "query_id": "q", "decided_at": 1.5}
    read = LedgerEntry.from_json(entry)
    assert [c.transaction_id for c in read.commits] == [TXN, TXN]
    # Written again (as a fan-out's adoption or a ledger's rewrite does): format 2.
    again = read.to_json()["commits"][0]
    assert again["v"] == 2 and "payload" not in again


#: A decision as release 953f96f wrote it (its ``LedgerEntry.to_json()``, format 1).
EARLIER_DECISION = (
    '{"v": 1, "sink_id": "events", "batch_id": 3, "run_id": "abcd1234", "state": "DECIDED", '
    '"commits": [{"v": 1, "txn": "eos1|events|abcd1234|3|17", "partition": 2, "attempt": 17, '
    '"fp": {"rows": 4, "digest": "0000000000000063"}, "payload": "eyJ0eG5fbXMiOiAxMi41fQ==", '
    '"nbytes": 64, "replayed": false}], "fp": {"rows": 4, "digest": "0000000000000063"}, '
    '"query_id": "q", "decided_at": 1.5}')


def test_a_file_ledger_written_by_an_earlier_release_is_recovered(tmp_path: Path) -> None:
    """A decision an earlier release left unfinished (format 1, on disk) is listed for
    recovery, then marked committed and read back."""
    ledger = FileLedger(tmp_path / "ledger", sink_id="events")
    ledger.bind_query("q")
    (ledger.root / "decisions").mkdir(exist_ok=True)
    (ledger.root / "decisions" / f"{3:020d}.json").write_text(EARLIER_DECISION)
    [unfinished] = ledger.unfinished()
    assert unfinished.commits == (TaskCommit(TXN, 2, 17, Fingerprint(4, 99), 64),)
    ledger.mark_committed(3)
    assert ledger.get(3) == unfinished.committed()


@pytest.mark.parametrize("version", [None, 0, 3, "2"])
def test_an_unknown_format_is_refused(version: Any) -> None:
    stored = {**TaskCommit(TXN, 2, 17, Fingerprint()).to_json(), "v": version}
    if version is None:
        del stored["v"]
    with pytest.raises(ProtocolStateError, match=r"task commit format .* upgrade connectors"):
        TaskCommit.from_json(stored)


# --- the figures: beside the commit, to the batch's metrics ---------------------------------


def test_an_outcome_carries_its_figures_beside_its_commit_when_pickled() -> None:
    outcome = TaskOutcome(commit=TaskCommit(TXN, 2, 17, Fingerprint()),
                          figures={"txn_ms": 12.5})
    again = TaskOutcome.from_bytes(outcome.to_bytes())
    assert again == outcome and again.figures == {"txn_ms": 12.5}
    assert TaskOutcome().figures == {}


def test_a_slot_s_figures_reach_the_batch_s_metrics_and_never_the_ledger() -> None:
    target = InMemoryTarget()
    sink = InMemoryTaskCommitSink(target, sink_id="events", slots=3)
    metrics = write(sink, 0)
    # What each slot's commit_slot returned (the in-memory sink: its rows), by slot.
    assert len(metrics.task_figures) == 3
    assert sum(f["rows"] for f in metrics.task_figures) == metrics.rows == 7
    assert "task_figures" not in metrics.as_dict() and "task_figures" not in metrics.log_line()
    entry = target.ledger("events").get(0)
    assert entry is not None
    assert all(set(c.to_json()) == {"v", "txn", "partition", "attempt", "fp", "nbytes",
                                    "replayed"} for c in entry.commits)
    # A replay the ledger has runs no slot: no figures.
    replay = write(sink, 0)
    assert (replay.outcome, replay.task_figures) == ("replayed", [])
    assert_exact(target, 0)


def test_a_prepared_transaction_s_pre_commit_returns_nothing_and_no_figures() -> None:
    target = InMemoryTarget()
    sink = InMemoryPreparedSink(target, sink_id="events")
    metrics = write(sink, 0)
    assert metrics.outcome == "committed" and metrics.task_figures == []


def test_a_split_batch_s_figures_arrive_with_its_outcomes() -> None:
    schema = pa.schema([("id", pa.int64())])
    target = InMemoryTarget()
    ticket = InMemoryPreparedSink(target, sink_id="split").driver.plan(schema)
    outcomes = []
    for p, ids in enumerate([[1, 2], [3]]):
        outcome = prepare_task(
            InMemoryPreparedSink(target, sink_id="split"), ticket.run_id, 0, schema,
            TaskInfo(partition=p, attempt_number=0, task_attempt_id=100 + p),
            iter([pa.record_batch([pa.array(ids, pa.int64())], schema=schema)]))
        # Spark's commit messages: pickled outcomes, figures beside the commit.
        outcomes.append(TaskOutcome.from_bytes(TaskOutcome(
            commit=outcome.commit, figures={"rows": float(len(ids))}).to_bytes()))
    metrics = InMemoryPreparedSink(target, sink_id="split").driver.commit(
        ticket, 0, QUERY, schema, list(reversed(outcomes)))
    assert metrics.outcome == "committed"
    assert metrics.task_figures == [{"rows": 2.0}, {"rows": 1.0}]  # in partition order
    entry = target.ledger("split").get(0)
    assert entry is not None and all("payload" not in c.to_json() for c in entry.commits)
