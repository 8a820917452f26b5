"""The rows of a Spark batch: their Arrow schema, their hashes and their fingerprints.

:func:`arrow_schema` gives the schema of the Arrow batches ``mapInArrow`` hands the tasks.
:func:`has_map`, :func:`flat_schema` and :func:`check_columns` say what a schema allows.

Row hashes for fingerprints are computed in one of two places, fixed per batch by the sink
and the schema (:attr:`~connectors.spark.frames.SparkBatch.hashes_in_tasks`), and both sides
of every comparison use the same one:

- **the JVM** (default): every row's ``xxhash64`` (seeded by the column count; maps as
  JSON, which ``xxhash64`` refuses) travels to the tasks as the last column
  :data:`~connectors.core.fingerprint.ROW_HASH_COLUMN`, which the tasks sum, and
  :meth:`~connectors.spark.frames.SparkBatch.fingerprint` sums the same hashes in one
  aggregation job (:func:`spark_fingerprint`). The digest is the sum of the row hashes
  modulo 2**64, computed as two 32-bit halves so that the ``long`` sums cannot overflow
  under ANSI mode below 2**31 rows. Cheapest for long values (~0.3 ns per byte), but the
  extra column costs a projection (a copy of every row when nothing else projects) and its
  Arrow hand-over: ~60-80 ns per row.
- **the tasks** (sinks that ask for it, flat schemas only): the tasks hash the Arrow
  batches they receive with :func:`~connectors.core.fingerprint.fingerprint_batch`
  (vectorised numpy, ~5 ns per fixed-width value, ~3 ns per string byte), and
  :meth:`~connectors.spark.frames.SparkBatch.fingerprint` runs the same function in a
  ``mapInArrow`` job (replays only). Cheapest for rows of numbers, timestamps and short
  strings.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import pyarrow as pa

from connectors.core.errors import BadInputError
from connectors.core.fingerprint import ROW_HASH_COLUMN, Fingerprint
from connectors.spark._names import quoted

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType, StructType

__all__ = ["arrow_schema", "check_columns", "combine_fingerprint", "fingerprint_aggregates",
           "flat_schema", "has_map", "per_spark", "placement_columns", "placement_id",
           "row_hash", "row_hash_of", "spark_fingerprint", "spark_key", "with_row_hash"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_MASK = (1 << 64) - 1


def arrow_schema(schema: StructType, *, timezone: str, large_types: bool = False) -> pa.Schema:
    """The Arrow schema of the record batches ``mapInArrow`` hands tasks for ``schema``.

    Spark's JVM writes every ``TimestampType`` value, nested ones too, as
    ``timestamp[us, tz=<session time zone>]`` (``TimestampNTZType`` without a zone). PySpark's
    ``to_arrow_schema`` says so only from 4.2 on (its ``timezone`` argument); 3.5 to 4.1
    take ``timestamp_utc`` and name UTC instead, so there the zone is set afterwards. With
    ``large_types`` (``spark.sql.execution.arrow.useLargeVarTypes``) strings and binaries are
    ``large_string`` and ``large_binary``: 4.0 on say so (``prefers_large_types``); on 3.5,
    whose ``to_arrow_schema`` has no such argument, they are widened afterwards too.
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    parameters = inspect.signature(to_arrow_schema).parameters
    if "timezone" in parameters:  # pyspark >= 4.2
        return to_arrow_schema(schema, timezone=timezone, prefers_large_types=large_types)
    if "prefers_large_types" in parameters:  # pyspark 4.0 and 4.1
        converted = to_arrow_schema(schema, prefers_large_types=large_types)
        widen = False
    else:  # pyspark 3.5
        converted = to_arrow_schema(schema)
        widen = large_types
    return pa.schema([f.with_type(_as_written(f.type, timezone, widen)) for f in converted],
                     metadata=converted.metadata)


