"""KafkaSink on its two slot producers (``CONNECTORS_KAFKA_PRODUCER``): the owned
librdkafka handle (:mod:`connectors.kafka._owned`) and confluent-kafka's ``Producer``,
over the same batches, into two topics, compared record by record.

The batches hold null and repeated keys, empty keys, null and empty values, explicit and
null partitions (a batch with every partition given and one with every record keyed: the
owned path's calls per partition run), and headers (a batch with headers goes record by
record on either producer). KafkaSink has no timestamp column (its input columns are
Spark's Kafka writer's minus timestamp), so timestamps are the producers' own and not
compared. One slot, one input partition: each topic partition holds its records in input
order on both paths. Records with a null key and a null partition are placed by
librdkafka's partitioner at random, so they are compared as a multiset (their values name
them: a null-keyed row always has a value).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from integration.support._kafka import KafkaTarget, Message, read_all, target_fixture

pytestmark = [pytest.mark.integration]

kafka = target_fixture("owned")

ROWS = 3000
BATCHES = 4

Record = tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]


def _batches(spark: SparkSession) -> list[DataFrame]:
    """Batch 0: explicit and null partitions; 1: every partition given; 2: as 0, with
    headers; 3: every record keyed, some partitions null (placed by the key's murmur2:
    every record placed, so the owned path enqueues partition runs). Values are
    ``b<batch>/<id>`` (null or empty on some keyed rows)."""
    frames = []
    for batch_id in range(BATCHES):
        df = spark.range(0, ROWS, numPartitions=1).selectExpr(
            "id",
            "CAST(concat('k', id % 50) AS BINARY) AS key" if batch_id == 3 else
            "CASE WHEN id % 7 = 0 THEN NULL WHEN id % 11 = 0 THEN X'' "
            "ELSE CAST(concat('k', id % 50) AS BINARY) END AS key",
            "CASE WHEN id % 7 != 0 AND id % 13 = 0 THEN NULL "
            "WHEN id % 7 != 0 AND id % 17 = 0 THEN X'' "
            f"ELSE CAST(concat('b{batch_id}/', id) AS BINARY) END AS value",
            "CAST(id % 3 AS INT) AS partition" if batch_id == 1 else
            "CASE WHEN id % 4 = 0 THEN NULL ELSE CAST(id % 3 AS INT) END AS partition")
        if batch_id == 2:
            df = df.selectExpr(
                "*",
                "CASE WHEN id % 5 = 0 THEN array(named_struct('key', 'h1', 'value', "
                "CAST(concat('x', id) AS BINARY)), named_struct('key', 'h2', 'value', "
                "CAST(NULL AS BINARY)), named_struct('key', 'h3', 'value', X'')) "
                "WHEN id % 9 = 0 THEN array() ELSE NULL END AS headers")
        frames.append(df)
    return frames


def _write(spark: SparkSession, kafka: KafkaTarget, topic: str, producer: str,
           monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every batch through a sink on ``producer``; returns each batch's metrics."""
    from connectors.kafka import KafkaSink

    monkeypatch.setenv("CONNECTORS_KAFKA_PRODUCER", producer)
    sink_id = f"{kafka.sink_id}-{producer}"
    sink = KafkaSink(topic, {"bootstrap.servers": kafka.bootstrap}, sink_id=sink_id, slots=1)
    figures = []
    try:
        for batch_id, df in enumerate(_batches(spark)):
            sink(df, batch_id)
            assert sink.last_metrics is not None
            figures.append(dict(sink.last_metrics.extra))
    finally:
        sink.close()
        kafka.created += [f"_connectors.{sink_id}.markers", f"_connectors.{sink_id}.ledger"]
    return figures


def _record(m: Message) -> Record:
    return m.key, m.value, tuple(m.headers)


def _placed_at_random(m: Message) -> bool:
    """A null key and a null partition (batches 0 and 2, ids divisible by 28)."""
    if m.key is not None or not m.value:
        return False
    batch, _, row = m.value.decode().partition("/")
    return batch != "b1" and int(row) % 4 == 0


def _split(messages: list[Message]) -> tuple[dict[int, list[Record]], Counter[Record]]:
    """Per partition, its records in order, but those placed at random: a multiset."""
    per: dict[int, list[Record]] = {}
    anywhere: Counter[Record] = Counter()
    for m in messages:
        if _placed_at_random(m):
            anywhere[_record(m)] += 1
        else:
            per.setdefault(m.partition, []).append(_record(m))
    return per, anywhere


def test_the_owned_and_the_confluent_producer_write_the_same_records(
    spark: SparkSession, kafka: KafkaTarget, monkeypatch: pytest.MonkeyPatch,
) -> None:
    theirs = kafka.create(f"{kafka.topic}-confluent", partitions=3)
    owned = _write(spark, kafka, kafka.topic, "owned", monkeypatch)
    confluent = _write(spark, kafka, theirs, "confluent", monkeypatch)
    # The paths that ran: the owned handle's batches; record by record with headers.
    assert [f["produce_owned_rows"] for f in owned] == [ROWS, ROWS, 0, ROWS], owned
    assert [f["produce_record_rows"] for f in owned] == [0, 0, ROWS, 0], owned
    assert [f["produce_owned_rows"] for f in confluent] == [0, 0, 0, 0], confluent
    assert [f["produce_native_rows"] + f["produce_batch_rows"] for f in confluent] == [
        ROWS, ROWS, 0, ROWS], confluent

    mine, other = read_all(kafka.bootstrap, kafka.topic), read_all(kafka.bootstrap, theirs)
    assert len(mine) == len(other) == BATCHES * ROWS
    mine_per, mine_any = _split(mine)
    other_per, other_any = _split(other)
    assert mine_any == other_any
    assert sum(mine_any.values()) == 2 * len(range(0, ROWS, 28))
    assert mine_per.keys() == other_per.keys() == {0, 1, 2}
    for p in mine_per:
        assert mine_per[p] == other_per[p], p
    # What the batches hold did arrive: empty and null keys and values, headers.
    records = [_record(m) for m in mine]
    keyed = [i for i in range(ROWS) if i % 7]
    assert sum(1 for k, _, _ in records if k is None) == 3 * (ROWS - len(keyed))
    assert sum(1 for k, _, _ in records if k == b"") == 3 * sum(
        1 for i in keyed if i % 11 == 0)
    assert sum(1 for _, v, _ in records if v is None) == BATCHES * sum(
        1 for i in keyed if i % 13 == 0)
    assert sum(1 for _, v, _ in records if v == b"") == BATCHES * sum(
        1 for i in keyed if i % 13 and i % 17 == 0)
    headed = [h for _, _, h in records if h]
    assert len(headed) == len(range(0, ROWS, 5))
    assert all([k for k, _ in h] == ["h1", "h2", "h3"] and h[1][1] is None and h[2][1] == b""
               for h in headed)
