"""Batch produce's Arrow -> ``rd_kafka_message_t`` arrays (no broker: see
integration/kafka/test_kafka_native.py for the records a real broker receives)."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import Producer

from connectors.kafka import _native
from connectors.kafka._native import MESSAGE, VERIFIED, RdKafka, layout_triple, murmur2
from connectors.kafka._native_produce import _pointers, attach


@pytest.fixture
def listed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The installed triple on the allow-list (the oldest CI lane's release is not): these
    tests are about the native path itself; the gate has tests of its own."""
    _native._reset_for_tests()
    monkeypatch.setattr(_native, "VERIFIED",
                        {**VERIFIED, layout_triple(): next(iter(VERIFIED.values()))})
    yield
    _native._reset_for_tests()


class _RdKafkaMessage(ctypes.Structure):
    """``rd_kafka_message_t`` as rdkafka.h declares it, laid out by the C compiler's rules."""

    _fields_ = [
        ("err", ctypes.c_int), ("rkt", ctypes.c_void_p), ("partition", ctypes.c_int32),
        ("payload", ctypes.c_void_p), ("len", ctypes.c_size_t), ("key", ctypes.c_void_p),
        ("key_len", ctypes.c_size_t), ("offset", ctypes.c_int64), ("_private", ctypes.c_void_p),
    ]


def test_the_message_array_matches_the_c_struct_field_for_field() -> None:
    assert MESSAGE.itemsize == ctypes.sizeof(_RdKafkaMessage)
    fields = MESSAGE.fields
    assert fields is not None
    for field in _RdKafkaMessage._fields_:
        name = field[0]
        assert fields[name][1] == getattr(_RdKafkaMessage, name).offset, name


def _read(address: np.ndarray, length: np.ndarray, _owner: pa.Array) -> list[bytes | None]:
    return [None if a == 0 else ctypes.string_at(int(a), int(n))
            for a, n in zip(address, length, strict=True)]


@pytest.mark.parametrize("typ", [pa.binary(), pa.string(), pa.large_binary(),
                                 pa.large_string()])
def test_pointers_cover_nulls_empty_values_and_slices(typ: pa.DataType) -> None:
    raw = [b"a", None, b"", "\u00e9t\u00e9".encode(), b"x" * 300, None, b"last"]
    text = pa.types.is_string(typ) or pa.types.is_large_string(typ)
    values = [v.decode() if text and v is not None else v for v in raw]
    arr = pa.array(values, typ)
    address, length, owner = _pointers(arr)
    assert owner is arr
    assert _read(address, length, owner) == raw
    # An empty value is a real pointer (an empty record value), a null value is NULL.
    assert address[2] != 0 and length[2] == 0
    assert address[1] == 0 and length[1] == 0
    sliced = arr.slice(2, 4)
    assert _read(*_pointers(sliced)) == raw[2:6]


def test_pointers_of_an_array_with_no_data_buffer() -> None:
    arr = pa.array([b"", b"", None], pa.binary())
    address, length, _ = _pointers(arr)
    assert list(length) == [0, 0, 0]
    assert address[0] != 0 and address[1] != 0 and address[2] == 0


def test_pointers_of_a_chunked_array() -> None:
    arr = pa.chunked_array([pa.array([b"a", b"bc"]), pa.array([None, b"d"])])
    assert _read(*_pointers(arr)) == [b"a", b"bc", None, b"d"]


@pytest.mark.usefixtures("listed")
def test_attach_verifies_the_handle_of_a_real_producer() -> None:
    # No broker needed: the handle exists from the constructor on.
    producer = Producer({"bootstrap.servers": "127.0.0.1:9"})
    native = attach(producer)
    assert native is not None and native.producer is producer
    assert attach(object()) is None  # type: ignore[arg-type]


def _librdkafka_murmur2(cdll: ctypes.CDLL, key: bytes | None, partitions: int) -> int:
    """librdkafka's own ``rd_kafka_msg_partitioner_murmur2`` (public API; it reads neither
    the topic handle nor the opaques)."""
    fn = cdll.rd_kafka_msg_partitioner_murmur2
    fn.restype = ctypes.c_int32
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32,
                   ctypes.c_void_p, ctypes.c_void_p]
    buf = ctypes.create_string_buffer(key or b"", max(len(key or b""), 1))
    return int(fn(None, buf, len(key or b""), partitions, None, None))


