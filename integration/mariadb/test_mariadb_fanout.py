"""A fan-out of MariaDBSink and KafkaSink (issue 54) over a real MariaDB and a real Kafka
broker: one decision per batch (kept in MariaDB's ledger tables), real XA branches, real
Kafka transactions and markers; tasks in-process (``LocalBatch``), so a "driver crash" is a
:class:`SimulatedCrash` at a crash point and a restart is new sink objects. Each case is
checked row by row in both targets, nothing left prepared or open."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from connectors import FanOut
from connectors.core.errors import BadInputError
from connectors.core.protocol import crash
from connectors.core.protocol.crash import SimulatedCrash
from connectors.core.states import BatchState, CrashPoint
from connectors.testing import LocalBatch, batch_rows
from integration.kafka.test_kafka_conformance import KafkaHarness, to_records
from integration.mariadb.test_mariadb_conformance import MariaDBHarness, _rows

pytestmark = [pytest.mark.integration]

QUERY = "fan-query"


class Both:
    """MariaDB and Kafka targets, the fan-out's id, a way to write and to check."""

    def __init__(self, url: str, bootstrap: str) -> None:
        self.maria = MariaDBHarness(url)
        self.kafka = KafkaHarness(bootstrap, barrier=False)
        self.fan_id = f"{self.maria.sink_id}-fan"
        _rows(self.maria.address, f"ALTER TABLE {self.maria.table.sql()} MODIFY payload "
                                  "TEXT NOT NULL")

    def fan(self) -> FanOut:
        return FanOut(self.maria.new_sink(), self.kafka.new_sink(), sink_id=self.fan_id)

    def write(self, fan: FanOut, batch_id: int, table: pa.Table | None = None) -> Any:
        rows = batch_rows(batch_id) if table is None else table
        inputs = {self.maria.sink_id: LocalBatch(rows, partitions=2),
                  self.kafka.target.sink_id: LocalBatch(to_records(batch_rows(batch_id)),
                                                        partitions=2)}
        return fan.write_batches(inputs, batch_id, query_id=QUERY)

    def run_again(self, *batch_ids: int) -> None:
        fan = self.fan()
        try:
            for batch_id in batch_ids:
                self.write(fan, batch_id)
        finally:
            fan.close()

    def holds(self, *batch_ids: int) -> dict[str, bool]:
        want = collections.Counter(tuple(r.values()) for b in batch_ids
                                   for r in batch_rows(b).to_pylist())
        return {"mariadb": collections.Counter(self.maria.committed_rows()) == want,
                "kafka": collections.Counter(self.kafka.committed_rows()) == want}

    def assert_exact(self, *batch_ids: int) -> None:
        assert self.holds(*batch_ids) == {"mariadb": True, "kafka": True}
        assert self.maria.lingering_transactions() == 0
        assert self.kafka.lingering_transactions() == 0

    def decision(self, batch_id: int) -> Any:
        fan = self.fan()
        try:
            return fan.create_ledger().get(batch_id)
        finally:
            fan.close()


@pytest.fixture
def both(mariadb_url: str, kafka_bootstrap: str) -> Iterator[Both]:
    crash.disarm_all()
    targets = Both(mariadb_url, kafka_bootstrap)
    yield targets
    crash.disarm_all()
    targets.kafka.cleanup()


@pytest.mark.parametrize("point", [CrashPoint.BEFORE_DECISION, CrashPoint.AFTER_DECISION,
                                   CrashPoint.BETWEEN_COMMITS, CrashPoint.AFTER_COMMIT],
                         ids=lambda p: p.value)
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
        assert seen == {"mariadb": False, "kafka": False}
    elif point is CrashPoint.BETWEEN_COMMITS:
        assert seen == {"mariadb": True, "kafka": False}  # the documented window
    else:
        assert seen == {"mariadb": True, "kafka": True}
    both.run_again(1, 2)  # the restart: Spark replays batch 1
    both.assert_exact(0, 1, 2)
    assert both.decision(1).state is BatchState.COMMITTED


def test_bad_input_into_mariadb_commits_nothing_in_either_then_exact_after_the_fix(
        both: Both) -> None:
    """A NULL into MariaDB's NOT NULL column (a warning of the LOCAL load, refused in its
    tasks before the decision): Kafka's transactions are aborted too; no value quoted."""
    fan = both.fan()
    both.write(fan, 0)
    nulls = batch_rows(1).set_column(2, "payload", pa.array([None] * 7, pa.string()))
    with pytest.raises(BadInputError, match="column 'payload'") as info:
        both.write(fan, 1, table=nulls)
    assert info.value.sink_id == both.maria.sink_id
    both.assert_exact(0)
    assert both.decision(1) is None
    fan.close()
    both.run_again(1, 2)  # the fix: the query's input is right again
    both.assert_exact(0, 1, 2)
