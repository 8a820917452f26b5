"""KafkaSink's task-side decisions with a fake producer: align, then commit or abort."""

from __future__ import annotations

import json
import logging
import pickle
import time
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException

from connectors.core.errors import BadInputError, TransientError
from connectors.core.fingerprint import Fingerprint
from connectors.core.metrics import BatchMetrics
from connectors.core.templates.tasks import SlotMarker, SlotTransaction
from connectors.kafka import KafkaSink
from connectors.kafka._clients import KafkaClients
from connectors.kafka._figures import slot_figures
from connectors.kafka._task_slot import Slot, marker_key


class FakeProducer:
    def __init__(self, commit_errors: list[KafkaError] | None = None) -> None:
        self.calls: list[str] = []
        self.produced: list[tuple[Any, ...]] = []
        self.commit_errors = list(commit_errors or [])
        self.metadata: list[str | None] = []  # topics of list_topics calls

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> None:
        self.metadata.append(topic)

    def produce(self, topic: str, *args: Any, **kwargs: Any) -> None:
        self.produced.append((topic, args, kwargs))

    def poll(self, _t: float) -> int:
        return 0

    def flush(self, _t: float) -> int:
        self.calls.append("flush")
        return 0

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def commit_transaction(self, _t: float) -> None:
        if self.commit_errors:
            self.calls.append("commit-failed")
            raise KafkaException(self.commit_errors.pop(0))
        self.calls.append("commit")

    def abort_transaction(self, _t: float) -> None:
        self.calls.append("abort")


def _sink(**kwargs: Any) -> KafkaSink:
    return KafkaSink("out", {"bootstrap.servers": "b:9092", **kwargs.pop("config", {})},
                     sink_id="unit", slots=2, **kwargs)


def _handle(sink: KafkaSink, producer: FakeProducer) -> Slot:
    ctx = SlotTransaction("unit", 0, 5, "abcd1234", 0, 77, pa.schema([("value", pa.binary())]))
    handle = Slot(ctx, producer, time.monotonic())  # type: ignore[arg-type]
    handle.topics["out"] = 3  # the driver checked the topic
    return handle


def _marker() -> SlotMarker:
    return SlotMarker("unit", 0, 5, 0, "abcd1234", Fingerprint(1, 2))


def test_commit_writes_the_marker_into_the_slots_partition_then_commits() -> None:
    sink, producer = _sink(), FakeProducer()
    handle = _handle(sink, producer)
    sink.write(handle, pa.record_batch({"value": pa.array([b"a", b"b"])}))
    figures = sink.commit_slot(handle, _marker())
    topic, args, kwargs = producer.produced[-1]
    assert topic == "_connectors.unit.markers" and kwargs == {"partition": 0}
    assert args[1] == marker_key(0) and json.loads(args[0])["batch_id"] == 5
    assert producer.calls == ["flush", "commit"]
    # The slot's figures, beside its commit (never in the ledger)
    assert figures == {**figures, "rows": 2, "reused": 0, "by_other": 0}
    assert sum(v for k, v in figures.items() if k.startswith("produce_")) == 2
    assert figures["txn_ms"] >= figures["wait_ms"] == 0


def test_no_slot_commits_when_another_slot_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    sink, producer = _sink(), FakeProducer()
    handle = _handle(sink, producer)
    monkeypatch.setattr(sink._alignment, "gather",
                        lambda h, status, slots, barrier=None: [status, "failed|record too big"])
    with pytest.raises(BadInputError, match="did not commit, because 1 other slot"):
        sink.commit_slot(handle, _marker())
    sink.abort_slot(handle)
    assert "commit" not in producer.calls and producer.calls[-1] == "abort"


