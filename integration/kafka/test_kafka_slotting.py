"""Where KafkaSink places rows: by content (the row hash) by default, by the named
``slot_columns`` otherwise; either way a replay partitioned differently by Spark finds
every slot's marker and writes nothing twice (real Spark, a real Kafka broker)."""

from __future__ import annotations

from typing import Any

import pytest

from connectors.core.protocol.crash import SimulatedCrash, armed
from connectors.core.states import CrashPoint
from connectors.kafka import KafkaSink
from integration.support._kafka import KafkaTarget, ledger_batches, markers, target_fixture

pytestmark = [pytest.mark.integration]

kafka = target_fixture("slotting", partitions=2)

#: Records per key: "a" 120, "b" 60, "c" 20 (ids 0..199).
KEYS = [("a", 120), ("b", 60), ("c", 20)]


def _frame(spark: Any, partitions: int) -> Any:
    rows = []
    start = 0
    for key, count in KEYS:
        rows += [(key, f'{{"id": {i}}}') for i in range(start, start + count)]
        start += count
    return spark.createDataFrame(rows, "key string, value string").repartition(partitions)


def _slot_rows(kafka: KafkaTarget, batch_id: int) -> list[int]:
    found = markers(kafka.bootstrap, kafka.marker_topic)
    return sorted(int(m["fp"]["rows"]) for slot in found.values() for m in slot
                  if m["batch_id"] == batch_id)


@pytest.mark.parametrize("slot_columns", [None, ["key"]], ids=["content", "key"])
def test_a_replay_partitioned_otherwise_writes_nothing_twice(
    spark: Any, kafka: KafkaTarget, slot_columns: list[str] | None
) -> None:
    def sink() -> KafkaSink:
        return KafkaSink(kafka.topic, {"bootstrap.servers": kafka.bootstrap},
                         sink_id=kafka.sink_id, slots=3, slot_columns=slot_columns)

    # Every slot commits, then the driver dies before the ledger records the batch.
    with armed(CrashPoint.BEFORE_DECISION, batch_id=0, sink_id=kafka.sink_id), \
            pytest.raises(SimulatedCrash):
        sink()(_frame(spark, 2), 0)
    assert ledger_batches(kafka.bootstrap, kafka.ledger_topic) == {}
    per_slot = _slot_rows(kafka, 0)
    assert sum(per_slot) == 200
    if slot_columns == ["key"]:
        # Whole keys per slot: the counts are sums of whole keys' counts.
        whole = {0, 20, 60, 80, 120, 140, 180, 200}
        assert all(n in whole for n in per_slot), per_slot
    else:
        # By content: no slot is empty, none holds everything (200 distinct rows).
        assert len(per_slot) == 3 and max(per_slot) < 200
    # A new driver replays batch 0, which Spark partitions in 5 now: every slot finds its
    # marker (same rows, same fingerprint) and writes nothing.
    sink()(_frame(spark, 5), 0)
    assert _slot_rows(kafka, 0) == per_slot  # no slot committed again
    assert ledger_batches(kafka.bootstrap, kafka.ledger_topic) == {0: "COMMITTED"}
    kafka.assert_exact(200)
    key_of = {m.json()["id"]: (m.key or b"").decode() for m in kafka.messages()}
    assert sorted(key_of) == list(range(200))
