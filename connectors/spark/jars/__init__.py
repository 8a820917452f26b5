"""The jar resolver: the jars for Delta Lake, Kafka and S3, and a session that uses them.

The pip-installed ``pyspark`` ships Spark's own jars but neither Delta Lake nor the Kafka
source/sink nor the ``s3a://`` file system. :func:`resolve_jars` fetches those once with
Maven into a local cache and returns explicit jar paths for ``spark.jars``;
:func:`session_builder` and :func:`get_session` build a small-machine session with them::

    from connectors.spark import get_session     # or: from connectors.spark.jars import ...

    spark = get_session("my-app")                        # local[2], Delta + Kafka
    spark.range(3).write.format("delta").save("/tmp/t")

``"s3"`` (hadoop-aws and the AWS SDK bundle, 650 MB and more) is only fetched when named:
``get_session("my-app", components=["delta", "s3"], conf={"spark.hadoop.fs.s3a...": ...})``.

Why not ``spark.jars.packages`` (Spark's Ivy resolver, which ``delta``'s own
``configure_spark_with_delta_pip`` uses)? It resolves on every JVM start, it puts the
whole transitive closure on the classpath, including older copies of jars that pyspark
already ships (Hadoop, Jackson, Parquet, Scala, SLF4J, ...), and one missing artifact fails
the session start; two processes resolving into one Ivy directory at once fail too. Here
the closure is resolved once, pruned of everything pyspark already has, and cached
(docs/spark-jars.md has the measurements).

Cache layout, under ``$EOS_CACHE_DIR`` (default ``~/.cache/connectors``)::

    jars/
      .resolve.lock                      fcntl lock held while Maven runs
      .maven-repo/                       Maven's local repository, private to this cache
      delta-4.4.1-spark4.2.0_2.13/       one directory per component and version
        delta-spark_4.2_2.13-4.4.0.jar
        ...
        .complete.json                   completion stamp: the jars and what was resolved

A directory is published by an atomic rename with its stamp already inside, so a reader
never sees a half-written one; when the stamp is there no Maven process is started.

Maven is ``mvn`` on ``PATH`` (or ``$EOS_MVN``); the repository is Maven's default central
unless ``$EOS_MAVEN_REPO`` names another one. When an exact artifact is not published (a
pip release of delta-spark that has no Maven twin yet, or a mirror that lags), the newest
older release of the same line is used instead and a warning says so; the stamp records it.
A Delta jar is replaced only within its minor version (4.4.1 by 4.4.0); anything further is
refused with a ConfigurationError that names the fix. Each :func:`resolve_jars` call (so
each session start) prints one line per component to stderr: what is on the class path,
and "substituted X for Y" when a substitution happened; :func:`jar_report` (used by
``connectors doctor``) tells the same from the cache alone.

The public names load on first use from private modules, one role each: ``_components``
(what a component needs: versions, coordinates), ``_releases`` (which release instead, and
the refusals), ``_maven`` (the POM and the ``mvn`` run), ``_cache`` (stamps, lock,
publishing), ``_resolve`` (:func:`resolve_jars`, :func:`jar_report`) and ``_session`` (the
builder, :func:`get_session`, :func:`check_components`: a thin helper that only builds a
SparkSession with the resolved jars, so it lives with them; the engine adapter in
:mod:`connectors.spark` never builds a session) and ``_submit`` (:func:`spark_conf`,
:func:`configure`, :func:`submit_args`: the components' jars and settings for a session or
a ``spark-submit`` line of yours, on your cluster, without touching its master).
:mod:`connectors.spark` re-exports them (but :func:`is_secret_conf`: whether a Spark conf
key names a secret, which the session builder masks in what it prints and ``connectors demo
--conf`` refuses; and :func:`submit_line`, which ``connectors submit-args`` prints).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from connectors.spark._require import require_spark

if TYPE_CHECKING:
    from connectors.spark.jars._components import COMPONENTS as COMPONENTS
    from connectors.spark.jars._components import DEFAULT_COMPONENTS as DEFAULT_COMPONENTS
    from connectors.spark.jars._components import iceberg_version as iceberg_version
    from connectors.spark.jars._components import unavailable as unavailable
    from connectors.spark.jars._resolve import JarChoice, jar_report, resolve_jars
    from connectors.spark.jars._session import (
        check_components,
        get_session,
        is_secret_conf,
        session_builder,
    )
    from connectors.spark.jars._submit import configure, spark_conf, submit_args, submit_line

__all__ = ["JarChoice", "check_components", "configure", "get_session", "is_secret_conf",
           "jar_report", "resolve_jars", "session_builder", "spark_conf", "submit_args",
           "submit_line"]

#: Public name -> the private module that holds it. Imported on first use, so that
#: ``import connectors.spark.jars`` neither imports pyspark nor runs anything.
HOMES = {
    "COMPONENTS": "_components",
    "DEFAULT_COMPONENTS": "_components",
    "iceberg_version": "_components",  # not in __all__: IcebergSink asks it (toolkit)
    "unavailable": "_components",  # not in __all__: connectors doctor asks it
    "JarChoice": "_resolve",
    "jar_report": "_resolve",
    "resolve_jars": "_resolve",
    "check_components": "_session",
    "get_session": "_session",
    "session_builder": "_session",
    "is_secret_conf": "_session",
    "configure": "_submit",
    "spark_conf": "_submit",
    "submit_args": "_submit",
    "submit_line": "_submit",
}


def __getattr__(name: str) -> Any:
    home = HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    require_spark(f"connectors.spark.jars.{name}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *HOMES})
