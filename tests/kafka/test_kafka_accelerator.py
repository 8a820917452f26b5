"""The ctypes accelerator's gate (``connectors.kafka._native.verify_accelerator``): an
allow-list checked before any pointer is read, a check in a throwaway child, the environment
switch, and the public path every refusal falls back to (no broker: see
integration/kafka/test_kafka_native.py for the records a real broker receives on each path)."""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from connectors.core.errors import ConfigurationError
from connectors.kafka import _native
from connectors.kafka._config import KafkaOptions
from connectors.kafka._native import ACCELERATORS_ENV, VERIFIED, layout_triple, verify_accelerator
from connectors.kafka._native_produce import NativeProducer, attach
from connectors.kafka._produce import BatchProducer, fast_producer


@pytest.fixture(autouse=True)
def _fresh_decision(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(ACCELERATORS_ENV, raising=False)
    _native._reset_for_tests()
    yield
    _native._reset_for_tests()


@pytest.fixture
def listed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed triple on the allow-list (with the verified releases' offset), for the
    tests of what comes after the list: the child check, the fallback of a bad handle.
    The oldest CI lane runs a confluent-kafka release that is not listed."""
    offset = next(iter(VERIFIED.values()))
    monkeypatch.setattr(_native, "VERIFIED", {**VERIFIED, layout_triple(): offset})


def _producer() -> Producer:
    return Producer({"bootstrap.servers": "127.0.0.1:9", "log_level": 0})


class _Touched(AssertionError):
    pass


def _no_pointer_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every way the module reads process memory or loads librdkafka raise."""
    touched: list[str] = []

    def refuse(what: str) -> Any:
        def call(*_args: Any, **_kwargs: Any) -> Any:
            touched.append(what)
            raise _Touched(what)
        return call

    monkeypatch.setattr(ctypes.c_void_p, "from_address", refuse("from_address"))
    monkeypatch.setattr(ctypes, "CDLL", refuse("CDLL"))
    monkeypatch.setattr(subprocess, "run", refuse("child process"))
    return touched


def _fast(producer: Producer) -> Any:
    return fast_producer(producer, "auto", 5.0, partitioner="murmur2_random",
                         refresh_ms=300_000, queue_limit=1000)


def test_the_installed_layout_is_verified_and_the_child_check_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """This machine's confluent-kafka is on the allow-list and a real child verifies it; a
    release that is not listed (the oldest CI lane's floor) is refused before any pointer
    is read, and only allow-listed on purpose does the real child check run for it."""
    triple = layout_triple()
    if triple not in VERIFIED:
        assert "not a verified layout" in verify_accelerator().why
        _native._reset_for_tests()
        monkeypatch.setattr(_native, "VERIFIED",
                            {**VERIFIED, triple: next(iter(VERIFIED.values()))})
    decision = verify_accelerator()
    assert decision.offset == _native.VERIFIED[triple], decision.why
    producer = _producer()
    native = attach(producer)
    assert isinstance(native, NativeProducer) and native.producer is producer
    assert isinstance(_fast(producer), NativeProducer)


def test_a_version_not_on_the_allow_list_never_reads_a_pointer(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    import confluent_kafka

    monkeypatch.setattr(confluent_kafka, "version", lambda: "2.99.0")
    touched = _no_pointer_reads(monkeypatch)
    producer = _producer()
    with caplog.at_level(logging.WARNING, logger="connectors.kafka._native"):
        assert attach(producer) is None
        assert attach(producer) is None
        fast = _fast(producer)
    assert touched == []
    assert isinstance(fast, BatchProducer) and fast.path == "batch"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # once per process
    assert "confluent-kafka 2.99.0" in warnings[0] and "not a verified layout" in warnings[0]
    assert "produce_batch" in warnings[0] and "CPU" in warnings[0]  # why, and the cost


def test_another_handle_size_never_reads_a_pointer(monkeypatch: pytest.MonkeyPatch) -> None:
    version, libversion, size = layout_triple()
    monkeypatch.setattr(_native, "VERIFIED", {(version, libversion, size + 8): 16})
    touched = _no_pointer_reads(monkeypatch)
    assert attach(_producer()) is None
    assert touched == []
    assert "Producer.__basicsize__" in verify_accelerator().why


def test_the_environment_switch_forces_the_public_path(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(ACCELERATORS_ENV, "off")
    touched = _no_pointer_reads(monkeypatch)
    with caplog.at_level(logging.INFO, logger="connectors.kafka._native"):
        fast = _fast(_producer())
    assert touched == []
    assert isinstance(fast, BatchProducer)
    assert verify_accelerator().why == f"{ACCELERATORS_ENV}=off"
    assert any(ACCELERATORS_ENV in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(("code", "expected"), [
    ("import os; os.abort()", "signal"),
    ("import ctypes; ctypes.string_at(8)", "signal"),  # a bad pointer: SIGSEGV
    ("raise SystemExit(3)", "exit code 3"),
    ("print('2.16.1 2.16.0 176 mismatch')", "answered"),
])
@pytest.mark.usefixtures("listed")
def test_a_child_that_crashes_or_disagrees_leaves_this_worker_on_the_public_path(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, code: str,
    expected: str,
) -> None:
    monkeypatch.setattr(_native, "CHILD_CODE", code)
    producer = _producer()
    with caplog.at_level(logging.WARNING, logger="connectors.kafka._native"):
        fast = _fast(producer)
    assert isinstance(fast, BatchProducer)
    decision = verify_accelerator()
    assert decision.offset is None and expected in decision.why
    assert any(expected in r.getMessage() for r in caplog.records)
    assert os.getpid() > 0 and producer.list_topics is not None  # this process lives on


@pytest.mark.usefixtures("listed")
def test_the_child_runs_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[list[str]] = []
    real = subprocess.run

    def counting(args: list[str], **kwargs: Any) -> Any:
        runs.append(args)
        return real(args, **kwargs)

    monkeypatch.setattr(subprocess, "run", counting)
    for _ in range(3):
        attach(_producer())
    assert len(runs) == 1


@pytest.mark.usefixtures("listed")
def test_a_handle_that_does_not_verify_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    assert verify_accelerator().offset is not None
    lib = _native.STATE.lib
    assert lib is not None
    monkeypatch.setattr(lib, "lib", _OpaqueLies(lib.lib))
    assert attach(_producer()) is None


class _OpaqueLies:
    """librdkafka whose ``rd_kafka_opaque`` answers something else than the handle."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib

    def rd_kafka_opaque(self, _rk: int) -> int:
        return 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lib, name)


def test_batch_produce_option_values() -> None:
    base: dict[str, Any] = {"topic": "t", "marker_topic": "m", "ledger_topic": "l"}
    assert KafkaOptions(**base).produce_mode == "auto"
    assert KafkaOptions(**base, batch_produce="public").produce_mode == "public"
    assert KafkaOptions(**base, batch_produce=False).produce_mode == "record"
    with pytest.raises(ConfigurationError, match="batch_produce must be"):
        KafkaOptions(**base, batch_produce="fast")


def test_public_and_record_modes_never_consult_the_accelerator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    touched = _no_pointer_reads(monkeypatch)
    producer = _producer()
    public = fast_producer(producer, "public", 5.0, partitioner="murmur2", refresh_ms=-1,
                           queue_limit=10)
    assert isinstance(public, BatchProducer) and public.by_key
    assert fast_producer(producer, "record", 5.0, partitioner=None, refresh_ms=-1,
                         queue_limit=10) is None
    assert touched == []
