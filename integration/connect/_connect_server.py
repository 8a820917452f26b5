"""A separate Spark Connect server process from pip pyspark, for the Connect kill tests.

``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer`` (pip
pyspark 4 bundles the Connect server jar; the launcher needs no application jar for that
class) on a free port of 127.0.0.1, with Delta's jars and SQL extension (and the settings
``connectors.spark`` gives a local server: 2 partitions for shuffles and Delta snapshots),
the repository on the Python workers' path and this interpreter as their Python. The
foreachBatch worker is a child of the server JVM and inherits its environment: ``env`` arms
crash points there.
Clients connect with ``--master sc://127.0.0.1:<port> --connect``.

The server runs in a process group of its own: :meth:`ConnectServer.kill` SIGKILLs it (the
JVM, its foreachBatch workers and its Python workers) the way a lost host would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from integration.support._standalone import REPO, SPARK_HOME, _die_with_parent, free_port

START_TIMEOUT = 120.0
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


@dataclass
class ConnectServer:
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    handle: IO[bytes]

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def tail(self, n: int = 40) -> str:
        lines = self.log.read_text(errors="replace").splitlines()[-n:]
        return "\n".join(lines)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the server's whole process group (JVM and Python workers)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill()
        self.handle.close()


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_server(root: Path, env: Mapping[str, str] | None = None,
                 name: str = "connect") -> ConnectServer:
    """Start a Connect server under ``root``; returns once it accepts connections."""
    from connectors.spark import resolve_jars

    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    jars = ",".join(resolve_jars(["delta"]))
    environ = dict(os.environ)
    for key in ("CONNECTORS_CRASH_AT", "SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED",
                "SPARK_LOCAL_REMOTE", "PYSPARK_SUBMIT_ARGS"):
        environ.pop(key, None)
    environ.update(env or {})
    environ.update(SPARK_HOME=str(SPARK_HOME), SPARK_CONNECT_MODE="0",
                   PYSPARK_PYTHON=sys.executable,
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                            environ.get("PYTHONPATH")])))
    conf = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        # As connectors.spark gives a local server: Delta's state reconstruction in 2 tasks,
        # not 50 (a client of sc://... sends no such setting; a table's first snapshot in a
        # run cost a 50-task stage).
        "spark.databricks.delta.snapshotPartitions": "2",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        "spark.local.dir": str(root / "local"),
    }
    args = [str(SPARK_HOME / "bin" / "spark-submit"), "--class", SERVER_CLASS,
            "--name", name, "--master", "local[2]", "--jars", jars]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    log = root / f"{name}.log"
    handle = log.open("wb")
    proc = subprocess.Popen(args, cwd=root, env=environ, stdin=subprocess.DEVNULL,
                            stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    server = ConnectServer(port, proc, log, handle)
    deadline = time.monotonic() + START_TIMEOUT
    while not _listening(port):
        if not server.alive() or time.monotonic() > deadline:
            server.kill()
            handle.close()
            raise RuntimeError(f"the Connect server did not start:\n{server.tail()}")
        time.sleep(0.5)
    return server


@contextlib.contextmanager
def connect_server(root: Path, env: Mapping[str, str] | None = None) -> Iterator[ConnectServer]:
    server = start_server(root, env)
    try:
        yield server
    finally:
        server.stop()
