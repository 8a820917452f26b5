"""Names that bite, against a real Kafka broker (issue 37): an upper-case, dotted,
underscored topic and sink id work (the sink creates the topic, a ``read_committed``
consumer sees each record once); a ``topic`` column naming a topic Kafka cannot have is
refused with an error naming the rule before anything is produced (``barrier=False``: the
driver's check before any slot runs; with ``barrier=True`` every slot runs the same check,
``scan_batch``, before it produces, and a slot that fails it fails the barrier stage: the
other slot aborts instead of committing).

Batches are :class:`~connectors.testing.LocalBatch` (no Spark).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pytest

from connectors import BadInputError
from connectors.kafka import KafkaSink
from connectors.testing import LocalBatch
from integration.support._kafka import KafkaTarget, ledger_batches

pytestmark = [pytest.mark.integration]


@pytest.fixture
def kafka(kafka_bootstrap: str) -> Iterator[KafkaTarget]:
    target = KafkaTarget(kafka_bootstrap, prefix="Names")
    tag = uuid.uuid4().hex[:8]
    target.topic = f"Eos.Names_UP-{tag}"  # upper case, dot, underscore, dash
    target.sink_id = f"Names_UP-{tag}"
    target.created.append(target.topic)  # made by the sink; deleted afterwards
    yield target
    target.cleanup()


def records(ids: range, topics: list[str] | None = None) -> pa.Table:
    cols = {"key": pa.array([str(i) for i in ids]),
            "value": pa.array([json.dumps({"id": i}) for i in ids])}
    if topics is not None:
        cols["topic"] = pa.array(topics)
    return pa.table(cols)


@pytest.mark.parametrize("barrier", [False, True], ids=["no-barrier", "barrier"])
def test_odd_but_legal_names_work_and_an_illegal_topic_column_is_refused(
    kafka: KafkaTarget, barrier: bool,
) -> None:
    config = {"bootstrap.servers": kafka.bootstrap}
    sink = KafkaSink(kafka.topic, config, sink_id=kafka.sink_id, slots=2, create_topic=True,
                     topic_partitions=2, barrier=barrier)
    try:
        sink.write_batch(LocalBatch(records(range(50)), partitions=2), 0)
    finally:
        sink.close()
    kafka.assert_exact(50)
    column = KafkaSink(None, config, sink_id=kafka.sink_id, slots=2, barrier=barrier)
    topics = [kafka.topic] * 30 + ["bad topic!"] + [kafka.topic] * 9
    try:
        with pytest.raises(BadInputError, match=(
                r"the 'topic' column holds 'bad topic!', which is not a valid Kafka "
                r"topic name \(1-249 characters of A-Z")):
            column.write_batch(LocalBatch(records(range(50, 90), topics), partitions=2), 1)
        kafka.assert_exact(50)  # nothing of the bad batch is visible, no open transaction
        assert ledger_batches(kafka.bootstrap, kafka.ledger_topic) == {0: "COMMITTED"}
        # Fixed, the same batch id goes through, into the dotted topic by the column.
        topics[30] = kafka.topic
        column.write_batch(LocalBatch(records(range(50, 90), topics), partitions=2), 1)
    finally:
        column.close()
    kafka.assert_exact(90)
