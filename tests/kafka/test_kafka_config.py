"""KafkaSink's configuration, secrets and error table: no broker, no Spark."""

from __future__ import annotations

import logging
import pickle
import re

import pytest
from confluent_kafka import KafkaError, KafkaException

from connectors.core.errors import (
    BadInputError,
    ConfigurationError,
    FatalError,
    FencedError,
    TransientError,
)
from connectors.kafka import KafkaConfig, KafkaSink
from connectors.kafka._config import is_secret_key
from connectors.kafka._errors import translate
from connectors.kafka._ledger import ledger_transactional_id

SECRET = "s3cret-Pa55word"
SASL = {
    "bootstrap.servers": "b:9092", "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "app", "sasl.password": SECRET,
}


def test_public_names() -> None:
    import connectors.kafka as kafka

    assert kafka.__all__ == ["KafkaConfig", "KafkaLedger", "KafkaSink"]


@pytest.mark.parametrize("key", ["transactional.id", "enable.idempotence", "acks",
                                 "request.required.acks"])
def test_keys_the_sink_owns_are_refused(key: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(f"sets {key}, which the sink owns")):
        KafkaSink("t", {"bootstrap.servers": "b:9092", key: "x"}, sink_id="s")


def test_bootstrap_servers_is_required() -> None:
    with pytest.raises(ConfigurationError, match=r"needs 'bootstrap\.servers'"):
        KafkaSink("t", {}, sink_id="s")


def test_callbacks_cannot_travel_to_executors() -> None:
    with pytest.raises(ConfigurationError, match="callable"):
        KafkaSink("t", {"bootstrap.servers": "b", "error_cb": print}, sink_id="s")


@pytest.mark.parametrize("topic", ["", "a b", "x" * 250, ".."])
def test_invalid_topic_names_are_refused(topic: str) -> None:
    with pytest.raises(ConfigurationError, match="not a valid Kafka topic name"):
        KafkaSink(topic, {"bootstrap.servers": "b"}, sink_id="s")


def test_internal_topics_must_differ_from_the_output() -> None:
    with pytest.raises(ConfigurationError, match="three different topics"):
        KafkaSink("t", {"bootstrap.servers": "b"}, sink_id="s", marker_topic="t")


@pytest.mark.parametrize("value", [0, 999, "soon"])
def test_transaction_timeout_must_be_a_number_of_milliseconds(value: object) -> None:
    with pytest.raises(ConfigurationError, match=r"transaction\.timeout\.ms"):
        KafkaSink("t", {"bootstrap.servers": "b", "transaction.timeout.ms": value},
                  sink_id="s")


def test_defaults_derive_from_the_sink_id() -> None:
    sink = KafkaSink("events", {"bootstrap.servers": "b:9092"}, sink_id="events-kafka")
    assert sink.options.marker_topic == "_connectors.events-kafka.markers"
    assert sink.options.ledger_topic == "_connectors.events-kafka.ledger"
    assert sink.barrier is False  # barrier mode is opt-in: it costs ~1 s per batch
    assert ledger_transactional_id("events-kafka") == "eos1|events-kafka|ledger"
    assert "slots=auto" in repr(sink)


def test_producer_config_is_transactional_and_bounded_by_the_timeout() -> None:
    config = KafkaConfig({"bootstrap.servers": "b", "linger.ms": 50})
    conf = config.producer("eos1|s|slot|0", 30_000)
    assert conf["transactional.id"] == "eos1|s|slot|0"
    assert conf["enable.idempotence"] is True and conf["acks"] == "all"
    assert conf["transaction.timeout.ms"] == 30_000
    assert conf["message.timeout.ms"] <= 30_000
    assert conf["linger.ms"] == 50  # the user's value wins over the sink's default


def test_with_default_never_overrides_the_users_value() -> None:
    config = KafkaConfig({**SASL, "enable.sparse.connections": True})
    assert config.with_default("enable.sparse.connections", False) is config
    dense = KafkaConfig(SASL).with_default("enable.sparse.connections", False)
    assert dense.producer("t", 30_000)["enable.sparse.connections"] is False
    assert dense.consumer()["enable.sparse.connections"] is False
    assert SECRET not in repr(dense)


class _Brokers:
    def __init__(self, brokers: int) -> None:
        self.brokers = brokers

    def broker_config(self) -> tuple[dict[str, str], int]:
        return {"transaction.max.timeout.ms": "900000"}, self.brokers


