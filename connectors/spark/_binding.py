"""Which streaming query called the sink, and what the session offers: classic and Connect.

A sink binds to the streaming query that runs it (its id is stable across restarts of one
checkpoint; a new checkpoint is a new query), so that a checkpoint reset is refused instead
of replaying batch ids the ledger already holds. The two Spark front ends learn the id
differently:

- **classic PySpark**: Spark sets the local property ``sql.streaming.queryId`` on the
  thread that runs ``foreachBatch``; no property means a batch job.
- **Spark Connect**: ``foreachBatch`` runs in a Python worker next to the server, which
  is told a DataFrame id and the batch id only, and has no ``SparkContext``. The worker's
  session is the client's session, whose ``streams.active`` lists its queries; a query's
  name is unique among a session's active queries. So the user names the query
  (``.queryName("orders")``) and the sink (``query_name="orders"``), and the sink binds to
  the id of the active query of that name. Without a name there is no public way to tell
  which query (or a batch job) called: the call is refused with the fix, never treated as
  a batch job. ``sink.run_batch(df, run_id)`` says "batch job" explicitly.

The Connect session has no ``SparkContext`` either for the batch input's capabilities:
:func:`connect_task_slots` and :func:`connect_barrier_refusal` read the session's
configuration instead. The client's sink object is a copy that never runs, so its
``last_metrics`` stays ``None``: the worker's sink publishes each batch's metrics into the
session's configuration (:func:`publish_metrics`), which the client shares and reads with
:func:`last_metrics`. A graceful stop request travels the same way
(:func:`set_stop_flag`, :func:`stop_flag`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from typing import TYPE_CHECKING, Any

from connectors.core.engine import EngineCall
from connectors.core.errors import ConfigurationError
from connectors.spark._require import release

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["METRICS_CONF", "STOP_CONF", "classic_query_id", "connect_barrier_refusal",
           "connect_query_id", "connect_task_slots", "is_connect", "is_spark_frame", "last_metrics",
           "publish_metrics", "query_id_for", "set_stop_flag", "stop_flag"]

logger = logging.getLogger(__name__)

#: What a Connect call without a query identity is told.
NO_QUERY_NAME = (
    "under Spark Connect the sink cannot tell which streaming query called it (the "
    "foreachBatch worker is given no query id): name the query and the sink alike, "
    "df.writeStream.queryName('orders').foreachBatch(Sink(..., query_name='orders')); "
    "in a batch job call sink.run_batch(df, run_id)"
)

#: query name -> id, in this process. Under Connect one foreachBatch worker process runs
#: one run of one query, so a name found once stays that query's for the process's life.
_connect_ids: dict[tuple[str, str], str] = {}


def is_connect(obj: Any) -> bool:
    """Whether ``obj`` (a DataFrame, session or streaming query) comes from Spark Connect
    (checked without importing Connect)."""
    return type(obj).__module__.startswith("pyspark.sql.connect.")


def is_spark_frame(obj: Any) -> bool:
    """Whether ``obj`` is a Spark DataFrame, classic or Connect. pyspark 3.5's Connect
    DataFrame is no ``pyspark.sql.DataFrame`` (4.0 made both kinds subclasses of it); its
    module is loaded whenever one exists, so nothing is imported for the check."""
    from pyspark.sql import DataFrame

    if isinstance(obj, DataFrame):
        return True
    connect = sys.modules.get("pyspark.sql.connect.dataframe")
    return connect is not None and isinstance(obj, connect.DataFrame)


def query_id_for(df: DataFrame, call: EngineCall) -> str | None:
    """The id of the streaming query that called the sink with ``df``; ``None`` in a
    batch job. Raises :class:`ConfigurationError` when that cannot be known."""
    if is_connect(df):
        refuse_connect_before_4(call.sink_id)
    if call.batch_job:
        return None
    if is_connect(df):
        return connect_query_id(df, call.query_name, call.sink_id)
    return classic_query_id(df)


def refuse_connect_before_4(sink_id: str | None = None) -> None:
    """Spark Connect with pyspark 3.5: refused. Its foreachBatch worker drops the Python
    error it ends with (the query fails with ``STREAM_FAILED`` and no message), so a
    graceful stop cannot be told from a failure, and the Connect kill tests do not pass on
    3.5 (measured on 3.5.9; a plain run did write exactly once). Called where a sink meets a
    Connect DataFrame (the refusal then reaches only the server's log, for that reason) and
    by ``session_builder(connect=True)``, where the client sees it."""
    import pyspark

    version = str(pyspark.__version__)
    if release(version) < (4, 0, 0):
        raise ConfigurationError(
            f"the sinks need Spark 4.0 or newer under Spark Connect, and this is pyspark "
            f"{version}: 3.5's foreachBatch worker drops the sink's errors (a graceful stop "
            "cannot be told from a failure). On Spark 3.5 run the query in classic PySpark "
            "(a SparkSession without .remote(...)), or move to Spark 4",
            sink_id=sink_id)


def classic_query_id(df: DataFrame) -> str | None:
    """The local property ``sql.streaming.queryId`` of the calling thread (``None``: a
    batch job). A sink's ``query_name`` plays no part: Spark tells the id itself (and
    ``foreachBatch`` gets the query's cloned session, whose ``streams`` does not list it)."""
    value = df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
    return str(value) if value else None


def connect_query_id(df: DataFrame, query_name: str | None, sink_id: str = "") -> str:
    """The id of the active query named ``query_name`` in ``df``'s Connect session."""
    if not query_name:
        raise ConfigurationError(NO_QUERY_NAME, sink_id=sink_id)
    spark = df.sparkSession
    key = (str(getattr(spark, "session_id", "")), query_name)
    known = _connect_ids.get(key)
    if known is not None:
        return known
    active = [q for q in spark.streams.active if q.name == query_name]
    if not active:
        raise ConfigurationError(
            f"the sink has query_name={query_name!r} but no active streaming query of this "
            f"Spark Connect session has that name: start the query with "
            f".queryName({query_name!r}), or call sink.run_batch(df, run_id) in a batch job",
            sink_id=sink_id)
    query_id = str(active[0].id)
    _connect_ids[key] = query_id
    logger.info("sink %s bound to the streaming query %r (id %s) of its Spark Connect "
                "session", sink_id, query_name, query_id)
    return query_id


def _master_cores(master: str) -> int | None:
    """Task slots of a ``local[...]`` or ``local-cluster[...]`` master, else ``None``."""
    if master == "local":
        return 1
    found = re.fullmatch(r"local\[(\*|\d+)(?:,\s*\d+)?\]", master)
    if found:
        return (os.cpu_count() or 1) if found.group(1) == "*" else int(found.group(1))
    found = re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*\d+\]", master)
    if found:
        return int(found.group(1)) * int(found.group(2))
    return None


