"""A fan-out over a real PostgreSQL and a real Kafka broker (issue 41; docs/fan-out.md):
real prepared transactions, real Kafka transactions and markers, both ledgers real (the
fan-out's decisions in PostgreSQL's ledger table); tasks in-process (``LocalBatch``), so a
"driver crash" is a :class:`SimulatedCrash` at a crash point and a restart is new sink
objects. Each case is checked row by row in both targets, with nothing left prepared or
open. The Spark and SIGKILL proof with Delta comes with ``connectors.FanOut``."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient

from connectors import FanOut
from connectors.core.errors import BadInputError, DecisionUnknown
from connectors.core.policies.retry import FixedDelay
from connectors.core.protocol import crash
from connectors.core.protocol.crash import SimulatedCrash
from connectors.core.states import BatchState, CrashPoint
from connectors.testing import LocalBatch, batch_rows
from integration.kafka.test_kafka_conformance import KafkaHarness, to_records
from integration.postgres.test_postgres_conformance import PostgresHarness
from tests._faults import LostReply

pytestmark = [pytest.mark.integration]

QUERY = "fan-query"


class Both:
    """PostgreSQL and Kafka targets, the fan-out's id, a way to write and to check."""

    def __init__(self, conninfo: str, bootstrap: str) -> None:
        self.pg = PostgresHarness(conninfo)
        self.kafka = KafkaHarness(bootstrap, barrier=False)
        self.fan_id = f"{self.pg.sink_id}-fan"
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {self.pg.table} ALTER COLUMN payload SET NOT NULL")

    def fan(self) -> FanOut:
        return FanOut(self.kafka.new_sink(), self.pg.new_sink(), sink_id=self.fan_id)

    def write(self, fan: FanOut, batch_id: int, table: pa.Table | None = None,
              records: pa.Table | None = None) -> Any:
        rows = batch_rows(batch_id) if table is None else table
        pg_id, kafka_id = self.pg.sink_id, self.kafka.target.sink_id
        inputs = {pg_id: LocalBatch(rows, partitions=2),
                  kafka_id: LocalBatch(records if records is not None
                                       else to_records(batch_rows(batch_id)), partitions=2)}
        return fan.write_batches(inputs, batch_id, query_id=QUERY)

    def run_again(self, *batch_ids: int) -> None:
        """A restart: a new fan-out writes ``batch_ids`` (Spark's replay first), closed."""
        fan = self.fan()
        try:
            for batch_id in batch_ids:
                self.write(fan, batch_id)
        finally:
            fan.close()

    def holds(self, *batch_ids: int) -> dict[str, bool]:
        want = collections.Counter(tuple(r.values()) for b in batch_ids
                                   for r in batch_rows(b).to_pylist())
        return {"postgres": collections.Counter(self.pg.committed_rows()) == want,
                "kafka": collections.Counter(self.kafka.committed_rows()) == want}

    def assert_exact(self, *batch_ids: int) -> None:
        assert self.holds(*batch_ids) == {"postgres": True, "kafka": True}
        assert self.pg.lingering_transactions() == 0
        assert self.kafka.lingering_transactions() == 0

    def decision(self, batch_id: int) -> Any:
        fan = self.fan()
        try:
            return fan.create_ledger().get(batch_id)
        finally:
            fan.close()


@pytest.fixture
def both(postgres_conninfo: str, kafka_bootstrap: str) -> Iterator[Both]:
    crash.disarm_all()
    targets = Both(postgres_conninfo, kafka_bootstrap)
    yield targets
    crash.disarm_all()
    targets.kafka.cleanup()


@pytest.mark.parametrize("point", [CrashPoint.BEFORE_DECISION, CrashPoint.AFTER_DECISION,
                                   CrashPoint.BETWEEN_COMMITS, CrashPoint.AFTER_COMMIT])