def _as_written(t: pa.DataType, timezone: str, widen: bool) -> pa.DataType:
    """``t`` with every zoned timestamp in it, at any depth, in ``timezone``, and with
    ``widen`` every string and binary large."""
    if pa.types.is_timestamp(t):
        return pa.timestamp(t.unit, tz=timezone) if t.tz is not None else t
    if widen and pa.types.is_string(t):
        return pa.large_string()
    if widen and pa.types.is_binary(t):
        return pa.large_binary()

    def inner(f: pa.Field) -> pa.Field:
        return f.with_type(_as_written(f.type, timezone, widen))

    if pa.types.is_map(t):
        return pa.map_(inner(t.key_field), inner(t.item_field), keys_sorted=t.keys_sorted)
    if pa.types.is_large_list(t):
        return pa.large_list(inner(t.value_field))
    if pa.types.is_list(t):
        return pa.list_(inner(t.value_field))
    if pa.types.is_struct(t):
        return pa.struct([inner(f) for f in t])
    return t


def has_map(t: DataType) -> bool:
    """Whether a Spark type is or holds a map (which ``xxhash64`` and sorting refuse)."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(t, MapType):
        return True
    if isinstance(t, ArrayType):
        return has_map(t.elementType)
    if isinstance(t, StructType):
        return any(has_map(f.dataType) for f in t.fields)
    return False


def flat_schema(schema: StructType) -> bool:
    """Whether every column is of an atomic type (numbers, strings, binary, dates,
    timestamps, decimals, booleans, nulls) or an array of one: what tasks hash without the
    JVM's help (numpy, :mod:`connectors.core.fingerprint`)."""
    from pyspark.sql.types import ArrayType, AtomicType, NullType

    def flat(t: object) -> bool:
        return isinstance(t, (AtomicType, NullType)) or (
            isinstance(t, ArrayType) and isinstance(t.elementType, (AtomicType, NullType)))

    return all(flat(f.dataType) for f in schema.fields)


def check_columns(df: DataFrame) -> None:
    """Refuse what no sink can write unambiguously: the reserved row-hash column name, and
    two columns whose names differ only in case (Spark's resolution is case-insensitive)."""
    fields = df.schema.fields
    if any(f.name == ROW_HASH_COLUMN for f in fields):
        raise BadInputError(f"the column name {ROW_HASH_COLUMN!r} is reserved: rename it")
    names = [f.name.lower() for f in fields]
    twice = sorted({f.name for f in fields if names.count(f.name.lower()) > 1})
    if twice:
        raise BadInputError(
            f"the batch has several columns named {', '.join(twice)} (after a join?): give "
            "every column its own name, e.g. with select(a.id.alias('a_id'), ...)")


def row_hash(df: DataFrame) -> Column:
    """Every row's 64-bit hash: ``xxhash64`` of its columns in order, seeded by their count
    (so that an added all-null column changes it); maps as JSON (deterministic for the same
    map; ``xxhash64`` refuses maps)."""
    from pyspark.sql import functions as F  # noqa: N812

    check_columns(df)
    fields = df.schema.fields
    cols = [F.to_json(F.col(quoted(f.name))) if has_map(f.dataType) else F.col(quoted(f.name))
            for f in fields]
    return F.xxhash64(F.lit(len(cols)), *cols)


#: What is built once per Spark (:func:`per_spark`), chiefly Spark Columns (unresolved
#: expressions, valid for any DataFrame whose columns they name): building one takes a py4j
#: call per function and literal in classic PySpark (a row hash some 15, ~13 ms per
#: micro-batch; the slot placement of a 100-record Kafka batch ~140, ~20 ms).
_PER_SPARK: dict[tuple[object, ...], tuple[object, Any]] = {}
_PER_SPARK_MAX = 256


def spark_key(spark: Any) -> tuple[tuple[object, ...], object]:
    """Which Spark is behind ``spark``, and the object that identifies it: its SparkContext
    in classic PySpark (``foreachBatch`` hands every batch a new Python ``SparkSession``
    over the same JVM), the session id under Spark Connect (no object: ``None``)."""
    session_id = getattr(spark, "session_id", None)
    if isinstance(session_id, str):  # Spark Connect
        return ("connect", session_id), None
    owner = spark.sparkContext
    return ("classic", id(owner)), owner


