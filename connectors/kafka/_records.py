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

from connectors.core.errors import BadInputError, ConfigurationError
from connectors.kafka._batch import BatchProducer, has_public_batch
from connectors.kafka._config import validate_topic
from connectors.kafka._native_produce import NativeProducer, attach
from connectors.kafka._placement import MURMUR2_PARTITIONERS

__all__ = ["PRODUCE_PATHS", "RecordLimits", "bad_topic", "check_schema", "fast_producer",
           "partition_beyond", "produce_batch", "record_sizes", "scan_batch"]

#: The paths a record can take into librdkafka (the ``produce_path`` of a slot's outcome;
#: rows per path are the ``produce_<path>_rows`` batch metrics).
PRODUCE_PATHS = ("native", "batch", "record")

#: A slot's batch producer: the accelerator or the public ``produce_batch``.
FastProducer = NativeProducer | BatchProducer

#: Bytes of a record's key or value quoted in an error (``values_in_errors=True`` only).
QUOTED_BYTES = 64

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


def partition_beyond(top: int, topic: str, partitions: int, what: str = "") -> str:
    """The message for a ``partition`` value ``top`` that ``topic`` (of ``partitions``
    partitions) does not have; ``what`` names the record (``values_in_errors`` only)."""
    return (f"the 'partition' column holds {top}{what}, but topic {topic!r} has "
            f"{partitions} partitions")


def quote(value: Any) -> str:
    """A record's key or value for an error message (``values_in_errors=True`` only): its
    first :data:`QUOTED_BYTES` bytes and its size."""
    if value is None:
        return "null"
    raw = value.encode() if isinstance(value, str) else bytes(value)
    head = raw[:QUOTED_BYTES].decode("utf-8", errors="replace")
    more = f"... ({len(raw)} bytes)" if len(raw) > QUOTED_BYTES else ""
    return f"{head!r}{more}"


def bad_topic(topic: str) -> str | None:
    """The message for a ``topic`` column value Kafka would refuse as a topic name (checked
    before anything is produced, so that the error names the rule rather than a metadata
    failure), or ``None``."""
    try:
        validate_topic(topic)
    except ConfigurationError:
        return (f"the 'topic' column holds {topic[:300]!r}, which is not a valid Kafka topic "
                "name (1-249 characters of A-Z, a-z, 0-9, '.', '_' and '-', not '.' or "
                "'..'): fix or filter those rows")
    return None


def describe_record(batch: pa.RecordBatch, index: int) -> str:
    """`` (key ..., value ...)`` of record ``index`` (``values_in_errors=True`` only)."""
    names = batch.schema.names
    parts = [f"{name} {quote(batch.column(names.index(name))[index].as_py())}"
             for name in ("key", "value") if name in names]
    return f" ({', '.join(parts)})"


def scan_batch(
    batch: pa.RecordBatch, limits: RecordLimits, fixed_topic: str | None,
    error: Callable[[str], BadInputError], *, values_in_errors: bool = False,
) -> BatchScan:
    """Check one record batch's records: sizes, topics and partitions present.

    Raises ``error(message)`` for a record that cannot be written; returns what the caller
    must still check against the cluster (topics exist, partitions in range). The message
    names the record's index, size, topic and partition; its key and value only with
    ``values_in_errors``.
    """
    names = batch.schema.names
    n = batch.num_rows
    if n == 0:
        return BatchScan(0, 0, {})
    sizes = record_sizes(batch)
    max_size = int(pc.max(sizes).as_py())
    if max_size > limits.max_record_bytes:
        index = int(pc.index(sizes, max_size).as_py())
        what = describe_record(batch, index) if values_in_errors else ""
        raise error(
            f"record {index} of a batch{what} is about {max_size} bytes, larger than the "
            f"{limits.max_record_bytes} bytes the producer/topic accept (message.max.bytes "
            "in the config, max.message.bytes of the topic): raise those limits or write "
            "smaller values")
    partitions = batch.column(names.index("partition")) if "partition" in names else None
    if partitions is not None:
        low = pc.min(partitions).as_py()
        if low is not None and low < 0:
            index = int(pc.index(partitions, low).as_py())
            what = f" (record {index}{describe_record(batch, index)})" if values_in_errors else ""
            raise error(f"the 'partition' column holds {low}{what}: partitions are >= 0")
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
            problem = bad_topic(str(t))
            if problem is not None:
                raise error(problem)
            topics[str(t)] = -1 if p is None else int(p)
    return BatchScan(n, max_size, topics)


def fast_producer(producer: Any, mode: str, timeout: float, *, partitioner: str | None,
                  refresh_ms: int, queue_limit: int) -> FastProducer | None:
    """The batch producer a slot uses for ``producer`` under ``mode``
    (:attr:`~connectors.kafka._config.KafkaOptions.produce_mode`: ``"auto"`` the ctypes
    accelerator where verified, else the public ``produce_batch``; ``"public"`` never the
    accelerator; ``"record"``), or ``None`` (one ``produce()`` per record)."""
    if mode == "record":
        return None
    if mode == "auto":
        native = attach(producer, timeout, partitioner=partitioner, refresh_ms=refresh_ms)
        if native is not None:
            return native
    if not has_public_batch(producer):
        return None
    return BatchProducer(producer, timeout, by_key=partitioner in MURMUR2_PARTITIONERS,
                         refresh_ms=refresh_ms, queue_limit=queue_limit)


def _has_headers(batch: pa.RecordBatch) -> bool:
    """Some record of ``batch`` has at least one header."""
    names = batch.schema.names
    if "headers" not in names:
        return False
    lengths = pc.list_value_length(batch.column(names.index("headers")))
    top = pc.max(lengths).as_py()
    return top is not None and top > 0


def _produce_fast(fast: FastProducer, batch: pa.RecordBatch, fixed_topic: str | None) -> int:
    names = batch.schema.names
    values = batch.column(names.index("value"))
    keys = batch.column(names.index("key")) if "key" in names else None
    parts = batch.column(names.index("partition")) if "partition" in names else None
    if fixed_topic is not None:
        return fast.produce(fixed_topic, values, keys, parts)
    topics = batch.column(names.index("topic"))
    n = 0
    # Per topic, in the order of first appearance; a filter keeps each topic's order.
    for topic in pc.unique(topics).to_pylist():
        mask = pc.equal(topics, topic)
        n += fast.produce(
            str(topic), values.filter(mask), keys.filter(mask) if keys is not None else None,
            parts.filter(mask) if parts is not None else None)
    return n


def merge_topics(into: dict[str, int], more: dict[str, int]) -> None:
    for t, p in more.items():
        into[t] = max(into.get(t, -1), p)


def produce_batch(produce: Callable[..., Any], poll: Callable[[float], Any],
                  batch: pa.RecordBatch, fixed_topic: str | None,
                  fast: FastProducer | None = None) -> tuple[int, str]:
    """Produce every record of ``batch``; returns the count and the path that ran
    (``"native"``, ``"batch"`` or ``"record"``). Waits when the queue is full.

    With ``fast`` (and no record with headers, which ``produce_batch`` would drop), the
    records are enqueued in batches by ``fast`` (:mod:`connectors.kafka._native` or
    :mod:`connectors.kafka._batch`); otherwise one ``produce`` call per record.
    """
    if fast is not None and not _has_headers(batch):
        return _produce_fast(fast, batch, fixed_topic), fast.path
    return _produce_records(produce, poll, batch, fixed_topic), "record"


def _produce_records(produce: Callable[..., Any], poll: Callable[[float], Any],
                     batch: pa.RecordBatch, fixed_topic: str | None) -> int:
    names = batch.schema.names
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
