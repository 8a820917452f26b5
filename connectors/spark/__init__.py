"""The Spark adapter: Spark DataFrames as the input of a batch, and the jar resolver.

Two parts:

- the engine adapter, the modules of this package: :mod:`connectors.spark.frames`
  (:class:`~connectors.spark.frames.SparkBatch`, a DataFrame as a
  :class:`~connectors.core.batch.BatchInput`, and the engine front end),
  :mod:`connectors.spark.inputs` (the Spark-only capabilities a sink asks a batch input
  for: its DataFrame, a derived input, the Arrow hand-over), and the private modules that
  do one thing each: ``_tasks`` (what runs in a task), ``_rows`` (Arrow schema, row hashes,
  fingerprints), ``_handover`` (Arrow batches sized by the sink's row bound), ``_plan``
  (adaptive execution off for narrow plans), ``_local`` (small batches' slots in the
  driver), ``_binding`` (which query called a sink; Spark Connect), ``_stop`` (graceful
  stops), ``_source`` (the DataSource form) and ``_names`` (quoted column names); no other
  package imports them: :mod:`connectors.spark.toolkit` is the sinks' door to the helpers
  they use, and this package's names below are the rest;
- the jar resolver, :mod:`connectors.spark.jars`: the jars for Delta Lake, Kafka and S3
  fetched once with Maven into a local cache, and a small-machine session that uses them::

    from connectors.spark import get_session

    spark = get_session("my-app")                        # local[2], Delta + Kafka
    spark.range(3).write.format("delta").save("/tmp/t")

The public names below load on first use (``import connectors.spark`` imports neither
pyspark nor the resolver; the first use of one checks that a pyspark in the supported range
is importable and raises :class:`~connectors.DependencyError` saying how to get one
otherwise: ``connectors.spark._require``): the resolver's (:func:`resolve_jars`, :func:`jar_report`,
:class:`JarChoice`, :func:`session_builder`, :func:`get_session`,
:func:`check_components`, and for a session or ``spark-submit`` line of your own on your
cluster :func:`spark_conf`, :func:`configure`, :func:`submit_args`; documented in
:mod:`connectors.spark.jars`),
:func:`last_metrics` (under Spark Connect, a sink's last metrics read on the client), and
the Spark side of the API that :mod:`connectors` exports (the same objects):
:func:`register` (the DataSource form) and the graceful stop (:func:`stop_gracefully`,
:func:`stop_on_sigterm`, :func:`await_termination`, :class:`StopReport`) and the stop
with a savepoint (:func:`stop_with_savepoint`, :class:`SavepointStop`). What the sinks
that work on a DataFrame themselves use from the adapter is :mod:`connectors.spark.toolkit`.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from connectors.spark._require import require_spark

if TYPE_CHECKING:
    from connectors.spark._binding import last_metrics
    from connectors.spark._source import register
    from connectors.spark._stop import (
        StopReport,
        await_termination,
        stop_gracefully,
        stop_on_sigterm,
    )
    from connectors.spark._stop_savepoint import SavepointStop, stop_with_savepoint
    from connectors.spark.jars import COMPONENTS as COMPONENTS
    from connectors.spark.jars import DEFAULT_COMPONENTS as DEFAULT_COMPONENTS
    from connectors.spark.jars import (
        JarChoice,
        check_components,
        configure,
        get_session,
        jar_report,
        resolve_jars,
        session_builder,
        spark_conf,
        submit_args,
    )

__all__ = ["JarChoice", "SavepointStop", "StopReport", "await_termination", "check_components",
           "configure", "get_session", "jar_report", "last_metrics", "register",
           "resolve_jars", "session_builder", "spark_conf", "stop_gracefully",
           "stop_on_sigterm", "stop_with_savepoint", "submit_args"]

logger = logging.getLogger(__name__)

# Public name -> the private module that holds it. Imported on first use, so that
# ``import connectors.spark`` (and ``connectors.spark.frames``) does not load the resolver.
_HOMES = {
    "COMPONENTS": "jars._components",
    "DEFAULT_COMPONENTS": "jars._components",
    "JarChoice": "jars._resolve",
    "jar_report": "jars._resolve",
    "resolve_jars": "jars._resolve",
    "check_components": "jars._session",
    "get_session": "jars._session",
    "session_builder": "jars._session",
    "configure": "jars._submit",
    "spark_conf": "jars._submit",
    "submit_args": "jars._submit",
    "last_metrics": "_binding",
    "register": "_source",
    "StopReport": "_stop",
    "await_termination": "_stop",
    "stop_gracefully": "_stop",
    "stop_on_sigterm": "_stop",
    "SavepointStop": "_stop_savepoint",
    "stop_with_savepoint": "_stop_savepoint",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    require_spark(f"connectors.spark.{name}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