def test_a_bad_record_tells_the_other_slots_before_failing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sink, producer = _sink(), FakeProducer()
    sink.limits = type(sink.limits)(100)
    handle = _handle(sink, producer)
    sent: list[str] = []

    def gather(h: Slot, status: str, _slots: int, _barrier: object = None) -> list[str]:
        sent.append(status)
        h.gathered = True
        return [status]

    monkeypatch.setattr(sink._alignment, "gather", gather)
    with pytest.raises(BadInputError, match="larger than the 100 bytes"):
        sink.write(handle, pa.record_batch({"value": pa.array([b"x" * 500])}))
    assert len(sent) == 1 and sent[0].startswith("failed|record 0")
    assert producer.produced == []  # checked before anything was produced


def test_txn_requires_abort_aborts_and_redoes_the_transaction() -> None:
    abortable = KafkaError(KafkaError._STATE, txn_requires_abort=True)
    sink, producer = _sink(), FakeProducer(commit_errors=[abortable])
    handle = _handle(sink, producer)
    sink.write(handle, pa.record_batch({"value": pa.array([b"a"])}))
    sink.commit_slot(handle, _marker())
    assert producer.calls == ["flush", "commit-failed", "abort", "begin", "flush", "commit"]
    values = [p[1][0] for p in producer.produced if p[0] == "out"]
    assert values == [b"a", b"a"]  # the aborted copy is invisible to read_committed


def test_fenced_commit_fails_the_attempt_so_spark_keeps_the_other() -> None:
    sink = _sink()
    producer = FakeProducer(commit_errors=[KafkaError(KafkaError._FENCED, fatal=True)])
    with pytest.raises(TransientError, match="taken over by another attempt"):
        sink.commit_slot(_handle(sink, producer), _marker())


def test_driver_warns_at_80_percent_of_the_transaction_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = _sink(config={"transaction.timeout.ms": 10_000})
    caplog.set_level(logging.WARNING, "connectors.kafka")
    for txn_ms, warned in ((7_000.0, False), (8_500.0, True)):
        caplog.clear()
        metrics = BatchMetrics("unit", 3, "commit_in_task")
        tasks = [{"txn_ms": 10.0, "wait_ms": 5.0}, {"txn_ms": txn_ms, "wait_ms": 1000.0}]
        slot_figures(tasks, metrics, sink.options.transaction_timeout_ms)
        assert ("85% of transaction.timeout.ms=10000" in caplog.text) is warned
        assert (metrics.extra["txn_ms"], metrics.extra["barrier_wait_ms"]) == (txn_ms, 1000.0)


def test_the_batch_s_figures_summarise_its_slots_figures_without_reading_the_ledger() -> None:
    """``report_metrics`` reads the slots' figures from the batch's metrics (where the driver
    put what each slot's ``commit_slot`` returned), never the ledger; a batch whose slots did
    not run here (a replay, a recovered batch) has none and says 0."""
    sink = _sink()
    assert sink._ledger is None  # a read would fail
    metrics = BatchMetrics("unit", 3, "commit_in_task", outcome="committed")
    metrics.task_figures = [
        {"txn_ms": 12.5, "wait_ms": 3.0, "rows": 5, "produce_native_rows": 5},
        {"txn_ms": 20.0, "wait_ms": 1.0, "rows": 9, "produce_batch_rows": 4,
         "produce_record_rows": 5},
    ]
    sink.report_metrics(metrics)
    assert {k: metrics.extra[k] for k in ("txn_ms", "barrier_wait_ms", "produce_native_rows",
                                          "produce_batch_rows", "produce_record_rows")} == {
        "txn_ms": 20.0, "barrier_wait_ms": 3.0, "produce_native_rows": 5,
        "produce_batch_rows": 4, "produce_record_rows": 5}
    assert metrics.path == "native"  # the path with the most rows (the first of a tie)
    assert "task_figures" not in metrics.as_dict()  # summarised, not emitted as-is
    replayed = BatchMetrics("unit", 4, "commit_in_task", outcome="replayed")
    sink.report_metrics(replayed)
    assert replayed.extra["txn_ms"] == replayed.extra["produce_native_rows"] == 0
    assert replayed.path == ""


