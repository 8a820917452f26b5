"""What the sinks that work on a Spark DataFrame themselves use from the engine adapter.

Most sinks never touch Spark: the adapter (:class:`~connectors.spark.frames.SparkBatch`)
runs their tasks. Some work on the batch's DataFrame on the driver too: Delta Lake's
writer (its appends, overwrites and MERGEs are Spark jobs, its replay check reads the
table with Spark) and Kafka's record checks and Arrow hand-over. They use the adapter's
helpers through this module, the one public door to them (the helpers live in the
adapter's private modules, which no other package imports):

- :func:`is_connect`: whether a DataFrame, session or query comes from Spark Connect;
- :func:`quoted`: a column name quoted so that it means only itself;
- :func:`has_map`: whether a Spark type is or holds a map;
- the rows' fingerprints as Spark computes them: :func:`spark_fingerprint` (one
  aggregation job), or :func:`fingerprint_aggregates` and :func:`combine_fingerprint`
  to compute them inside another aggregation, or :func:`observe` (an :class:`Observed`
  DataFrame: the fingerprint computed inside the job that writes it);
- the Arrow hand-over of rows whose size the sink bounds: :class:`Handover`,
  :data:`ROW_BOUND_MARK` (the mark of a row over the bound), :func:`handover_budget` and
  :func:`handover_rows`;
- :func:`error_facts`: what a Spark error says about itself (an :class:`ErrorFacts`: its
  error conditions, their message parameters, the Java classes of its cause chain), read
  without its message text, which may quote rows;
- :func:`require_spark`: the guard a Spark sink's constructor calls (a usable pyspark, or
  an error naming the supported range and how to get it);
- :func:`delta_python_from_jars`: Delta Lake's Python API from Delta's jar, when no
  delta-spark is installed (``connectors.spark._pyapi``);
- :func:`iceberg_runtime`: the Iceberg release whose Spark runtime jar the resolver takes
  for a Spark version, or a :class:`~connectors.core.errors.ConfigurationError` naming
  the Spark versions that have one.

Importing it imports no pyspark (each helper imports what it needs when called).

Example::

    >>> quoted("a.b")
    '`a.b`'
"""

from __future__ import annotations

from connectors.spark._binding import is_connect
from connectors.spark._error_facts import ErrorFacts, error_facts
from connectors.spark._handover import ROW_BOUND_MARK, Handover, handover_budget, handover_rows
from connectors.spark._names import quoted
from connectors.spark._observed import Observed, observe
from connectors.spark._pyapi import delta_python_from_jars
from connectors.spark._require import require_spark
from connectors.spark._rows import (
    combine_fingerprint,
    fingerprint_aggregates,
    has_map,
    spark_fingerprint,
)


def iceberg_runtime(spark_version: str) -> str:
    """The Iceberg release for ``spark_version`` (``connectors.spark.jars``' table)."""
    from connectors.spark.jars import iceberg_version

    return iceberg_version(spark_version)


__all__ = [
    "ROW_BOUND_MARK",
    "ErrorFacts",
    "Handover",
    "Observed",
    "combine_fingerprint",
    "delta_python_from_jars",
    "error_facts",
    "fingerprint_aggregates",
    "handover_budget",
    "handover_rows",
    "has_map",
    "iceberg_runtime",
    "is_connect",
    "observe",
    "quoted",
    "require_spark",
    "spark_fingerprint",
]
