"""The Kafka unit tests fake confluent-kafka's ``Producer`` (``KafkaClients.producer``):
their sinks use it as their slot producer (``CONNECTORS_KAFKA_PRODUCER=confluent``); the
owned librdkafka handle's selection has its own tests (test_kafka_slot_producer.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _confluent_slot_producers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONNECTORS_KAFKA_PRODUCER", "confluent")
