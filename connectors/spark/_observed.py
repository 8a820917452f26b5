"""The batch fingerprint, computed by Spark inside a sink's write job (no extra job).

Used by the sinks whose driver writes the batch with Spark (DeltaSink, IcebergSink),
through :mod:`connectors.spark.toolkit`.

The template's default fingerprint runs one more Spark job over every batch (Python
workers hash the Arrow rows), which costs far more than the 3 % budget of this sink.
Here the same idea (row count + order-independent sum of 64-bit row hashes, modulo
2**64) is computed by the JVM while the batch is written: ``DataFrame.observe`` attaches
``count(*)``, ``sum(xxhash64(row) >> 32)`` and ``sum(xxhash64(row) & 0xffffffff)`` to the
write's own plan (two 32-bit halves, so the ``long`` sums cannot overflow under ANSI mode
below 2**31 rows per batch). The digest is ``(hi << 32) + lo`` modulo 2**64, i.e. the sum
of the row hashes. On a replay, :func:`fingerprint_now` runs the same aggregation as one
job and the results compare exactly.

The hash and the aggregation are the adapter's (:mod:`connectors.spark._rows`), so the
digest equals what :meth:`~connectors.spark.frames.SparkBatch.fingerprint` and the
tasks of the other sinks compute for the same rows.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from connectors.core.fingerprint import Fingerprint
from connectors.spark._rows import (
    combine_fingerprint,
    fingerprint_aggregates,
    spark_fingerprint,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["Observed", "fingerprint_now", "observe"]

logger = logging.getLogger(__name__)

#: How long to wait, after the write returned, for Spark to deliver the observed metrics
#: (they arrive as the write's query execution ends; normally already there). If Delta
#: skipped the write (the txn version was already committed), they never come.
OBSERVATION_WAIT_S = 5.0


def _aggregates(df: DataFrame) -> list[Column]:
    return fingerprint_aggregates(df)


def _combine(rows: Any, hi: Any, lo: Any) -> Fingerprint:
    return combine_fingerprint(rows, hi, lo)


class Observed:
    """A DataFrame with the fingerprint attached, and the metrics once the write ran."""

    def __init__(self, df: DataFrame, name: str) -> None:
        from pyspark.sql import Observation

        self._observation = Observation(name)
        self._source = df
        self.df = df.observe(self._observation, *_aggregates(df))

    def result(self, wait_s: float = OBSERVATION_WAIT_S) -> Fingerprint | None:
        """The fingerprint of what the write read, or ``None`` if it did not run.

        Never blocks longer than ``wait_s`` (``Observation.get`` alone would wait forever
        for a write that Delta skipped). Spark 3.5's Observation has no future to wait on
        with a bound: there the fingerprint is computed as one job of its own
        (:func:`fingerprint_now`, what the template's default does for every batch).
        """
        jo = getattr(self._observation, "_jo", None)
        if jo is None:
            return None
        try:
            future = jo.future()
        except Exception as exc:  # Spark 3.5: no future (its get() has no timeout)
            logger.debug("no bounded wait for the observed fingerprint (%s): one job", exc)
            return fingerprint_now(self._source)
        deadline = time.monotonic() + wait_s
        try:
            while not future.isCompleted():
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.01)
            metrics = self._observation.get
        except Exception as exc:  # no future (another Spark build): no fingerprint
            logger.debug("observed fingerprint unavailable: %s", exc)
            return None
        return _combine(metrics.get("rows"), metrics.get("hi"), metrics.get("lo"))


def observe(df: DataFrame, name: str) -> Observed:
    """Attach the fingerprint aggregates to ``df`` (see the module docstring)."""
    return Observed(df, name)


def fingerprint_now(df: DataFrame) -> Fingerprint:
    """The same fingerprint as :class:`Observed`, as one job (used on replays only)."""
    return spark_fingerprint(df)
