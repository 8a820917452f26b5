"""Arrow -> Kafka records: the column rules of Spark's Kafka sink, sizes, topics."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from connectors.core.errors import BadInputError
from connectors.kafka._produce import produce_batch
from connectors.kafka._records import (
    RECORD_OVERHEAD,
    RecordLimits,
    check_schema,
    record_sizes,
    scan_batch,
)

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def _error(message: str) -> BadInputError:
    return BadInputError(message)


def test_value_is_required_and_named_in_the_error() -> None:
    with pytest.raises(BadInputError, match="no 'value' column"):
        check_schema(pa.schema([("key", pa.string())]), fixed_topic=True)


@pytest.mark.parametrize("value", [pa.string(), pa.binary(), pa.large_string(),
                                   pa.large_binary()])
def test_string_or_binary_values_are_accepted(value: pa.DataType) -> None:
    check_schema(pa.schema([("value", value), ("key", value), ("headers", HEADERS),
                            ("partition", pa.int32()), ("topic", pa.string()),
                            ("other", pa.float64())]), fixed_topic=False)


def test_every_wrong_type_is_listed() -> None:
    schema = pa.schema([("value", pa.int64()), ("key", pa.float64()),
                        ("headers", pa.list_(pa.string())), ("partition", pa.string()),
                        ("topic", pa.int32())])
    with pytest.raises(BadInputError) as info:
        check_schema(schema, fixed_topic=False)
    for name in ("'value'", "'key'", "'headers'", "'partition'", "'topic'"):
        assert name in str(info.value)


def test_no_topic_needs_a_topic_column() -> None:
    with pytest.raises(BadInputError, match="needs a 'topic' column"):
        check_schema(pa.schema([("value", pa.binary())]), fixed_topic=False)


def test_record_sizes_count_key_value_and_headers() -> None:
    batch = pa.record_batch({
        "value": pa.array([b"abc", None], pa.binary()),
        "key": pa.array(["k", "kk"]),
        "headers": pa.array([[{"key": "h", "value": b"12345"}], []], HEADERS),
    })
    sizes = record_sizes(batch).to_pylist()
    assert sizes[0] == 3 + 1 + (1 + 5 + 16) + RECORD_OVERHEAD
    assert sizes[1] == 0 + 2 + RECORD_OVERHEAD


def test_a_record_over_the_limit_is_refused_naming_its_size() -> None:
    batch = pa.record_batch({"value": pa.array([b"x" * 10, b"y" * 5000])})
    with pytest.raises(BadInputError, match="record 1 of a batch is about 5064 bytes"):
        scan_batch(batch, RecordLimits(1000), "t", _error)
    assert scan_batch(batch, RecordLimits(6000), "t", _error).max_size == 5064


def test_scan_collects_topics_and_their_largest_partition() -> None:
    batch = pa.record_batch({
        "value": pa.array([b"a", b"b", b"c"]),
        "topic": pa.array(["x", "y", "x"]),
        "partition": pa.array([0, None, 3], pa.int32()),
    })
    scan = scan_batch(batch, RecordLimits(10_000), None, _error)
    assert scan.topics == {"x": 3, "y": -1}
    assert scan_batch(batch, RecordLimits(10_000), "fixed", _error).topics == {"fixed": 3}


@pytest.mark.parametrize(("column", "values", "message"), [
    ("topic", ["x", None], "holds null"),
    ("partition", [0, -1], "partitions are >= 0"),
])
def test_bad_topics_and_partitions_are_refused(
    column: str, values: list[Any], message: str
) -> None:
    cols: dict[str, Any] = {"value": pa.array([b"a", b"b"]), "topic": pa.array(["x", "x"])}
    cols[column] = pa.array(values, pa.int32() if column == "partition" else pa.string())
    with pytest.raises(BadInputError, match=message):
        scan_batch(pa.record_batch(cols), RecordLimits(10_000), None, _error)


def test_produce_batch_maps_every_column_and_waits_on_a_full_queue() -> None:
    calls: list[tuple[Any, ...]] = []
    full = [True]

    def produce(topic: str, *args: Any, **kwargs: Any) -> None:
        if full[0]:
            full[0] = False
            raise BufferError
        calls.append((topic, args, kwargs))

    polls: list[float] = []
    batch = pa.record_batch({
        "value": pa.array(["v0", "v1"]), "key": pa.array([b"k0", None]),
        "headers": pa.array([[{"key": "h", "value": b"1"}], None], HEADERS),
        "partition": pa.array([1, None], pa.int32()), "topic": pa.array(["a", "b"]),
    })
    assert produce_batch(produce, polls.append, batch, None) == (2, "record")
    assert polls  # the full queue was polled, then the record produced
    assert calls == [
        ("a", (), {"value": "v0", "key": b"k0", "headers": [("h", b"1")], "partition": 1}),
        ("b", (), {"value": "v1", "key": None}),
    ]
    calls.clear()
    simple = pa.record_batch({"value": pa.array([b"x"]), "key": pa.array(["k"])})
    assert produce_batch(produce, polls.append, simple, "fixed") == (1, "record")
    assert calls == [("fixed", (b"x", "k"), {})]