def test_a_crash_at_each_fan_out_point_then_the_replay_is_exact_in_both(
        both: Both, point: CrashPoint) -> None:
    fan = both.fan()
    both.write(fan, 0)
    fan.close()
    crash.arm(point, sink_id=both.fan_id, batch_id=1)
    fan = both.fan()
    with pytest.raises(SimulatedCrash):
        both.write(fan, 1)
    fan.close()
    seen = both.holds(0, 1)
    if point in (CrashPoint.BEFORE_DECISION, CrashPoint.AFTER_DECISION):
        assert seen == {"postgres": False, "kafka": False}
    elif point is CrashPoint.BETWEEN_COMMITS:
        assert seen == {"postgres": True, "kafka": False}  # the documented window
    else:
        assert seen == {"postgres": True, "kafka": True}
    both.run_again(1, 2)  # the restart: Spark replays batch 1
    both.assert_exact(0, 1, 2)
    assert both.decision(1).state is BatchState.COMMITTED


def test_a_decision_whose_reply_is_lost_rolls_nothing_back_and_the_restart_lands_it_in_both(
        both: Both) -> None:
    """The fan-out's decision reaches PostgreSQL's ledger table, its reply is lost and the
    ledger stays unreachable past the retries: no rule may roll PostgreSQL's prepared part
    back (the decision is durable); the batch fails with DecisionUnknown and the restart
    commits it in both targets (issue 50: the fan-out used to roll that part back)."""
    fan = both.fan()
    both.write(fan, 0)
    ledger = fan.create_ledger()
    fan.close()
    lost = LostReply(ledger, unreachable=8)
    fan = FanOut(both.kafka.new_sink(), both.pg.new_sink(), sink_id=both.fan_id,
                 ledger=lost, retry=FixedDelay(max_attempts=3, delay=0.0), outage_timeout=0)
    with pytest.raises(DecisionUnknown):
        both.write(fan, 1)
    fan.close()
    assert lost.failed_calls == 3
    assert both.decision(1).state is BatchState.DECIDED
    assert both.pg.lingering_transactions() > 0  # prepared, not rolled back
    assert both.holds(0, 1) == {"postgres": False, "kafka": False}
    both.run_again(1, 2)  # the restart: Spark replays batch 1
    both.assert_exact(0, 1, 2)
    assert both.decision(1).state is BatchState.COMMITTED


def test_bad_input_into_either_target_commits_nothing_in_either_then_exact_after_the_fix(
        both: Both) -> None:
    fan = both.fan()
    both.write(fan, 0)
    # A NULL into PostgreSQL's NOT NULL column: refused in its tasks, before the decision.
    nulls = batch_rows(1).set_column(2, "payload", pa.array([None] * 7, pa.string()))
    with pytest.raises(BadInputError, match="NOT NULL") as info:
        both.write(fan, 1, table=nulls)
    assert info.value.sink_id == both.pg.sink_id
    both.assert_exact(0)
    # A record over the broker's size limit: refused by Kafka's check of every record,
    # before the decision, so PostgreSQL's prepared part is rolled back.
    huge = pa.table({"key": ["1-0"], "value": ["x" * 2_000_000]})
    with pytest.raises(BadInputError) as info:
        both.write(fan, 1, records=huge)
    assert info.value.sink_id == both.kafka.target.sink_id
    both.assert_exact(0)
    assert both.decision(1) is None
    fan.close()
    both.run_again(1, 2)  # the fix: the query's input is right again
    both.assert_exact(0, 1, 2)


