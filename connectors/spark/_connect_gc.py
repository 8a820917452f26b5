"""Spark Connect's finalizers run between batches, never inside another RPC.

A batch's DataFrame in a Connect ``foreachBatch`` worker is a ``CachedRemoteRelation``,
whose ``__del__`` (pyspark 4.0 and 4.1) releases it on the server with a blocking RPC of
its own. When that DataFrame is freed by Python's cyclic garbage collector, the collection
(and so that RPC) runs wherever an allocation triggers it, also inside another RPC of the
same client, and the worker can hang there for good: seen here on pyspark 4.1.4 (an
IcebergSink's third batch stuck in ``DataFrame.columns`` with a collection in progress;
SPARK-58846 bounds that call with a deadline, later). :func:`collect_between_batches`
runs the collection when a batch reaches a sink, before any RPC of the batch: the earlier
batches' frames are released there, where nothing else is in flight.
"""

from __future__ import annotations

import gc
from typing import Any

from connectors.spark._binding import is_connect

__all__ = ["collect_between_batches"]


def collect_between_batches(df: Any) -> None:
    """Under Spark Connect: a full garbage collection now (a few milliseconds per batch),
    so that the finalizers of earlier batches' frames run here and not inside an RPC."""
    if is_connect(df):
        gc.collect()