def test_murmur2_is_kafka_s() -> None:
    # org.apache.kafka.common.utils.UtilsTest#testMurmur2
    cases = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
             b"a-little-bit-longer-string": -1486304829,
             b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
             b"abc": 479470107}
    got = murmur2(pa.array(list(cases), pa.binary()))
    assert got.dtype == np.uint32
    assert [int(h) - (1 << 32) if h >= 1 << 31 else int(h) for h in got] == list(cases.values())


@pytest.mark.parametrize("typ", [pa.binary(), pa.string(), pa.large_binary(),
                                 pa.large_string()])
def test_murmur2_places_keys_where_librdkafka_s_partitioner_does(typ: pa.DataType) -> None:
    lib = RdKafka()
    rng = np.random.default_rng(7)
    raw = [bytes(rng.integers(0, 256, size=int(rng.integers(0, 41)), dtype=np.uint8))
           for _ in range(3000)] + [b"", b"k", b"k1", b"k12", b"k123", "\u00e9".encode()]
    text = pa.types.is_string(typ) or pa.types.is_large_string(typ)
    if text:
        raw = [r.decode("utf-8", errors="replace").encode() for r in raw]
    arr = pa.array([r.decode() if text else r for r in raw], typ)
    # A slice (offsets into the buffers) and a null, which hashes as the empty key.
    sliced = pa.concat_arrays([pa.array([None], typ), arr]).slice(1)
    for keys in (arr, sliced):
        hashes = murmur2(keys)
        for partitions in (1, 3, 7, 64):
            ours = (hashes & np.uint32(0x7FFFFFFF)) % np.uint32(partitions)
            theirs = [_librdkafka_murmur2(lib.lib, r, partitions) for r in raw]
            assert ours.tolist() == theirs
    with_null = pa.array([b"a", None, b"abc"], pa.binary())
    assert murmur2(with_null)[1] == murmur2(pa.array([b""]))[0]
    assert murmur2(pa.array([], pa.binary())).tolist() == []
    assert murmur2(pa.array([b"", None], pa.binary())).tolist() == [murmur2(pa.array([b""]))[0]] * 2


@pytest.mark.usefixtures("listed")
def test_attach_places_keys_itself_only_under_a_murmur2_partitioner() -> None:
    producer = Producer({"bootstrap.servers": "127.0.0.1:9"})
    for partitioner, by_key in (("murmur2_random", True), ("murmur2", True),
                                ("consistent_random", False), (None, False)):
        native = attach(producer, partitioner=partitioner)
        assert native is not None and native.by_key is by_key


@pytest.mark.usefixtures("listed")
def test_a_negative_refresh_interval_never_refreshes_the_partition_count() -> None:
    producer = Producer({"bootstrap.servers": "127.0.0.1:9"})
    never, often = (attach(producer, partitioner="murmur2", refresh_ms=ms) for ms in (-1, 10))
    assert never is not None and never._refresh_s == float("inf")
    assert often is not None and often._refresh_s == 1.0  # at most one request a second


@pytest.mark.parametrize("length", [1, 3, 4, 5, 8, 36])
def test_murmur2_of_keys_of_one_length_matches_librdkafka(length: int) -> None:
    """Equal lengths take the matrix path: same hashes as librdkafka, sliced or not."""
    lib = RdKafka()
    rng = np.random.default_rng(length)
    raw = [bytes(rng.integers(0, 256, size=length, dtype=np.uint8)) for _ in range(500)]
    arr = pa.array(raw, pa.binary())
    for keys, expected in ((arr, raw), (arr.slice(7, 300), raw[7:307])):
        ours = (murmur2(keys) & np.uint32(0x7FFFFFFF)) % np.uint32(5)
        assert ours.tolist() == [_librdkafka_murmur2(lib.lib, r, 5) for r in expected]
    uuids = pa.array([f"{i:08x}-0000-4000-8000-{i:012x}" for i in range(200)], pa.string())
    mixed = pa.concat_arrays([uuids, pa.array(["short"], pa.string())])
    assert murmur2(uuids).tolist() == murmur2(mixed)[:200].tolist()