def connect_task_slots(spark: SparkSession) -> int | None:
    """Spark's default parallelism as a Connect session sees it.

    ``spark.default.parallelism`` when set; else the cores of a ``local``/
    ``local-cluster`` master; else the partitions of ``spark.range`` without a partition
    count, which Spark sizes by the default parallelism (one small job).
    """
    conf = spark.conf.get("spark.default.parallelism", None)
    if conf:
        return int(conf)
    cores = _master_cores(str(spark.conf.get("spark.master", "") or ""))
    if cores is not None:
        return cores
    try:
        from pyspark.sql import functions as F  # noqa: N812

        row = spark.range(0, 1 << 16).select(F.max(F.spark_partition_id())).collect()[0]
        return int(row[0]) + 1
    except Exception as exc:  # pragma: no cover - a server refusing a range query
        logger.warning("cannot learn the default parallelism of the Connect server: %s", exc)
        return None


def connect_barrier_refusal(spark: SparkSession) -> str | None:
    """Why Spark would refuse a barrier stage on this Connect session (else ``None``)."""
    if str(spark.conf.get("spark.dynamicAllocation.enabled", "false")).lower() == "true":
        return ("spark.dynamicAllocation.enabled=true, and Spark refuses barrier stages "
                "then (turn dynamic allocation off)")
    return None


#: The session setting a sink's last metrics are published under (``<prefix><sink id>``).
METRICS_CONF = "connectors.metrics."


def publish_metrics(spark: SparkSession, metrics: dict[str, object]) -> None:
    """Put a batch's metrics into ``spark``'s configuration, as JSON."""
    spark.conf.set(f"{METRICS_CONF}{metrics['sink_id']}", json.dumps(metrics))


def last_metrics(spark: SparkSession, sink_id: str) -> dict[str, object] | None:
    """The metrics of the last batch sink ``sink_id`` wrote in a Spark Connect session
    (``BatchMetrics.as_dict()``: ``batch_id``, ``outcome``, ``rows``, timings ...), read on
    the client; ``None`` before its first batch. Under Connect the sink runs in the
    foreachBatch worker, and the client's ``sink.last_metrics`` never updates."""
    value = spark.conf.get(f"{METRICS_CONF}{sink_id}", None)
    if not value:
        return None
    found: dict[str, object] = json.loads(value)
    return found


#: The session setting that carries a graceful stop request to a Connect foreachBatch worker
#: (``<prefix><query id>`` = ``"true"``): the worker's session is the client's session.
STOP_CONF = "connectors.gracefulStop."


def set_stop_flag(spark: SparkSession, query_id: str, on: bool) -> None:
    """Raise (or clear) the graceful stop request of query ``query_id`` in ``spark``'s
    configuration, where the query's Connect foreachBatch worker reads it."""
    if on:
        spark.conf.set(f"{STOP_CONF}{query_id}", "true")
    else:
        spark.conf.unset(f"{STOP_CONF}{query_id}")


def stop_flag(spark: SparkSession, query_id: str) -> bool:
    """Whether a graceful stop of ``query_id`` was requested in ``spark``'s configuration."""
    return str(spark.conf.get(f"{STOP_CONF}{query_id}", "false")).lower() == "true"
