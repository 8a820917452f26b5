"""The one guard where the package meets Spark: a usable pyspark, or an error that says
how to get one.

pyspark is the user's (``docs/design/spark-versions.md``): installing the package installs
none unless the ``spark`` extra is named, because platforms bring their own (Databricks
has ``pyspark`` importable but no pip distribution of it; a cluster image puts
``$SPARK_HOME/python`` on ``PYTHONPATH``). So the version is read from the module
(``pyspark.__version__``), never from the installed distributions' metadata.

Called where the package meets Spark: the constructors of the sinks that hold Spark
code themselves (KafkaSink, DeltaSink), the first use of :mod:`connectors.spark`'s public
names and of :mod:`connectors.spark.jars`, and the engine front end when a Spark batch
arrives (PostgresSink meets it there: the PostgreSQL package never depends on Spark).
Importing this module imports no pyspark.

Example::

    >>> import pyspark
    >>> require_spark("KafkaSink") == pyspark.__version__
    True
"""

from __future__ import annotations

import re
import sys
from functools import cache

from connectors.core.errors import DependencyError

__all__ = ["SPARK_FLOOR", "SPARK_RANGE", "SPARK_UPPER", "release", "require_spark"]

#: The oldest pyspark the package runs on (CI's oldest lane runs exactly it; the first 3.5
#: release Delta Lake 3.3 runs on) and the first it does not. ``pyproject.toml``'s ``spark``
#: extra has the same floor and stops earlier, below the first Spark minor without a Delta
#: Lake release (tests/test_spark_requirement.py holds them together). What 3.5 lacks (the
#: DataSource form) is refused where it is asked for, naming the version.
SPARK_FLOOR = "3.5.3"
SPARK_UPPER = "5"
SPARK_RANGE = f">={SPARK_FLOOR},<{SPARK_UPPER}"

_HOW = (
    "Install it with the package: pip install 'spark-exactly-once[spark]' (or a pyspark "
    f"{SPARK_RANGE} of your choice), or run where your platform provides Spark (Databricks, "
    "a cluster image: $SPARK_HOME/python and its py4j zip on PYTHONPATH, or spark-submit)"
)


def release(version: str) -> tuple[int, ...]:
    """``4.1.0.dev1`` -> ``(4, 1, 0)``: the release numbers, padded to three."""
    numbers = [int(n) for n in re.findall(r"\d+", re.split(r"[^\d.]", version, maxsplit=1)[0])]
    return tuple([*numbers, 0, 0, 0][:3])


def _python() -> tuple[int, int]:
    """This interpreter's ``(major, minor)``."""
    return sys.version_info[0], sys.version_info[1]


@cache
def require_spark(feature: str) -> str:
    """Return the importable pyspark's version, or raise :class:`DependencyError` naming
    ``feature``, the supported range and how to get a pyspark in it."""
    try:
        import pyspark
    except ImportError as exc:
        raise DependencyError(
            f"{feature} needs PySpark {SPARK_RANGE}, and no pyspark module can be imported "
            f"here ({exc}). {_HOW}."
        ) from None
    version = str(getattr(pyspark, "__version__", "") or "")
    if not version:
        raise DependencyError(
            f"{feature} needs PySpark {SPARK_RANGE}, and the pyspark module imported from "
            f"{getattr(pyspark, '__file__', '?')} declares no __version__. {_HOW}."
        )
    if not release(SPARK_FLOOR) <= release(version) < release(SPARK_UPPER):
        raise DependencyError(
            f"{feature} needs PySpark {SPARK_RANGE}, and the pyspark imported here is "
            f"{version} (from {getattr(pyspark, '__file__', '?')}). {_HOW}."
        )
    python = _python()
    if release(version) < (4, 0, 0) and python >= (3, 12):
        raise DependencyError(
            f"{feature}: pyspark {version} runs on Python 3.11 at most (Spark 3.5 imports "
            f"distutils, which Python 3.12 removed), and this is Python "
            f"{python[0]}.{python[1]}. Use Python 3.10 or 3.11 with Spark 3.5, or pyspark "
            "4.0 or newer."
        )
    return version
