"""Names that bite, Kafka side (no broker): topic names in the sink's options, in a
``topic`` column and derived from the sink id; the CLI's ``--kafka-topic`` (issue 37).

Kafka allows 1-249 characters of ``[a-zA-Z0-9._-]`` (not ``.`` or ``..``); every other name
is refused with an error naming that rule before anything is produced.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from connectors.cli._kafka_target import KafkaTarget
from connectors.core.errors import BadInputError, ConfigurationError
from connectors.core.naming import MAX_SINK_ID_LENGTH
from connectors.kafka import KafkaSink
from connectors.kafka._config import validate_topic
from connectors.kafka._records import RecordLimits, bad_topic, scan_batch

CONFIG = {"bootstrap.servers": "localhost:1"}
GOOD = ["events", "Events.V2", "UPPER_case-1", "a" * 249, "_x", "..."]
BAD = ["", ".", "..", "a b", "Größe", "a/b", "a:b", 'x"; drop', "a\n", "a" * 250, "ä"]
RULE = r"not a valid Kafka topic name.*A-Z, a-z, 0-9, '\.', '_' and '-'"


@pytest.mark.parametrize("topic", GOOD)
def test_good_topics_are_taken(topic: str) -> None:
    sink = KafkaSink(topic, CONFIG, sink_id="names")
    assert sink.options.topic == topic
    assert bad_topic(topic) is None


@pytest.mark.parametrize("topic", BAD)
@pytest.mark.parametrize("option", ["topic", "marker_topic", "ledger_topic"])
def test_bad_topics_in_the_options_are_refused_naming_the_rule(topic: str, option: str) -> None:
    kwargs = {"topic": "events", option: topic}
    with pytest.raises(ConfigurationError, match=f"{option} .*{RULE}") as err:
        KafkaSink(config=CONFIG, sink_id="names", **kwargs)  # type: ignore[arg-type]
    assert err.value.sink_id == "names"


@pytest.mark.parametrize("sink_id", ["a.b", "a b", "Größe", "a/b", "-a", "a" * 41])
def test_a_sink_id_illegal_in_a_topic_is_refused_as_a_sink_id(sink_id: str) -> None:
    """The internal topics ``_connectors.<sink_id>.markers|ledger`` derive from the sink id;
    its own rule (a subset of Kafka's) refuses it first, naming the sink id's rule."""
    with pytest.raises(ConfigurationError, match=r"invalid sink_id.*A-Z, a-z, 0-9"):
        KafkaSink("events", CONFIG, sink_id=sink_id)


def test_every_valid_sink_id_derives_valid_topics() -> None:
    for sink_id in ("A", "Up_per-9", "z" * MAX_SINK_ID_LENGTH):
        options = KafkaSink("events", CONFIG, sink_id=sink_id).options
        assert options.marker_topic == f"_connectors.{sink_id}.markers"
        assert validate_topic(options.marker_topic) and validate_topic(options.ledger_topic)


def _scan(topics: list[str]) -> dict[str, int]:
    batch = pa.record_batch({"value": pa.array([b"v"] * len(topics)),
                             "topic": pa.array(topics)})

    def error(message: str) -> BadInputError:
        return BadInputError(message)

    return scan_batch(batch, RecordLimits(10_000), None, error).topics


def test_a_topic_column_takes_upper_case_dots_and_underscores() -> None:
    assert _scan(["Up.Per_case-1", "x", "Up.Per_case-1"]) == {"Up.Per_case-1": -1, "x": -1}


@pytest.mark.parametrize("topic", BAD)
def test_a_bad_topic_in_the_column_is_refused_naming_the_rule(topic: str) -> None:
    with pytest.raises(BadInputError, match=r"the 'topic' column holds .*" + RULE):
        _scan(["good", topic])


@pytest.mark.parametrize("topic", ["a b", "..", 'x"; drop'])
def test_the_cli_refuses_a_bad_kafka_topic(topic: str) -> None:
    with pytest.raises(ConfigurationError, match=f"--kafka-topic .*{RULE}"):
        KafkaTarget("localhost:1", topics=["ok", topic])
