"""Which slot producer a KafkaSink slot gets (:mod:`connectors.kafka._slot_producer`:
``CONNECTORS_KAFKA_PRODUCER``), and the owned handle's errors as confluent-kafka's
(:mod:`connectors.kafka._owned`), mapped by the same table (:mod:`connectors.kafka._errors`).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from connectors.core.errors import ConfigurationError, FatalError, FencedError, TransientError
from connectors.kafka import _slot_producer
from connectors.kafka._config import KafkaOptions
from connectors.kafka._errors import translate
from connectors.kafka._owned import OwnedProducer, kafka_exception
from connectors.kafka._rdkafka_lib import RdKafkaError, load
from connectors.kafka._slot_producer import (
    PRODUCER_ENV,
    owned_library,
    requested_producer,
    unsupported,
)


@pytest.fixture(autouse=True)
def _fresh_log_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_slot_producer, "_LOGGED", set())


def _options() -> KafkaOptions:
    return KafkaOptions(topic="out", marker_topic="m", ledger_topic="l")


@pytest.mark.parametrize(("value", "expected"), [
    (None, "auto"), ("", "auto"), ("auto", "auto"), ("owned", "owned"), (" Owned ", "owned"),
    ("confluent", "confluent"),
])
def test_the_variable_names_the_producer(value: str | None, expected: str) -> None:
    env = {} if value is None else {PRODUCER_ENV: value}
    assert requested_producer(env) == expected


def test_another_value_is_refused_when_the_sink_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="CONNECTORS_KAFKA_PRODUCER='native'"):
        requested_producer({PRODUCER_ENV: "native"})
    monkeypatch.setenv(PRODUCER_ENV, "native")
    with pytest.raises(ConfigurationError, match="auto, owned, confluent"):
        _options()


def test_the_options_keep_the_driver_s_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PRODUCER_ENV, "owned")
    options = _options()
    monkeypatch.setenv(PRODUCER_ENV, "confluent")  # later changes do not reach it
    assert options.producer == "owned"
    monkeypatch.delenv(PRODUCER_ENV)
    assert _options().producer == "auto"


def test_auto_and_owned_load_librdkafka() -> None:
    conf = {"bootstrap.servers": "b:9092", "linger.ms": 20, "enable.idempotence": True}
    assert owned_library("auto", "auto", conf) is load()
    assert owned_library("owned", "auto", conf) is load()


@pytest.mark.parametrize(("requested", "mode"), [
    ("confluent", "auto"), ("auto", "public"), ("auto", "record"), ("owned", "public"),
])
def test_confluent_and_the_batch_produce_modes_keep_confluent_s_producer(
    requested: str, mode: str,
) -> None:
    assert owned_library(requested, mode, {"bootstrap.servers": "b:9092"}) is None


def test_a_config_with_callables_keeps_confluent_s_producer_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    conf: dict[str, Any] = {"bootstrap.servers": "b:9092", "sasl.password": "s3cret",
                            "oauth_cb": lambda _: ("t", 0.0), "error_cb": print,
                            "default.topic.config": {"acks": "all"}}
    assert unsupported(conf) == ["default.topic.config", "error_cb", "oauth_cb"]
    with caplog.at_level(logging.WARNING, logger="connectors.kafka._slot_producer"):
        for requested in ("auto", "owned", "auto"):
            assert owned_library(requested, "auto", conf) is None
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert "oauth_cb" in message and "error_cb" in message and "s3cret" not in message


def test_librdkafka_that_does_not_load_warns_under_auto_and_fails_under_owned(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    def missing() -> Any:
        raise OSError("librdkafka not found: install confluent-kafka")

    monkeypatch.setattr(_slot_producer, "load", missing)
    with caplog.at_level(logging.WARNING, logger="connectors.kafka._slot_producer"):
        assert owned_library("auto", "auto", {}) is None
        assert owned_library("auto", "auto", {}) is None
    assert len(caplog.records) == 1 and "librdkafka not found" in caplog.records[0].getMessage()
    with pytest.raises(ConfigurationError, match="owned, but librdkafka cannot be used"):
        owned_library("owned", "auto", {})


@pytest.mark.parametrize(("error", "expected", "flag"), [
    (RdKafkaError(-144, "fenced by a newer producer", fatal=True), FencedError, "fatal"),
    (RdKafkaError(90, "producer fenced", fatal=True), FencedError, "fatal"),
    (RdKafkaError(-150, "fatal idempotence error", fatal=True), FatalError, "fatal"),
    (RdKafkaError(-185, "commit timed out", retriable=True), TransientError, "retriable"),
    (RdKafkaError(-152, "1 record(s) not delivered", abortable=True), TransientError,
     "txn_requires_abort"),
])
def test_owned_errors_carry_librdkafka_s_flags_into_the_same_table(
    error: RdKafkaError, expected: type, flag: str,
) -> None:
    exc = kafka_exception(error)
    assert isinstance(exc, KafkaException)
    err = exc.args[0]
    assert isinstance(err, KafkaError) and err.code() == error.code
    assert getattr(err, flag)() and err.str() == error.reason
    assert isinstance(translate(exc, doing="committing", secrets=[]), expected)


def test_an_owned_handle_refuses_a_bad_config_as_confluent_kafka_does() -> None:
    with pytest.raises(KafkaException) as info:
        OwnedProducer({"bootstrap.servers": "b:9092", "sasl.password": "s3cret",
                       "no.such.property": "1"}, load(), errors=[], reported=[])
    text = str(info.value)
    assert "no.such.property" in text and "s3cret" not in text


def test_an_owned_handle_has_the_calls_of_the_slot() -> None:
    """No broker: the refused connection comes as an error event (``error_cb``'s), then
    nothing is left queued, a flush returns at once, and the handle closes."""
    reported: list[KafkaError] = []
    owned = OwnedProducer({"bootstrap.servers": "127.0.0.1:1", "sasl.password": "s3cret"},
                          load(), errors=[], reported=reported)
    try:
        for _ in range(50):
            if reported:
                break
            owned.poll(0.1)
        assert reported and reported[0].code() in (KafkaError._TRANSPORT,
                                                  KafkaError._ALL_BROKERS_DOWN), reported
        assert owned.flush(1.0) == 0 and len(owned) == 0
        assert "s3cret" not in repr(owned) and "s3cret" not in repr(vars(owned))
        with pytest.raises(KafkaException):
            owned.list_topics(None)
    finally:
        owned.close()


def test_one_record_s_vu_entries_match_rdkafka_h() -> None:
    """``rd_kafka_vu_t``: the vtype at 0, the union at 8 (``header``: name, val, size at
    8, 16, 24), 72 bytes; ``RD_KAFKA_VTYPE_HEADER`` is 9 (6 is OPAQUE: headers set as 6
    were dropped without an error)."""
    from connectors.kafka._owned import _VU, _address
    from connectors.kafka._rdkafka_lib import VT_HEADER, VU

    assert VT_HEADER == 9
    assert [getattr(_VU, f).offset for f in ("vtype", "a", "b", "c")] == [
        VU.fields[f][1] for f in ("vtype", "a", "b", "c")] == [0, 8, 16, 24]
    keep: list[bytes] = []
    assert _address(None, keep) == (0, 0)
    empty, size = _address(b"", keep)
    assert empty != 0 and size == 0  # an empty value, not a null one
    assert _address("hé", keep)[1] == 3 and len(keep) == 2
