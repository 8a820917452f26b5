"""Arrow record batches -> Kafka records: column checks, size checks, produce loops.

The DataFrame columns are those of Spark's own Kafka sink: ``value`` (string or binary,
required), optional ``key`` (string or binary), ``headers`` (array of
``struct<key: string, value: binary>``), ``partition`` (int) and ``topic`` (string).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from connectors.core.errors import BadInputError
from connectors.kafka._native import NativeProducer

__all__ = ["RecordLimits", "check_schema", "record_sizes", "scan_batch"]

#: Bytes a record adds to its key, value and headers in a record batch (varints,
#: attributes, timestamp and offset deltas: at most ~25 bytes; rounded up).
RECORD_OVERHEAD = 64
KNOWN = ("key", "value", "headers", "partition", "topic")


def _is_bytes(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t))


def _is_headers(t: pa.DataType) -> bool:
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return False
    item = t.value_type
    if not pa.types.is_struct(item) or item.num_fields != 2:
        return False
    k, v = item.field(0), item.field(1)
    return bool(k.name == "key" and (pa.types.is_string(k.type) or pa.types.is_large_string(k.type))
            and v.name == "value" and _is_bytes(v.type))


def check_schema(schema: pa.Schema, *, fixed_topic: bool) -> None:
    """Refuse a batch whose columns Kafka records cannot be made of (names the fix)."""
    names = schema.names
    if "value" not in names:
        raise BadInputError(
            f"the DataFrame has no 'value' column (columns: {', '.join(names) or 'none'}): "
            "select the record value as 'value', e.g. df.selectExpr('to_json(struct(*)) AS "
            "value')")
    problems = []
    for name, ok, want in (
        ("value", _is_bytes, "string or binary"),
        ("key", _is_bytes, "string or binary"),
        ("headers", _is_headers, "array<struct<key: string, value: binary>>"),
        ("partition", pa.types.is_integer, "int"),
        ("topic", lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), "string"),
    ):
        if name in names and not ok(schema.field(name).type):
            problems.append(f"'{name}' is {schema.field(name).type}, expected {want}")
    if problems:
        raise BadInputError(
            "wrong column types for Kafka records: " + "; ".join(problems)
            + ". Cast them, e.g. col('value').cast('binary')")
    if not fixed_topic and "topic" not in names:
        raise BadInputError(
            "KafkaSink(topic=None, ...) needs a 'topic' column naming each record's topic; "
            "add one, or pass the topic to KafkaSink")


def _lengths(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    return pc.fill_null(pc.binary_length(arr), 0)


def record_sizes(batch: pa.RecordBatch) -> pa.Array:
    """Approximate serialized size of every record (key + value + headers + overhead)."""
    names = batch.schema.names
    size = _lengths(batch.column(names.index("value")))
    if "key" in names:
        size = pc.add(size, _lengths(batch.column(names.index("key"))))
    if "headers" in names:
        headers = batch.column(names.index("headers"))
        flat = pc.list_flatten(headers)
        if len(flat):
            item = pc.add(_lengths(pc.struct_field(flat, [0])),
                          _lengths(pc.struct_field(flat, [1])))
            parents = pc.list_parent_indices(headers)
            summed = pa.table({"p": parents, "n": item}).group_by("p").aggregate([("n", "sum")])
            extra = [0] * len(batch)
            for p, n in zip(summed.column("p").to_pylist(), summed.column("n_sum").to_pylist(),
                            strict=True):
                extra[p] = n + 16
            size = pc.add(size, pa.array(extra, pa.int64()))
    return pc.add(pc.cast(size, pa.int64()), RECORD_OVERHEAD)


@dataclass(frozen=True)
class RecordLimits:
    """What a record must fit: the largest record (bytes) the producer and topic accept."""

    max_record_bytes: int


@dataclass
class BatchScan:
    """What :func:`scan_batch` found in one record batch."""

    rows: int
    max_size: int
    topics: dict[str, int]  # topic -> largest explicit partition (-1: none given)


def scan_batch(
    batch: pa.RecordBatch, limits: RecordLimits, fixed_topic: str | None,
    error: Callable[[str], BadInputError],
) -> BatchScan:
    """Check one record batch's records: sizes, topics and partitions present.

    Raises ``error(message)`` for a record that cannot be written; returns what the caller
    must still check against the cluster (topics exist, partitions in range).
    """
    names = batch.schema.names
    n = batch.num_rows
    if n == 0:
        return BatchScan(0, 0, {})
    sizes = record_sizes(batch)
    max_size = int(pc.max(sizes).as_py())
    if max_size > limits.max_record_bytes:
        index = int(pc.index(sizes, max_size).as_py())
        raise error(
            f"record {index} of a batch is about {max_size} bytes, larger than the "
            f"{limits.max_record_bytes} bytes the producer/topic accept (message.max.bytes "
            "in the config, max.message.bytes of the topic): raise those limits or write "
            "smaller values")
    partitions = batch.column(names.index("partition")) if "partition" in names else None
    if partitions is not None:
        low = pc.min(partitions).as_py()
        if low is not None and low < 0:
            raise error(f"the 'partition' column holds {low}: partitions are >= 0")
    topics: dict[str, int] = {}
    if fixed_topic is not None:
        top = pc.max(partitions).as_py() if partitions is not None else None
        topics[fixed_topic] = -1 if top is None else int(top)
    else:
        column = batch.column(names.index("topic"))
        if column.null_count:
            raise error("the 'topic' column holds null: every record needs its topic")
        table = pa.table({"t": column, "p": partitions if partitions is not None
                          else pa.nulls(n, pa.int64())})
        grouped = table.group_by("t").aggregate([("p", "max")])
        for t, p in zip(grouped.column("t").to_pylist(), grouped.column("p_max").to_pylist(),
                        strict=True):
            topics[str(t)] = -1 if p is None else int(p)
    return BatchScan(n, max_size, topics)


def _produce_native(native: NativeProducer, batch: pa.RecordBatch,
                    fixed_topic: str | None) -> int:
    names = batch.schema.names
    values = batch.column(names.index("value"))
    keys = batch.column(names.index("key")) if "key" in names else None
    parts = batch.column(names.index("partition")) if "partition" in names else None
    if fixed_topic is not None:
        return native.produce(fixed_topic, values, keys, parts)
    topics = batch.column(names.index("topic"))
    n = 0
    # Per topic, in the order of first appearance; a filter keeps each topic's order.
    for topic in pc.unique(topics).to_pylist():
        mask = pc.equal(topics, topic)
        n += native.produce(
            str(topic), values.filter(mask), keys.filter(mask) if keys is not None else None,
            parts.filter(mask) if parts is not None else None)
    return n


def merge_topics(into: dict[str, int], more: dict[str, int]) -> None:
    for t, p in more.items():
        into[t] = max(into.get(t, -1), p)


def produce_batch(produce: Callable[..., Any], poll: Callable[[float], Any],
                  batch: pa.RecordBatch, fixed_topic: str | None,
                  native: NativeProducer | None = None) -> int:
    """Produce every record of ``batch``; returns the count. Waits when the queue is full.

    With ``native`` (and no ``headers`` column), the records are enqueued straight from
    the Arrow buffers by :mod:`connectors.kafka._native`; otherwise one ``produce`` call
    per record.
    """
    names = batch.schema.names
    if native is not None and "headers" not in names:
        return _produce_native(native, batch, fixed_topic)
    values = batch.column(names.index("value")).to_pylist()
    keys = batch.column(names.index("key")).to_pylist() if "key" in names else None
    n = len(values)
    simple = fixed_topic is not None and not ({"headers", "partition"} & set(names))
    if simple:
        topic = fixed_topic
        for i in range(n):
            value, key = values[i], (keys[i] if keys is not None else None)
            while True:
                try:
                    produce(topic, value, key)
                    break
                except BufferError:
                    poll(0.05)
        return n
    headers = batch.column(names.index("headers")).to_pylist() if "headers" in names else None
    parts = batch.column(names.index("partition")).to_pylist() if "partition" in names else None
    topics = batch.column(names.index("topic")).to_pylist() if fixed_topic is None else None
    for i in range(n):
        kwargs: dict[str, Any] = {"value": values[i]}
        if keys is not None:
            kwargs["key"] = keys[i]
        if headers is not None and headers[i]:
            kwargs["headers"] = [(h["key"], h["value"]) for h in headers[i]]
        if parts is not None and parts[i] is not None:
            kwargs["partition"] = int(parts[i])
        topic = fixed_topic if topics is None else topics[i]
        while True:
            try:
                produce(topic, **kwargs)
                break
            except BufferError:
                poll(0.05)
    return n