def test_driver_clients_never_travel_to_executors() -> None:
    sink = _sink()
    sink._clients.admin()
    clone = pickle.loads(pickle.dumps(sink))
    assert clone._clients._admin is None and clone._ledger is None


def test_a_slot_without_rows_still_commits_its_marker() -> None:
    sink, producer = _sink(), FakeProducer()
    figures = sink.commit_slot(_handle(sink, producer), _marker())
    assert [p[0] for p in producer.produced] == ["_connectors.unit.markers"]
    assert producer.calls == ["flush", "commit"]
    assert figures["rows"] == 0


# --- producers kept by a Python worker between batches (reuse_producers) ----------------


class InitCountingProducer(FakeProducer):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.inits = 0
        self.fail_produce = False

    def init_transactions(self, _t: float) -> None:
        self.inits += 1
        self.calls.append("init")

    def produce(self, topic: str, *args: Any, **kwargs: Any) -> None:
        if self.fail_produce:
            raise KafkaException(KafkaError(KafkaError._FENCED, fatal=True))
        super().produce(topic, *args, **kwargs)


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Any:
    """New producers come from a list; markers from a dict; the pool starts empty."""
    from connectors.kafka._pool import SLOT_OWNERS, SlotProducers

    SlotProducers.clear()
    monkeypatch.setattr(SLOT_OWNERS, "directory", str(tmp_path / "owners"))
    made: list[InitCountingProducer] = []
    markers: dict[int, SlotMarker] = {}

    def new_producer(self: KafkaClients, _tid: str, **_kw: Any) -> InitCountingProducer:
        made.append(InitCountingProducer())
        return made[-1]

    monkeypatch.setattr(KafkaClients, "producer", new_producer)
    monkeypatch.setattr(KafkaClients, "last_marker",
                        lambda clients, slot, batch_id=None: markers.get(slot))
    yield made, markers
    SlotProducers.clear()


def _ctx(batch_id: int) -> SlotTransaction:
    return SlotTransaction("unit", 0, batch_id, "abcd1234", 0, 77,
                           pa.schema([("value", pa.binary())]))


def _slot_marker(batch_id: int, fp: Fingerprint) -> SlotMarker:
    return SlotMarker("unit", 0, batch_id, 0, "abcd1234", fp)


def _run_slot(sink: KafkaSink, batch_id: int,
              values: list[bytes]) -> tuple[Slot, dict[str, float]]:
    handle = sink.open_slot(_ctx(batch_id))
    assert sink.read_marker(handle) is None
    sink.write(handle, pa.record_batch({"value": pa.array(values, pa.binary())}))
    figures = sink.commit_slot(handle, _slot_marker(batch_id, Fingerprint(len(values), 9)))
    return handle, dict(figures)


def _kept_after_batch_5(made: list[InitCountingProducer], **kwargs: Any) -> KafkaSink:
    """A sink whose worker kept slot 0's producer (``made[0]``) after committing batch 5."""
    sink = _sink(**kwargs)
    sink.known_topics["out"] = 3
    _run_slot(sink, 5, [b"a"])
    return sink


def _fence(producer: InitCountingProducer) -> None:
    """Another producer of the slot id starts: this one's next commit fails as fenced."""
    producer.commit_errors.append(KafkaError(KafkaError._FENCED, fatal=True))


def test_the_next_batch_of_a_slot_reuses_the_worker_s_producer_without_init(pool: Any) -> None:
    made, _ = pool
    sink = _sink()
    sink.known_topics["out"] = 3
    _, first = _run_slot(sink, 5, [b"a"])
    _, second = _run_slot(sink, 6, [b"b"])
    assert len(made) == 1 and made[0].inits == 1  # one init_transactions for two batches
    # connected to a learned broker first (connectors.kafka._io.init_transactions)
    assert made[0].metadata == ["_connectors.unit.markers"] * 2
    # The kept producer proves it still owns the slot (a flushed probe) before the batch.
    assert made[0].calls == ["init", "begin", "flush", "commit", "begin", "flush", "flush",
                             "commit"]
    assert [p[2]["partition"] for p in made[0].produced if p[0].endswith(".markers")] == [
        0, 0, 0]
    assert (first["reused"], second["reused"]) == (0, 1)


