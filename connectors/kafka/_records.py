"""The checks of Kafka records in Arrow record batches: columns, sizes, topics, partitions.

The same checks run as Spark SQL on a DataFrame (:mod:`connectors.kafka._scan`); the sink's
collaborator that applies them, on the driver and in every slot, is
:class:`~connectors.kafka._checks.RecordChecks`. Producing is :mod:`connectors.kafka._produce`.

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
from connectors.kafka._config import validate_topic

__all__ = ["CLIENT_MAX_MESSAGE_BYTES", "TOPIC_MAX_MESSAGE_BYTES", "RecordLimits", "bad_topic",
           "check_schema", "merge_topics", "partition_beyond", "partition_record",
           "record_sizes", "scan_batch"]

#: librdkafka's and the broker's defaults (used when the config does not set them).
CLIENT_MAX_MESSAGE_BYTES = 1_000_000
TOPIC_MAX_MESSAGE_BYTES = 1_048_588

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


def partition_record(batch: pa.RecordBatch, partitions: int) -> str:
    """`` (record i (key ..., value ...))`` of the first record of ``batch`` whose
    partition is ``>= partitions`` (``values_in_errors=True`` only)."""
    column = batch.column(batch.schema.names.index("partition"))
    found = pc.index(pc.greater_equal(pc.fill_null(column, -1), partitions), True).as_py()
    if found is None or found < 0:
        return ""
    return f" (record {found}{describe_record(batch, int(found))})"


def merge_topics(into: dict[str, int], more: dict[str, int]) -> None:
    """Fold ``more`` (topic -> highest partition) into ``into``."""
    for t, p in more.items():
        into[t] = max(into.get(t, -1), p)