def test_two_kafka_targets_keep_the_decision_in_a_ledger_topic_of_its_own(
        kafka_bootstrap: str) -> None:
    """No PostgreSQL target: the fan-out's decisions go to a ledger topic of its own on the
    first target's cluster (KafkaSink.create_ledger_for). A crash between the two targets'
    commits, then the replay: exact in both."""
    crash.disarm_all()
    first, second = (KafkaHarness(kafka_bootstrap, barrier=False),
                     KafkaHarness(kafka_bootstrap, barrier=False))
    fan_id = f"{first.target.sink_id}-fan"

    def write(batch_id: int) -> None:
        fan = FanOut(first.new_sink(), second.new_sink(), sink_id=fan_id)
        records = to_records(batch_rows(batch_id))
        try:
            fan.write_batches({first.target.sink_id: LocalBatch(records, partitions=2),
                               second.target.sink_id: LocalBatch(records, partitions=2)},
                              batch_id, query_id=QUERY)
        finally:
            fan.close()

    try:
        write(0)
        crash.arm(CrashPoint.BETWEEN_COMMITS, sink_id=fan_id, batch_id=1)
        with pytest.raises(SimulatedCrash):
            write(1)
        want = collections.Counter(tuple(r.values()) for b in (0, 1)
                                   for r in batch_rows(b).to_pylist())
        assert collections.Counter(first.committed_rows()) == want
        assert collections.Counter(second.committed_rows()) != want  # the window
        write(1)
        write(2)
        want = collections.Counter(tuple(r.values()) for b in (0, 1, 2)
                                   for r in batch_rows(b).to_pylist())
        for harness in (first, second):
            assert collections.Counter(harness.committed_rows()) == want
            assert harness.lingering_transactions() == 0
    finally:
        crash.disarm_all()
        first.cleanup()
        second.cleanup()
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        for future in admin.delete_topics([f"_connectors.{fan_id}.ledger"],
                                          operation_timeout=30).values():
            future.result(30)


def test_the_cli_labels_the_fan_out_and_recover_commits_the_decided_part(
        both: Both, postgres_conninfo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """After ``after_decision`` PostgreSQL's prepared transactions are the fan-out's
    decision, though PostgreSQL's own ledger does not list them yet: ``connectors status``
    shows them decided and the fan-out's ledger as a fan-out of both targets; ``recover
    --abort-undecided --min-age 0`` never rolls them back, and ``--commit-decided``
    commits them (the part a restart would adopt); the restart is exact."""
    from integration.cli.test_cli_postgres import cli

    fan = both.fan()
    both.write(fan, 0)
    fan.close()
    crash.arm(CrashPoint.AFTER_DECISION, sink_id=both.fan_id, batch_id=1)
    fan = both.fan()
    with pytest.raises(SimulatedCrash):
        both.write(fan, 1)
    crash.disarm_all()
    monkeypatch.setenv("EOS_POSTGRES_CONNINFO", postgres_conninfo)
    target = ["--postgres-env", "EOS_POSTGRES_CONNINFO", "--ledger-table",
              "public.eos_conformance"]
    pg_id, kafka_id = both.pg.sink_id, both.kafka.target.sink_id
    code, data, err = cli("status", *target, "--sink-id", pg_id, "--sink-id", both.fan_id)
    assert code == 1, err  # lingering and unfinished: attention
    by_id = {s["sink_id"]: s for s in data}
    lingering = by_id[pg_id]["lingering"]
    assert lingering and all(item["decided"] for item in lingering), lingering
    assert by_id[both.fan_id]["fan_out_targets"] == sorted([pg_id, kafka_id])
    assert by_id[both.fan_id]["unfinished"] == [1]
    assert by_id[pg_id]["fan_out_targets"] == []
    code, data, err = cli("recover", *target, "--sink-id", pg_id, "--abort-undecided",
                          "--min-age", "0")
    assert both.pg.lingering_transactions() == len(lingering), (data, err)
    code, data, err = cli("recover", *target, "--sink-id", pg_id, "--commit-decided")
    assert code == 0, (data, err)
    assert both.pg.lingering_transactions() == 0
    assert both.holds(0, 1)["postgres"] and both.holds(0)["kafka"]  # the window, bounded:
    both.run_again(1, 2)  # the restart (Spark replays batch 1): Kafka gets it, PostgreSQL not again
    both.assert_exact(0, 1, 2)
