"""A driver stand-in for the harness's scratch-space test: it writes a file where Spark would
keep its scratch (``$SPARK_LOCAL_DIRS``), prints that directory, then SIGKILLs itself (no
shutdown hook runs, as for a killed Spark driver)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

scratch = Path(os.environ["SPARK_LOCAL_DIRS"])
(scratch / "spark-1" / "userFiles-1").mkdir(parents=True)
(scratch / "spark-1" / "userFiles-1" / "delta-spark.jar").write_bytes(b"0" * 1024)
print(f"SCRATCH {scratch}", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
