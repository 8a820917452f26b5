"""One rule for an ambiguous decision write, for one sink and for a fan-out (issue 50).

The ledger records the decision, then its reply is lost, and the ledger stays unreachable
for longer than the retries (every write and read fails). Whoever wrote the decision must
not guess: it may not roll anything back (the decision may be durable), and it may not
commit (it may not be). The batch fails with :class:`DecisionUnknown`; the next run (a
restart: new sink objects over the same targets) reads the ledger, finds the decision and
finishes it. After it every target holds the batch once, nothing prepared or open.

Before the one driver, the fan-out retried the decision blindly and, when that failed,
rolled its prepared parts back: the database lost a batch its own ledger listed decided.
"""

from __future__ import annotations

import collections
from typing import Any, ClassVar

import pytest

from connectors import FanOut
from connectors.core.errors import DecisionUnknown
from connectors.core.ledgers.ledger import Ledger
from connectors.core.policies.retry import FixedDelay
from connectors.core.states import BatchState
from connectors.testing import (
    InMemoryDriverCommitSink,
    InMemoryPreparedSink,
    InMemoryTarget,
    InMemoryTaskCommitSink,
    LocalBatch,
    batch_rows,
)
from tests._batches import QUERY, expected
from tests._faults import LostReply

FAST = FixedDelay(max_attempts=3, delay=0.0)


def _batch(batch_id: int) -> LocalBatch:
    return LocalBatch(batch_rows(batch_id), partitions=3)


def _exact(target: InMemoryTarget, *batch_ids: int) -> None:
    assert collections.Counter(target.committed_rows()) == collections.Counter(
        expected(*batch_ids))
    assert target.lingering() == 0


class LosingSink(InMemoryPreparedSink):
    ledgers: ClassVar[list[LostReply]] = []

    def create_ledger(self) -> Ledger:
        ledger = LostReply(super().create_ledger(), unreachable=8)
        self.ledgers.append(ledger)
        return ledger


def test_one_sink_whose_decision_reply_is_lost_commits_it_at_the_restart() -> None:
    db = InMemoryTarget()
    LosingSink.ledgers = []
    sink = LosingSink(db, sink_id="db", retry=FAST, outage_timeout=0)
    with pytest.raises(DecisionUnknown, match="may or may not be recorded"):
        sink.write_batch(_batch(0), 0, query_id=QUERY)
    lost = LosingSink.ledgers[0]
    assert lost.failed_calls == 3  # the re-read's attempts, then the error
    # The decision is durable and nothing was rolled back: every transaction still prepared.
    decision = db.ledger("db").get(0)
    assert decision is not None and decision.state is BatchState.DECIDED
    assert db.lingering() == len(decision.commits) > 0 and db.committed_rows() == []
    # A restart: a new driver over the same target (the ledger answers again).
    again = InMemoryPreparedSink(db, sink_id="db", retry=FAST)
    metrics = again.write_batch(_batch(0), 0, query_id=QUERY)
    assert metrics.outcome == "replayed"
    again.write_batch(_batch(1), 1, query_id=QUERY)
    _exact(db, 0, 1)


def _fan(db: InMemoryTarget, lake: InMemoryTarget, log: InMemoryTarget,
         ledger: Ledger | None = None, **options: Any) -> FanOut:
    return FanOut(InMemoryTaskCommitSink(log, sink_id="log", retry=FAST),
                  InMemoryDriverCommitSink(lake, sink_id="lake", retry=FAST),
                  InMemoryPreparedSink(db, sink_id="db", retry=FAST),
                  sink_id="fan", ledger=ledger, retry=FAST, **options)


def test_a_fan_out_whose_decision_reply_is_lost_commits_it_everywhere_at_the_restart(
        ) -> None:
    db, lake, log = InMemoryTarget(), InMemoryTarget(), InMemoryTarget()
    lost = LostReply(db.ledger("fan"), unreachable=8)
    fan = _fan(db, lake, log, lost, outage_timeout=0)
    inputs = {s.sink_id: _batch(0) for s in fan.sinks}
    with pytest.raises(DecisionUnknown):
        fan.write_batches(inputs, 0, query_id=QUERY)
    decision = db.ledger("fan").get(0)
    assert decision is not None and decision.state is BatchState.DECIDED
    # Nothing rolled back: the database's part is still prepared, no target shows the batch.
    assert db.lingering() > 0
    assert (db.committed_rows(), lake.committed_rows(), log.committed_rows()) == ([], [], [])
    restarted = _fan(db, lake, log)
    restarted.write_batches({s.sink_id: _batch(0) for s in restarted.sinks}, 0,
                            query_id=QUERY)
    restarted.write_batches({s.sink_id: _batch(1) for s in restarted.sinks}, 1,
                            query_id=QUERY)
    for target in (db, lake, log):
        _exact(target, 0, 1)
    states = {e.batch_id: e.state for e in db.ledger("fan").entries()}
    assert states == {0: BatchState.COMMITTED, 1: BatchState.COMMITTED}


def test_a_fan_out_rides_out_the_lost_reply_within_its_outage_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("connectors.core.policies.restarts.time.sleep", lambda _s: None)
    db, lake, log = InMemoryTarget(), InMemoryTarget(), InMemoryTarget()
    lost = LostReply(db.ledger("fan"), unreachable=5)
    fan = _fan(db, lake, log, lost)
    metrics = fan.write_batches({s.sink_id: _batch(0) for s in fan.sinks}, 0,
                                query_id=QUERY)
    assert metrics["db"].extra["batch_restarts"] >= 1
    for target in (db, lake, log):
        _exact(target, 0)
