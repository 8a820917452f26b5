"""Delta Lake's Python API (the ``delta`` module) from Delta's own jar.

DeltaSink calls ``delta.tables`` on the driver. The ``delta-spark`` pip package carries it,
but it also requires a pyspark of its own choosing, and pyspark is the user's
(``docs/design/spark-versions.md``): so the ``delta`` extra does not install it. Delta
ships the same Python files inside its Maven jar (``delta/__init__.py``, ``delta/tables.py``,
...), which is how ``spark-submit --packages io.delta:...`` users get them: spark-submit
puts every ``--packages`` jar of a Python application on its ``PYTHONPATH``. A session
started from Python with the jars in ``spark.jars`` (:func:`connectors.spark.get_session`,
:func:`connectors.spark.configure`) gets no such path, so this module adds the jar to
``sys.path`` (Python imports from a jar as from any zip file), only when no ``delta`` module
is importable: an installed delta-spark, or a platform's own (Databricks), always wins.

Example::

    >>> delta_python_from_jars(["/cache/kafka-4.2.0/spark-sql-kafka-0-10_2.13-4.2.0.jar"])
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import re
import sys
from collections.abc import Iterable

logger = logging.getLogger(__name__)

__all__ = ["delta_python_from_jars", "is_delta_spark_jar"]

#: Delta's Spark jar: ``delta-spark_2.13-4.0.0.jar``, ``delta-spark_4.2_2.13-4.4.0.jar``.
_DELTA_SPARK_JAR = re.compile(r"delta-spark_(?:\d+\.\d+_)?\d+\.\d+-[^/]+\.jar")


def is_delta_spark_jar(path: str) -> bool:
    """Whether ``path`` names Delta's Spark jar (the one that carries ``delta/*.py``)."""
    return _DELTA_SPARK_JAR.fullmatch(os.path.basename(path)) is not None


def delta_python_from_jars(jars: Iterable[str]) -> str | None:
    """When no ``delta`` module is importable, put the Delta Spark jar among ``jars`` on
    ``sys.path`` and return it; otherwise (or when ``jars`` holds none) return ``None``."""
    if importlib.util.find_spec("delta") is not None:
        return None
    for jar in jars:
        if is_delta_spark_jar(jar) and os.path.isfile(jar):
            if jar not in sys.path:
                sys.path.append(jar)
                importlib.invalidate_caches()
            logger.info("Delta Lake's Python API (no delta-spark installed) from %s", jar)
            return jar
    return None
