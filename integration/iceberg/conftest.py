"""The Iceberg tests run where Iceberg publishes a Spark runtime (CI: the spark41 lane, which
names this directory). On another Spark (the test lane's 4.2) they are not collected at all,
never skipped: IcebergSink refuses that Spark, which ``tests/iceberg`` proves."""

from __future__ import annotations

import pyspark

from connectors.core.errors import ConfigurationError
from connectors.spark.toolkit import iceberg_runtime

try:
    iceberg_runtime(pyspark.__version__)
    collect_ignore_glob: list[str] = []
except ConfigurationError:
    collect_ignore_glob = ["test_*.py"]
