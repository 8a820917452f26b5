"""The prototype of issue 55 without a broker: how librdkafka is found and checked
(:mod:`connectors.kafka._rdkafka_lib`), the Arrow -> pointer arrays, a handle's life.
integration/kafka/test_kafka_rdkafka.py has the records a real broker receives."""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.metadata
from collections.abc import Iterator

import pyarrow as pa
import pytest

from connectors.kafka import _rdkafka_lib
from connectors.kafka._rdkafka import ArrowProducer, _pointers
from connectors.kafka._rdkafka_lib import (
    LIBRDKAFKA_ENV,
    MESSAGE,
    VU,
    RdKafkaError,
    find_librdkafka,
    load,
)


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Nothing loaded or found yet (the caches are per path, and per
    ``CONNECTORS_LIBRDKAFKA`` value, and process)."""
    monkeypatch.setattr(_rdkafka_lib, "_LOADED", {})
    monkeypatch.setattr(_rdkafka_lib, "_DEFAULT", {})
    yield


def test_struct_sizes_match_rdkafka_h() -> None:
    assert MESSAGE.itemsize == 72  # rd_kafka_message_t on LP64
    assert MESSAGE.fields["payload"][1] == 24 and MESSAGE.fields["_private"][1] == 64
    assert VU.itemsize == 72  # rd_kafka_vu_t: an enum, then a 64-byte union


def test_finds_the_copy_confluent_kafka_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LIBRDKAFKA_ENV, raising=False)
    listed = [str(f.locate()) for f in importlib.metadata.files("confluent-kafka") or []
              if f.name.startswith("librdkafka")]
    found = find_librdkafka()
    if listed:  # a wheel: the file its extension loads
        assert found == listed[0]
    else:  # built from source against the system's librdkafka
        assert found == ctypes.util.find_library("rdkafka")


def test_the_environment_names_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LIBRDKAFKA_ENV, "/somewhere/librdkafka.so.1")
    assert find_librdkafka() == "/somewhere/librdkafka.so.1"


def test_loads_and_checks_the_version(fresh: None) -> None:
    lib = load()
    assert lib.version >= _rdkafka_lib.MIN_VERSION
    assert lib.version_str.count(".") >= 2
    assert load() is lib  # once per path


def test_refuses_an_older_librdkafka(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_rdkafka_lib, "MIN_VERSION", 0x7F0000FF)
    with pytest.raises(OSError, match=r"older than 127\.0"):
        load()


def test_refuses_a_library_without_the_functions(fresh: None) -> None:
    libc = ctypes.util.find_library("c")
    assert libc is not None
    with pytest.raises(OSError, match="lacks rd_kafka_version"):
        load(libc)


def test_pointers_from_arrow_buffers() -> None:
    arr = pa.array([b"abc", None, b"", b"de"], pa.binary()).slice(0)
    address, size, keep = _pointers(arr, len(arr))
    assert keep is not None
    assert size.tolist() == [3, 0, 0, 2]
    assert address[1] == 0 and address[2] != 0  # null vs empty
    assert ctypes.string_at(int(address[0]), 3) == b"abc"
    assert ctypes.string_at(int(address[3]), 2) == b"de"
    sliced = pa.array(["xx", "yyy", "z"], pa.large_string()).slice(1)
    address, size, _ = _pointers(pa.chunked_array([sliced]), 2)
    assert [ctypes.string_at(int(a), int(n)) for a, n in zip(address, size, strict=True)] == [
        b"yyy", b"z"]
    address, size, keep = _pointers(None, 3)
    assert keep is None and not address.any() and not size.any()


def test_a_handle_is_created_and_destroyed() -> None:
    with ArrowProducer({"bootstrap.servers": "127.0.0.1:1", "linger.ms": 1,
                        "enable.idempotence": True, "log_level": 0}) as producer:
        assert producer.rk
        assert producer.poll(0) == 0
        assert producer.flush(0.1).delivered == 0
    with pytest.raises(RdKafkaError, match="closed"):
        producer.begin_transaction()
    producer.close()  # twice: nothing


def test_a_bad_property_is_refused() -> None:
    with pytest.raises(RdKafkaError, match=r"no\.such\.property"):
        ArrowProducer({"no.such.property": "1"})