def per_spark(spark: Any, key: tuple[object, ...], build: Callable[[], T]) -> T:
    """``build()``, kept by ``key`` for the Spark behind ``spark`` (:func:`spark_key`); the
    entry keeps a classic SparkContext alive, so a later context never takes its id's
    entries."""
    which, owner = spark_key(spark)
    full = (*which, *key)
    hit = _PER_SPARK.get(full)
    if hit is not None and hit[0] is owner:
        return cast("T", hit[1])
    value = build()
    if len(_PER_SPARK) >= _PER_SPARK_MAX:
        _PER_SPARK.clear()
    _PER_SPARK[full] = (owner, value)
    return value


def with_row_hash(df: DataFrame) -> DataFrame:
    """``df`` with :func:`row_hash` as its last column, named ``ROW_HASH_COLUMN``."""
    return df.withColumn(ROW_HASH_COLUMN, row_hash_of(df))


def row_hash_of(df: DataFrame) -> Column:
    """:func:`row_hash` for ``df``'s schema, built once per Spark and schema."""
    return per_spark(df.sparkSession, ("row_hash", df.schema.json()), lambda: row_hash(df))


def placement_columns(spark: Any, content: list[str] | None,
                      key: str | None, row_hash: Column | None = None) -> list[Column]:
    """What places rows into slots (``repartition(slots, *these)``): ``content`` names the
    columns whose hash places a row (``None``: the row hash :data:`ROW_HASH_COLUMN`,
    itself the placement); with a ``key`` column, rows whose key is not null are placed by
    the key's ``xxhash64`` instead. Built once per Spark (:func:`per_spark`): the
    same list for the same arguments, which callers must not change. ``row_hash``: the
    row hash's expression in place of the column (for a projection that adds both; not
    kept: the caller keeps what it builds of it)."""
    from pyspark.sql import functions as F  # noqa: N812

    def build() -> list[Column]:
        hashed = F.col(ROW_HASH_COLUMN) if row_hash is None else row_hash
        if key is None:
            if content is None:
                return [hashed]
            return [F.col(quoted(c)) for c in content]
        by_content = hashed if content is None else F.hash(*[F.col(quoted(c)) for c in content])
        k = F.col(quoted(key))
        return [F.when(k.isNull(), by_content).otherwise(F.xxhash64(k))]

    return build() if row_hash is not None else per_spark(spark, placement_id(content, key),
                                                          build)


def placement_id(content: list[str] | None, key: str | None) -> tuple[object, ...]:
    """What identifies :func:`placement_columns`' placement, for caches of columns built
    on it."""
    return ("placement", None if content is None else tuple(content), key)


def fingerprint_aggregates(df: DataFrame) -> list[Column]:
    """``rows``, ``hi`` and ``lo``: the aggregates :func:`spark_fingerprint` combines."""
    from pyspark.sql import functions as F  # noqa: N812

    h = row_hash(df)
    return [
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.shiftright(h, 32)).alias("hi"),
        F.sum(h.bitwiseAND(F.lit(0xFFFFFFFF))).alias("lo"),
    ]


def combine_fingerprint(rows: Any, hi: Any, lo: Any) -> Fingerprint:
    """The fingerprint from the aggregates: ``(hi << 32) + lo`` is the sum of the hashes."""
    digest = ((int(hi or 0) << 32) + int(lo or 0)) & _MASK
    return Fingerprint(int(rows or 0), digest)


def spark_fingerprint(df: DataFrame) -> Fingerprint:
    """The fingerprint of ``df`` as one aggregation job; equal to the sum of what the tasks
    compute from :data:`ROW_HASH_COLUMN` for the same rows."""
    row = df.agg(*fingerprint_aggregates(df)).first()
    if row is None:  # pragma: no cover - a global aggregate always has one row
        return Fingerprint()
    return combine_fingerprint(row["rows"], row["hi"], row["lo"])