@pytest.mark.parametrize(("brokers", "dense"), [(1, True), (16, True), (17, False)])
def test_small_clusters_get_dense_connections(brokers: int, dense: bool) -> None:
    sink = KafkaSink("out", {"bootstrap.servers": "b"}, sink_id="s")
    sink._clients._admin = _Brokers(brokers)  # type: ignore[assignment]
    sink._clients.check_broker()
    conf = sink.config.producer("t", 30_000)
    assert ("enable.sparse.connections" in conf) is dense
    if dense:
        assert conf["enable.sparse.connections"] is False
    kept = KafkaSink("out", {"bootstrap.servers": "b", "enable.sparse.connections": True},
                     sink_id="s")
    kept._clients._admin = _Brokers(brokers)  # type: ignore[assignment]
    kept._clients.check_broker()
    assert kept.config.producer("t", 30_000)["enable.sparse.connections"] is True


def test_consumer_and_admin_configs_drop_producer_properties() -> None:
    config = KafkaConfig({**SASL, "linger.ms": 5, "compression.type": "lz4"})
    consumer = config.consumer()
    assert consumer["isolation.level"] == "read_committed"
    assert "linger.ms" not in consumer and "compression.type" not in consumer
    assert consumer["sasl.password"] == SECRET  # the clients still need it
    assert "linger.ms" not in config.admin()


@pytest.mark.parametrize("key", ["sasl.password", "ssl.key.password", "sasl.jaas.config",
                                 "sasl.oauthbearer.client.secret", "ssl.keystore.password",
                                 "ssl.key.pem"])
def test_secret_keys_are_recognised(key: str) -> None:
    assert is_secret_key(key)


def test_secrets_never_show_in_repr_str_pickles_or_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    sink = KafkaSink("t", SASL, sink_id="s")
    for text in (repr(sink), str(sink), repr(sink.config), str(sink.config),
                 repr(sink.options)):
        assert SECRET not in text, text
    assert "'sasl.password': '***'" in repr(sink.config)
    logging.getLogger("connectors.kafka").info("sink %r", sink)
    assert SECRET not in caplog.text
    clone = pickle.loads(pickle.dumps(sink))  # executors get the secret, as they must
    assert clone.config["sasl.password"] == SECRET
    assert SECRET not in repr(clone)


def test_client_errors_are_translated_without_secrets() -> None:
    err = KafkaError(KafkaError._AUTHENTICATION, f"SASL failed for password {SECRET}")
    exc = translate(KafkaException(err), doing="connecting", secrets=[SECRET],
                    bootstrap="b:9092", sink_id="s")
    assert isinstance(exc, ConfigurationError)
    assert SECRET not in str(exc) and SECRET not in repr(exc)
    assert "sasl.password" in str(exc)
    again = pickle.loads(pickle.dumps(exc))
    assert SECRET not in str(again)


@pytest.mark.parametrize(("code", "kind"), [
    (KafkaError._AUTHENTICATION, ConfigurationError),
    (KafkaError.SASL_AUTHENTICATION_FAILED, ConfigurationError),
    (KafkaError.TOPIC_AUTHORIZATION_FAILED, ConfigurationError),
    (KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, ConfigurationError),
    (KafkaError._FENCED, FencedError),
    (KafkaError.PRODUCER_FENCED, FencedError),
    (KafkaError.INVALID_PRODUCER_EPOCH, FencedError),
    (KafkaError.UNKNOWN_TOPIC_OR_PART, BadInputError),
    (KafkaError.MSG_SIZE_TOO_LARGE, BadInputError),
    (KafkaError.INVALID_TRANSACTION_TIMEOUT, ConfigurationError),
    (KafkaError._TRANSPORT, TransientError),
    (KafkaError._ALL_BROKERS_DOWN, TransientError),
    (KafkaError._TIMED_OUT, TransientError),
])
def test_error_table(code: int, kind: type) -> None:
    exc = translate(KafkaException(KafkaError(code)), doing="x", secrets=[])
    assert type(exc) is kind


def test_fatal_errors_are_fatal_and_others_transient() -> None:
    fatal = KafkaError(KafkaError._INCONSISTENT, fatal=True)
    assert isinstance(translate(KafkaException(fatal), doing="x", secrets=[]), FatalError)
    retriable = KafkaError(KafkaError.NOT_ENOUGH_REPLICAS, retriable=True)
    assert isinstance(translate(KafkaException(retriable), doing="x", secrets=[]),
                      TransientError)


def test_partitioner_for_batch_produce_placement() -> None:
    base = {"bootstrap.servers": "b:9092"}
    assert KafkaConfig(base).partitioner() == ("murmur2_random", 300_000)
    assert KafkaConfig({**base, "partitioner": "consistent",
                        "topic.metadata.refresh.interval.ms": "5000"}).partitioner() == (
        "consistent", 5000)
    # A topic-level config may set its own partitioner: batch produce then leaves keyed
    # records to librdkafka's.
    nested = {**base, "default.topic.config": {"partitioner": "fnv1a"}}
    assert KafkaConfig(nested).partitioner()[0] is None
