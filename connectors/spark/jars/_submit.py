"""Your session, your cluster: the components' jars and settings, and nothing else.

:func:`get_session` builds a small local session (``local[2]`` and small-machine tuning).
On a cluster the master, the resources and the deploy mode are yours, so these helpers add
only what the components need:

- :func:`spark_conf`: the settings, as a dict: the jars (``spark.jars``, the resolved,
  pruned closure as local paths; or ``spark.jars.packages``, Maven coordinates that the
  cluster's Spark resolves with Ivy) and, with ``"delta"``, Delta's SQL extension and
  catalog;
- :func:`configure`: the same, set on a ``SparkSession.Builder`` of yours;
- :func:`submit_args`: the same as ``spark-submit`` arguments (``--packages ... --conf
  ...``, or ``--jars ...``); ``connectors submit-args`` prints them.

The coordinates are those of the Spark this process runs (pyspark's version, or
``$SPARK_HOME``'s): generate the line with the Spark version your cluster runs. ``--packages``
names the coordinates actually on the class path after a substitution (a Delta release whose
Maven twin is missing): the first call resolves them once (Maven, then the cache).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from typing import TYPE_CHECKING

from connectors.spark._pyapi import delta_python_from_jars, is_delta_spark_jar
from connectors.spark.jars._components import DEFAULT_COMPONENTS, component_settings
from connectors.spark.jars._resolve import jar_report, resolve_jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["configure", "spark_conf", "submit_args", "submit_line"]


def _names(components: Iterable[str]) -> tuple[str, ...]:
    return (components,) if isinstance(components, str) else tuple(dict.fromkeys(components))


def spark_conf(components: Iterable[str] = DEFAULT_COMPONENTS, *, packages: bool = False,
               cache_dir: str | None = None) -> dict[str, str]:
    """The settings ``components`` need on a session of yours; no master, no tuning.

    ``packages=False``: ``spark.jars``, the local paths :func:`resolve_jars` returns (the
    submitting host's cache; ``spark-submit`` ships them to a cluster). ``packages=True``:
    ``spark.jars.packages``, the Maven coordinates on the class path (resolved here once, so
    that a substitution is known), for the cluster's own Ivy to fetch.

    .. example-needs: spark

    Example (``"kafka"`` only: one coordinate, at this Spark's version; the first call
    fetches the jars)::

        >>> conf = spark_conf(["kafka"], packages=True)
        >>> conf["spark.jars.packages"].startswith("org.apache.spark:spark-sql-kafka-0-10_")
        True
        >>> sorted(conf)
        ['spark.jars.packages']
    """
    return _conf_and_jars(_names(components), packages, cache_dir)[0]


def _conf_and_jars(names: tuple[str, ...], packages: bool,
                   cache_dir: str | None) -> tuple[dict[str, str], list[str]]:
    """:func:`spark_conf`'s settings and the resolved jars they came from (one resolution)."""
    conf: dict[str, str] = {}
    jars = resolve_jars(names, cache_dir=cache_dir)
    if packages:
        coords = [c for choice in jar_report(names, cache_dir=cache_dir) for c in choice.used]
        if coords:
            conf["spark.jars.packages"] = ",".join(coords)
    elif jars:
        conf["spark.jars"] = ",".join(jars)
    conf.update(component_settings(names))
    return conf, jars


def configure(builder: SparkSession.Builder, components: Iterable[str] = DEFAULT_COMPONENTS,
              *, packages: bool = False,
              cache_dir: str | None = None) -> SparkSession.Builder:
    """Set :func:`spark_conf` on ``builder`` (yours: its master and settings stay) and
    return it. With ``"delta"`` and no ``delta`` module importable (no delta-spark
    installed), Delta's jar also goes on this process's ``sys.path``: DeltaSink's Python API
    ships in it. Set ``spark.jars`` or ``spark.sql.extensions`` of your own after this call,
    joined with these values (a later ``config`` of the same key replaces it)::

        from pyspark.sql import SparkSession
        from connectors.spark import configure

        spark = configure(SparkSession.builder.appName("events"), ["delta"]).getOrCreate()
    """
    names = _names(components)
    conf, jars = _conf_and_jars(names, packages, cache_dir)
    for key, value in conf.items():
        builder = builder.config(key, value)
    if "delta" in names:  # the driver is this process: DeltaSink's `delta` module from the jar
        delta_python_from_jars(jars)
    return builder


def submit_args(components: Iterable[str] = DEFAULT_COMPONENTS, *, packages: bool = True,
                cache_dir: str | None = None) -> list[str]:
    """:func:`spark_conf` as ``spark-submit`` arguments: ``--packages`` (default) or
    ``--jars``, then a ``--conf KEY=VALUE`` for each other setting. spark-submit puts every
    ``--packages`` jar of a Python application on its ``PYTHONPATH`` (Delta's Python API
    ships in Delta's jar), but not ``--jars``: with ``--jars`` and ``"delta"``, Delta's jar
    is also given as ``--py-files``.

    .. example-needs: spark

    Example::

        >>> submit_args(["kafka"])[0]
        '--packages'
    """
    args: list[str] = []
    for key, value in spark_conf(components, packages=packages, cache_dir=cache_dir).items():
        if key == "spark.jars.packages":
            args += ["--packages", value]
        elif key == "spark.jars":
            args += ["--jars", value]
            delta = [j for j in value.split(",") if is_delta_spark_jar(j)]
            if delta:
                args += ["--py-files", ",".join(delta)]
        else:
            args += ["--conf", f"{key}={value}"]
    return args


def submit_line(components: Iterable[str] = DEFAULT_COMPONENTS, *, packages: bool = True,
                cache_dir: str | None = None) -> str:
    """:func:`submit_args` quoted for a shell, on one line."""
    return shlex.join(submit_args(components, packages=packages, cache_dir=cache_dir))
