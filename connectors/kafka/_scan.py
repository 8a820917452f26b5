"""``barrier=False``: the whole batch's records checked by one Spark aggregation (no Python).

The same checks as :func:`connectors.kafka._records.scan_batch` (which every slot still
runs before it produces), expressed in Spark SQL so that the check job runs in the JVM
only: no Arrow transfer, no Python worker. The record size is the same sum as
:func:`~connectors.kafka._records.record_sizes` (UTF-8/binary lengths of key and value, of
every header's key and value plus 16 when a record has headers, plus the per-record
overhead), so a batch this check passes also passes every slot's check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from connectors.core.errors import BadInputError
from connectors.kafka._records import RECORD_OVERHEAD, RecordLimits

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["scan_dataframe"]


def _size(names: list[str]) -> Column:
    from pyspark.sql import functions as F  # noqa: N812

    def length(c: Column) -> Column:
        return F.coalesce(F.octet_length(c).cast("long"), F.lit(0).cast("long"))

    size = length(F.col("value"))
    if "key" in names:
        size = size + length(F.col("key"))
    if "headers" in names:
        summed = F.aggregate(
            F.col("headers"), F.lit(0).cast("long"),
            lambda acc, h: acc + length(h.getField("key")) + length(h.getField("value")),
        )
        size = size + F.when(F.coalesce(F.size("headers"), F.lit(0)) > 0, summed + 16) \
            .otherwise(F.lit(0).cast("long"))
    return size + F.lit(RECORD_OVERHEAD).cast("long")


def scan_dataframe(
    df: DataFrame, limits: RecordLimits, fixed_topic: str | None,
    error: Callable[[str], BadInputError],
) -> dict[str, int]:
    """Check every record of ``df``: size, partition >= 0, topic present.

    Returns topic -> largest explicit partition (-1: none given) for the caller to check
    against the cluster; raises ``error(message)`` for a record that cannot be written.
    """
    from pyspark.sql import functions as F  # noqa: N812

    names = df.columns
    has_partition = "partition" in names
    partition = F.col("partition") if has_partition else F.lit(None).cast("int")
    aggs = [
        F.count(F.lit(1)).alias("rows"),
        F.max(_size(names)).alias("max_size"),
        F.min(partition).alias("low"),
        F.max(partition).alias("top"),
    ]
    if fixed_topic is not None:
        rows = [(fixed_topic, r) for r in df.agg(*aggs).collect()]
    else:
        rows = [(r["topic"], r) for r in df.groupBy("topic").agg(*aggs).collect()]
    topics: dict[str, int] = {}
    for topic, r in rows:
        if not r["rows"]:
            continue
        if int(r["max_size"]) > limits.max_record_bytes:
            where = "" if fixed_topic is not None else f" for topic {topic!r}"
            raise error(
                f"a record{where} is about {int(r['max_size'])} bytes, larger than the "
                f"{limits.max_record_bytes} bytes the producer/topic accept (message.max.bytes "
                "in the config, max.message.bytes of the topic): raise those limits or write "
                "smaller values")
        if r["low"] is not None and int(r["low"]) < 0:
            raise error(f"the 'partition' column holds {int(r['low'])}: partitions are >= 0")
        if topic is None:
            raise error("the 'topic' column holds null: every record needs its topic")
        top = -1 if r["top"] is None else int(r["top"])
        topics[str(topic)] = max(topics.get(str(topic), -1), top)
    return topics
