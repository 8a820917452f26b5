"""Class-data sharing for the tests' Spark driver JVMs: one AppCDS archive, built once per
test run, mapped by every driver the tests start.

A driver JVM spends seconds of its start loading and verifying Spark's classes from
``pyspark/jars``. JDK 13+ can dump the classes a JVM loaded into an archive when it exits
(``-XX:ArchiveClassesAtExit``, a dynamic AppCDS archive: JEP 350) and map them at the next
start (``-XX:SharedArchiveFile``). The JVM itself checks that an archive fits (the same JDK
build, the same class path prefix and flags) and ignores one that does not, so a stale
archive costs only its benefit, never a wrong class. Classes that Spark loads later from
``spark.jars`` (Delta, Kafka) go through its own class loader and are not archived; Spark's
core is.

Measured on the 2-core CI machine (2026-11-28, pyspark 4.2.0, OpenJDK 17, beside a CI run:
4 interleaved pairs), a driver process from its start to a session and a first query done:
15.5-17.2 s (median 15.9) without the archive, 8.8-13.8 s (median 9.7) with it: -39 %.

``python -m integration.support._cds DIR`` builds it, once per pyspark, JDK and interpreter:
a driver starts a session with the tests' flags, runs a batch query and a micro-batch of a
streaming query (the classes every test driver loads), and exits; its JVM writes the
archive. ``scripts/test`` runs it and sets
``EOS_CDS_ARCHIVE``; ``integration/conftest.py`` then adds the archive to the drivers' flags.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: The flags of every test driver JVM (integration/conftest.py): C1 only, the serial GC.
BASE_FLAGS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: Where scripts/test says the archive is.
ENV_ARCHIVE = "EOS_CDS_ARCHIVE"

_WARM_UP = """
import sys, tempfile
from connectors.spark import get_session
spark = get_session("cds-archive", master="local[2]", components=["delta", "kafka"],
                    conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"})
spark.range(1000).selectExpr("id % 7 AS k", "id").groupBy("k").count().collect()
with tempfile.TemporaryDirectory() as d:
    q = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 10).load()
         .writeStream.foreachBatch(lambda df, i: df.count())
         .option("checkpointLocation", d + "/ckpt").trigger(availableNow=True).start())
    q.awaitTermination()
spark.stop()
"""


def driver_flags(archive: str | None = None) -> str:
    """The test drivers' JVM flags: :data:`BASE_FLAGS`, plus the archive when it exists
    (``archive`` or ``$EOS_CDS_ARCHIVE``). ``-Xshare:auto`` (the default): a JVM that
    cannot map it starts without it."""
    path = archive if archive is not None else os.environ.get(ENV_ARCHIVE, "")
    if path and Path(path).is_file():
        path = str(Path(path).resolve())  # a driver may run in another directory
        return f"{BASE_FLAGS} -XX:SharedArchiveFile={path} -Xlog:cds=off -Xlog:cds+dynamic=off"
    return BASE_FLAGS


def build(archive: Path, timeout: float = 300.0) -> float:
    """Write ``archive`` (atomically: a temporary file renamed); returns the seconds it took.
    Raises RuntimeError with the driver's output when no archive came out."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=archive.parent) as tmp:
        part = Path(tmp) / archive.name
        flags = f"{BASE_FLAGS} -XX:ArchiveClassesAtExit={part} -Xlog:cds=off -Xlog:cds+dynamic=off"
        env = dict(os.environ, PYSPARK_SUBMIT_ARGS=f'--driver-java-options "{flags}" pyspark-shell',
                   PYSPARK_PYTHON=sys.executable)
        env.pop(ENV_ARCHIVE, None)
        proc = subprocess.run([sys.executable, "-c", _WARM_UP], env=env, capture_output=True,
                              text=True, timeout=timeout, check=False)
        # The JVM writes the archive as it exits, after the Python driver has returned.
        deadline = time.monotonic() + 30
        while not (part.is_file() and part.stat().st_size > 0) and time.monotonic() < deadline:
            time.sleep(0.2)
        if proc.returncode != 0 or not part.is_file():
            raise RuntimeError(f"no CDS archive (exit {proc.returncode}):\n"
                               f"{(proc.stdout + proc.stderr)[-4000:]}")
        time.sleep(1.0)  # the JVM closes the file as its last act
        os.replace(part, archive)
    return time.monotonic() - started


def archive_in(directory: Path) -> Path:
    """The archive's path in ``directory`` for this pyspark, JDK and interpreter (the JVM
    would refuse another JDK's archive anyway; the name keeps one of each)."""
    import hashlib

    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
    key = hashlib.sha256("\0".join([java.stderr, sys.executable, BASE_FLAGS]).encode())
    return directory / f"spark-{pyspark.__version__}-{key.hexdigest()[:12]}.jsa"


def main(argv: list[str]) -> int:
    """``python -m integration.support._cds DIR``: print the archive's path, built first
    when missing (its time on stderr)."""
    if len(argv) != 1:
        print("usage: python -m integration.support._cds DIR", file=sys.stderr)
        return 2
    archive = archive_in(Path(argv[0]).resolve())  # absolute: drivers run in other dirs too
    if not archive.is_file():
        try:
            secs = build(archive)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"cds: {exc}", file=sys.stderr)
            return 1
        print(f"cds: built {archive} ({archive.stat().st_size // 2**20} MB) in {secs:.1f} s",
              file=sys.stderr)
    print(archive)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