def test_reuse_producers_false_starts_every_slot_with_init(pool: Any) -> None:
    made, _ = pool
    sink = _sink(reuse_producers=False)
    sink.known_topics["out"] = 3
    _run_slot(sink, 5, [b"a"])
    _run_slot(sink, 6, [b"b"])
    assert [p.inits for p in made] == [1, 1]


def test_a_kept_producer_fenced_at_commit_starts_the_slot_over(pool: Any) -> None:
    made, _ = pool
    sink = _kept_after_batch_5(made)
    _fence(made[0])
    _, result = _run_slot(sink, 6, [b"b", b"c"])
    assert len(made) == 2 and made[1].calls == ["init", "begin", "flush", "commit"]
    assert [p[1][0] for p in made[1].produced if p[0] == "out"] == [b"b", b"c"]
    assert result["rows"] == 2 and result["reused"] == 0 and result["by_other"] == 0
    # The new producer is the one kept now.
    _run_slot(sink, 7, [b"d"])
    assert len(made) == 2 and made[1].inits == 1


def test_a_kept_producer_fenced_after_another_attempt_committed_writes_nothing(
    pool: Any,
) -> None:
    made, markers = pool
    sink = _kept_after_batch_5(made)
    _fence(made[0])
    handle = sink.open_slot(_ctx(6))
    assert sink.read_marker(handle) is None
    sink.write(handle, pa.record_batch({"value": pa.array([b"b"], pa.binary())}))
    # Another attempt of the slot committed batch 6 meanwhile (and fenced us).
    markers[0] = _slot_marker(6, Fingerprint(1, 9))
    figures = sink.commit_slot(handle, _slot_marker(6, Fingerprint(1, 9)))
    assert figures["by_other"] == 1
    assert made[1].calls == ["init"]  # read the marker again, wrote nothing
    assert "commit" not in made[0].calls[4:]


def test_another_attempt_s_different_content_is_a_non_deterministic_replay(pool: Any) -> None:
    from connectors.core.errors import NonDeterministicReplayError

    made, markers = pool
    sink = _kept_after_batch_5(made)
    _fence(made[0])
    handle = sink.open_slot(_ctx(6))
    sink.write(handle, pa.record_batch({"value": pa.array([b"b"], pa.binary())}))
    markers[0] = _slot_marker(6, Fingerprint(1, 12345))
    with pytest.raises(NonDeterministicReplayError, match=(
            r"differs from what was committed in slot 0 by another attempt: committed 1 rows, "
            r"digest 0+3039, replay has 1 rows, digest 0+9\.")) as caught:
        sink.commit_slot(handle, _slot_marker(6, Fingerprint(1, 9)))
    assert (caught.value.sink_id, caught.value.batch_id) == ("unit", 6)
    assert caught.value.transaction_id == handle.ctx.name


def test_another_attempt_s_different_content_is_kept_with_a_warning_under_warn(
        pool: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The same rule as the driver's (:func:`connectors.core.protocol.replay.check_replay`): under
    ``on_replay_mismatch="warn"`` the slot keeps what the other attempt committed."""
    made, markers = pool
    sink = _kept_after_batch_5(made, on_replay_mismatch="warn")
    _fence(made[0])
    handle = sink.open_slot(_ctx(6))
    sink.write(handle, pa.record_batch({"value": pa.array([b"b"], pa.binary())}))
    markers[0] = _slot_marker(6, Fingerprint(1, 12345))
    with caplog.at_level(logging.WARNING, logger="connectors.core.protocol.replay"):
        figures = sink.commit_slot(handle, _slot_marker(6, Fingerprint(1, 9)))
    assert figures["by_other"] == 1
    assert "slot 0 by another attempt" in caplog.text


def test_a_kept_producer_failing_while_producing_starts_over_at_the_commit(pool: Any) -> None:
    made, _ = pool
    sink = _kept_after_batch_5(made)
    made[0].fail_produce = True
    handle, result = _run_slot(sink, 6, [b"b", b"c"])
    assert handle.stale is False and result["rows"] == 2
    assert [p[1][0] for p in made[1].produced if p[0] == "out"] == [b"b", b"c"]
    assert made[1].calls == ["init", "begin", "flush", "commit"]


def test_a_fresh_producer_fenced_at_commit_still_fails_the_attempt(pool: Any) -> None:
    made, _ = pool
    sink = _sink()
    sink.known_topics["out"] = 3
    handle = sink.open_slot(_ctx(5))
    made[0].commit_errors.append(KafkaError(KafkaError._FENCED, fatal=True))
    with pytest.raises(TransientError, match="taken over by another attempt"):
        sink.commit_slot(handle, _slot_marker(5, Fingerprint(0, 0)))
    from connectors.kafka._pool import SlotProducers

    assert SlotProducers.take(sink._clients.pool_key(handle.ctx.name)) is None  # not kept


def test_a_fatal_error_met_by_flush_surfaces_as_the_kafka_exception() -> None:
    """confluent-kafka raises SystemError (cause: the KafkaException) from flush() of a
    fenced producer that has an error_cb; the sink sees the KafkaException."""
    from connectors.kafka._task_slot import client_errors

    fenced = KafkaException(KafkaError(KafkaError._FENCED, fatal=True))
    with pytest.raises(KafkaException) as caught, client_errors():
        raise SystemError("<method 'append' of 'list' objects> returned a result") from fenced
    assert caught.value is fenced
    with pytest.raises(SystemError), client_errors():
        raise SystemError("something else")


def test_a_kept_producer_fenced_before_the_batch_is_replaced_at_open(pool: Any) -> None:
    """Another worker ran the slot since (or the driver fenced it): the probe at open fails,
    a new producer (init_transactions) takes the slot before anything is read or written."""
    made, _ = pool
    sink = _kept_after_batch_5(made)
    made[0].fail_produce = True  # the probe's partition cannot join the transaction
    handle, result = _run_slot(sink, 6, [b"b"])
    assert len(made) == 2 and made[1].calls == ["init", "begin", "flush", "commit"]
    assert result["reused"] == 0 and handle.producer is made[1]


def test_a_kept_marker_reader_ignores_what_an_earlier_read_left_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """read_committed with a reused consumer: messages or an end-of-partition event of an
    earlier read (another partition, or this one at an older end) never count as this
    read's, so an older end cannot hide the newest marker."""
    from connectors.kafka import _io
    from connectors.kafka._config import KafkaConfig
    from connectors.kafka._pool import MarkerReaders

    class Msg:
        def __init__(self, partition: int, offset: int, eof: bool = False) -> None:
            self._p, self._o, self._eof = partition, offset, eof

        def error(self) -> KafkaError | None:
            return KafkaError(KafkaError._PARTITION_EOF) if self._eof else None

        def topic(self) -> str:
            return "m"

        def partition(self) -> int:
            return self._p

        def offset(self) -> int:
            return self._o

        def key(self) -> bytes:
            return b"slot/0"

        def value(self) -> bytes:
            return str(self._o).encode()

    class FakeConsumer:
        def __init__(self, _conf: Any) -> None:
            self.queue = [Msg(1, 9), Msg(0, 5, eof=True), Msg(0, 3), Msg(0, 7), Msg(0, 8),
                          Msg(0, 10, eof=True)]

        def get_watermark_offsets(self, *_a: Any, **_k: Any) -> tuple[int, int]:
            return 0, 10

        def assign(self, _tps: Any) -> None:
            pass

        def unassign(self) -> None:
            pass

        def poll(self, _t: float) -> Msg | None:
            return self.queue.pop(0) if self.queue else None

        def close(self) -> None:
            pass

    MarkerReaders.clear()
    monkeypatch.setattr(_io, "Consumer", FakeConsumer)
    records = _io.read_committed(KafkaConfig({"bootstrap.servers": "b:9092"}), "m", 0, tail=3,
                                 reuse=True)
    assert [r.offset for r in records] == [7, 8]
    assert MarkerReaders.clear() == 1  # kept after a clean read


class _WatermarkConsumer:
    """A consumer whose ``get_watermark_offsets`` raises ``errors`` first, then answers."""

    def __init__(self, errors: list[int]) -> None:
        self.errors, self.calls = list(errors), 0

    def __call__(self, _conf: Any) -> _WatermarkConsumer:
        return self

    def get_watermark_offsets(self, *_a: Any, **_k: Any) -> tuple[int, int]:
        self.calls += 1
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return 0, 0

    def list_topics(self, *_a: Any, **_k: Any) -> None:
        self.refreshed = getattr(self, "refreshed", 0) + 1

    def close(self) -> None:
        pass


def test_a_reader_waits_for_a_partition_the_metadata_does_not_show_yet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Right after the driver creates a topic, a broker's metadata may not show it for a few
    milliseconds (it failed a new sink's first batch once in CI): the read waits for it."""
    from connectors.kafka import _io
    from connectors.kafka._config import KafkaConfig

    consumer = _WatermarkConsumer([KafkaError._UNKNOWN_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART,
                                   KafkaError.LEADER_NOT_AVAILABLE])
    monkeypatch.setattr(_io, "Consumer", consumer)
    assert _io.read_committed(KafkaConfig({"bootstrap.servers": "b:9092"}), "l", 0) == []
    assert consumer.calls == 4
    assert consumer.refreshed == 3  # its own metadata too: a kept reader's may be old


def test_a_partition_that_stays_unknown_is_a_transient_error_after_the_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from connectors.kafka import _io
    from connectors.kafka._config import KafkaConfig

    monkeypatch.setattr(_io, "UNKNOWN_PARTITION_WAIT", 0.1)
    monkeypatch.setattr(_io, "Consumer", _WatermarkConsumer([KafkaError._UNKNOWN_PARTITION] * 1000))
    config = KafkaConfig({"bootstrap.servers": "b:9092", "sasl.password": "pw-secret-1"})
    started = time.monotonic()
    with pytest.raises(TransientError, match=r"reading l\[0\] failed: the cluster still does "
                       r"not know this partition after \d+\.\d s") as info:
        _io.read_committed(config, "l", 0, sink_id="s")
    assert time.monotonic() - started < 5
    assert "create_topic" not in str(info.value)  # the sink's own topic: nothing to pass
    assert "pw-secret-1" not in str(info.value)


def test_other_errors_of_a_reader_are_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    from connectors.core.errors import ConfigurationError
    from connectors.kafka import _io
    from connectors.kafka._config import KafkaConfig

    consumer = _WatermarkConsumer([KafkaError.TOPIC_AUTHORIZATION_FAILED])
    monkeypatch.setattr(_io, "Consumer", consumer)
    with pytest.raises(ConfigurationError, match="not authorized"):
        _io.read_committed(KafkaConfig({"bootstrap.servers": "b:9092"}), "l", 0)
    assert consumer.calls == 1


def test_a_partly_resubmitted_barrier_stage_does_not_wait_for_absent_slots(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Spark may resubmit only the missing partitions of a failed barrier stage (the other
    slot's success arrived after the failure was handled); allGather would then wait for a
    slot that never runs. The slot commits without aligning: the absent ones completed."""
    import dataclasses

    class PartialAttempt:
        def tasks(self) -> int:
            return 1  # one task of two

        def all_gather(self, _message: str) -> list[str]:
            raise AssertionError("would wait forever")

    sink, producer = _sink(barrier=True), FakeProducer()
    handle = _handle(sink, producer)
    handle.ctx = dataclasses.replace(handle.ctx, barrier=PartialAttempt())
    with caplog.at_level(logging.WARNING, logger="connectors.kafka"):
        sink.commit_slot(handle, _marker())
    assert producer.calls == ["flush", "commit"]
    assert "runs 1 of 2 slots" in caplog.text


def test_init_transactions_waits_for_a_learned_broker_first() -> None:
    """Two metadata requests, then init_transactions, all within one timeout: librdkafka's
    init_transactions otherwise often starts while no learned broker is connected and
    retries only after 500 ms (connectors.kafka._io.init_transactions)."""
    from connectors.kafka._io import init_transactions

    class Recording:
        def __init__(self, fail: bool = False) -> None:
            self.calls: list[tuple[str, Any, float]] = []
            self.fail = fail

        def list_topics(self, topic: str | None = None, timeout: float = -1) -> None:
            self.calls.append(("metadata", topic, timeout))
            if self.fail:
                raise KafkaException(KafkaError(KafkaError._TRANSPORT))

        def init_transactions(self, timeout: float) -> None:
            self.calls.append(("init", None, timeout))

    producer = Recording()
    init_transactions(producer, "markers", 30.0)
    assert [c[:2] for c in producer.calls] == [
        ("metadata", "markers"), ("metadata", "markers"), ("init", None)]
    assert all(0 < c[2] <= 30.0 for c in producer.calls)

    broken = Recording(fail=True)
    with pytest.raises(KafkaException):
        init_transactions(broken, None, 5.0)
    assert [c[0] for c in broken.calls] == ["metadata"]  # no init on an unreachable cluster


@pytest.fixture
def marker_reads(pool: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Slots whose marker partition was read (on top of ``pool``'s markers)."""
    reads: list[int] = []
    read = KafkaClients.last_marker

    def counting(clients: KafkaClients, slot: int, batch_id: int | None = None) -> Any:
        reads.append(slot)
        return read(clients, slot, batch_id)

    monkeypatch.setattr(KafkaClients, "last_marker", counting)
    return reads


def test_a_kept_producer_whose_probe_passed_knows_the_newest_marker_without_a_read(
    pool: Any, marker_reads: list[int],
) -> None:
    made, markers = pool
    markers[0] = _slot_marker(4, Fingerprint(3, 1))  # committed by an earlier run
    sink = _sink()
    sink.known_topics["out"] = 3
    _run_slot(sink, 5, [b"a"])  # a new producer: reads (finds batch 4), commits batch 5
    assert marker_reads == [0]
    _run_slot(sink, 6, [b"b"])  # kept, probe passed: batch 5's marker is the newest
    _run_slot(sink, 7, [b"c"])
    assert marker_reads == [0] and len(made) == 1
    # A retried task of batch 7 on this worker: the slot is committed, known without a read.
    handle = sink.open_slot(_ctx(7))
    found = sink.read_marker(handle)
    assert found is not None and found.batch_id == 7 and found.fingerprint == Fingerprint(1, 9)
    sink.abort_slot(handle)
    assert marker_reads == [0]
    # Kept again after that clean end; the next batch still needs no read.
    _run_slot(sink, 8, [b"d"])
    assert marker_reads == [0] and len(made) == 1


def test_a_kept_producer_fenced_before_its_probe_reads_the_marker_again(
    pool: Any, marker_reads: list[int],
) -> None:
    made, markers = pool
    sink = _kept_after_batch_5(made)
    assert marker_reads == [0]
    # Another worker ran the slot since (its init_transactions fenced the kept producer)
    # and committed batch 6: the probe fails, a new producer reads and finds that commit.
    made[0].fail_produce = True
    markers[0] = _slot_marker(6, Fingerprint(1, 9))
    handle = sink.open_slot(_ctx(6))
    assert handle.reused is False and len(made) == 2
    found = sink.read_marker(handle)
    assert found is not None and found.batch_id == 6
    assert marker_reads == [0, 0]


def test_a_kept_producer_another_worker_of_the_host_replaced_is_dropped_without_a_probe(
    pool: Any,
) -> None:
    import os

    from connectors.kafka._pool import SLOT_OWNERS

    made, _ = pool
    sink = _kept_after_batch_5(made)
    key = sink._clients.pool_key(_ctx(6).name)
    assert not SLOT_OWNERS.taken_over(key)  # this process started the slot's producer
    # Another Python worker of this host ran the slot since (a new producer there).
    with open(os.path.join(SLOT_OWNERS.directory, key), "w") as f:
        f.write(str(os.getpid() + 1))
    assert SLOT_OWNERS.taken_over(key)
    handle = sink.open_slot(_ctx(6))
    assert handle.reused is False and len(made) == 2
    assert made[0].calls == ["init", "begin", "flush", "commit"]  # never probed
    assert not SLOT_OWNERS.taken_over(key)  # claimed back by the new producer


def test_slot_owners_never_fail_and_know_nothing_without_a_record(tmp_path: Any) -> None:
    import os

    from connectors.kafka._pool import SlotOwners

    owners = SlotOwners(str(tmp_path / "a" / "b"))
    assert owners.taken_over("k") is False  # no record
    owners.claim("k")
    assert owners.taken_over("k") is False
    (tmp_path / "a" / "b" / "k").write_text("garbage")
    assert owners.taken_over("k") is False
    (tmp_path / "a" / "b" / "k").write_text(str(os.getpid() + 1))
    assert owners.taken_over("k") is True
    blocked = tmp_path / "file"
    blocked.write_text("")
    SlotOwners(str(blocked / "dir")).claim("k")  # cannot create the directory: ignored


def test_slot_owner_records_not_rewritten_for_a_week_are_swept_at_the_first_claim(
    tmp_path: Any,
) -> None:
    import os
    import time

    from connectors.kafka._pool import SlotOwners

    directory = tmp_path / "owners"
    directory.mkdir()
    old, fresh = directory / "old", directory / "fresh"
    old.write_text("1")
    fresh.write_text("1")
    week_ago = time.time() - SlotOwners.MAX_AGE_S - 60
    os.utime(old, (week_ago, week_ago))
    owners = SlotOwners(str(directory))
    owners.claim("k")
    assert sorted(p.name for p in directory.iterdir()) == ["fresh", "k"]
    os.utime(fresh, (week_ago, week_ago))
    owners.claim("k")  # once per process: the second claim sweeps nothing
    assert fresh.exists()
    assert owners.sweep() == 1 and not fresh.exists()
    assert SlotOwners(str(tmp_path / "missing")).sweep() == 0


def test_the_record_scan_returns_what_it_found_as_figures_not_a_commit() -> None:
    """``barrier=False`` without a DataFrame: a job of plain tasks checks every record; each
    returns its topics' highest partition as its figures (no committable: it commits
    nothing)."""
    from connectors.core.batch import TaskInfo
    from connectors.kafka._checks import scan_task

    sink = _sink()
    batch = pa.record_batch({"value": pa.array([b"a", b"b"]),
                             "partition": pa.array([2, 0], pa.int32())})
    outcome = scan_task(sink._checks, 4, TaskInfo(0, 0, 11), iter([batch]))
    assert (outcome.commit, outcome.error, outcome.figures) == (None, None, {"out": 2.0})
    unplaced = scan_task(sink._checks, 4, TaskInfo(1, 0, 12),
                         iter([pa.record_batch({"value": pa.array([b"c"])})]))
    assert unplaced.figures == {"out": -1.0}
    bad = scan_task(sink._checks, 4, TaskInfo(2, 0, 13), iter([pa.record_batch(
        {"value": pa.array([b"d"]), "partition": pa.array([-1], pa.int32())})]))
    assert isinstance(bad.error, BadInputError) and bad.figures == {}
