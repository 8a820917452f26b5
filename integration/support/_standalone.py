"""A throw-away Spark standalone cluster from pip pyspark, for tests that need real hosts.

Spark never speculates in local mode, and on ``local-cluster`` every executor has the same
host, where ``TaskSetManager`` never launches a speculative copy. This module starts a
master on 127.0.0.1 and workers on *other* loopback addresses (127.0.0.2, 127.0.0.3, ...),
each with its own executor host, from pyspark's ``bin/spark-class``::

    with standalone_cluster(tmp_path) as cluster:
        run_driver(["--master", cluster.master_url, *cluster.driver_conf()], ...)

Everything (work dirs, executor logs, local dirs, daemon logs) lives under the given
directory; on exit every JVM it started is stopped (SIGTERM, then SIGKILL of its process
group, which holds its executors too).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pyspark

REPO = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).resolve().parent
START_TIMEOUT = 90.0  # master up and every worker registered (JVM start on a loaded box)
STOP_TIMEOUT = 15.0  # SIGTERM to SIGKILL
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class ClusterError(RuntimeError):
    """The cluster did not come up; the message holds the daemons' last log lines."""


@dataclass
class _Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    handle: IO[bytes]

    def tail(self, n: int = 30) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()[-n:]
        except OSError:
            lines = []
        state = "running" if self.proc.poll() is None else f"exited {self.proc.returncode}"
        return f"--- {self.name} (pid {self.proc.pid}, {state}), {self.log}:\n" + "\n".join(lines)


@dataclass
class StandaloneCluster:
    """A running cluster: where it is and what a client-mode driver must set."""

    master_url: str
    web_url: str
    root: Path
    worker_hosts: tuple[str, ...]
    executor_memory: str
    daemons: list[_Daemon] = field(default_factory=list, repr=False)

    @property
    def work_dir(self) -> Path:
        """Workers' work dirs: ``<host>/app-*/<executor>/stderr`` holds executor logs."""
        return self.root / "work"

    def state(self) -> dict[str, Any]:
        """The master's JSON status (``/json/``)."""
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as resp:
            data: dict[str, Any] = json.load(resp)
        return data

    def driver_conf(self, *, pythonpath: Path = REPO) -> list[str]:
        """``--conf k=v`` arguments for a client-mode driver on this cluster.

        Executors inherit the *workers'* environment, not the driver's: what the Python
        workers need (``PYTHONPATH`` for this repository, any ``CONNECTORS_*`` variable)
        must go through ``spark.executorEnv.*``; see :func:`executor_env_conf`. Their
        interpreter is the driver's ``PYSPARK_PYTHON`` (sent with every Python function;
        ``run_driver`` sets it to ``sys.executable``), not ``spark.executorEnv``'s.
        """
        cores = len(self.worker_hosts)
        conf = {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            # The driver's scratch dirs too (executors use the workers' SPARK_LOCAL_DIRS).
            "spark.local.dir": str(self.root / "driver-local"),
            "spark.executor.memory": self.executor_memory,
            "spark.executor.cores": "1",
            "spark.cores.max": str(cores),
            # Schedule nothing until every worker's executor is registered: a batch run on
            # one executor alone could never speculate.
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s",
            "spark.executorEnv.PYTHONPATH": str(pythonpath),
        }
        return conf_args(conf)

    def app_processes(self) -> list[str]:
        """Live processes of applications: executors and their Python workers.

        Empty once every application ended and its stragglers are gone (a worker kills an
        ended application's executors, and pyspark's daemon its Python workers).
        """
        daemons = {str(d.proc.pid) for d in self.daemons}
        return [p for p in processes_under(self.root) if p.split(":", 1)[0] not in daemons]

    def wait_apps_gone(self, timeout: float = 60.0) -> None:
        """Wait until :meth:`app_processes` is empty; raise :class:`ClusterError` if not."""
        deadline = time.monotonic() + timeout
        while (left := self.app_processes()) and time.monotonic() < deadline:
            time.sleep(0.25)
        if left:
            raise ClusterError(
                f"application processes still alive after {timeout:.0f} s:\n" + "\n".join(left)
            )

    def executor_logs(self, n: int = 40) -> str:
        """The last lines of every executor's stderr (for assertion messages)."""
        parts = []
        for path in sorted(self.work_dir.glob("*/app-*/*/stderr")):
            lines = path.read_text(errors="replace").splitlines()[-n:]
            parts.append(f"--- {path}:\n" + "\n".join(lines))
        return "\n".join(parts)


def conf_args(conf: dict[str, str]) -> list[str]:
    """``{"k": "v"}`` -> ``["--conf", "k=v"]`` (the driver program's syntax)."""
    args: list[str] = []
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return args


def executor_env_conf(**env: str) -> list[str]:
    """``--conf spark.executorEnv.K=V`` for each variable (values may hold ``=`` and ``:``)."""
    return conf_args({f"spark.executorEnv.{k}": v for k, v in env.items()})


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the child: SIGTERM when the test process dies, even by SIGKILL (Linux).

    ``spark-class`` ``exec``s the JVM, which keeps this setting; a worker's executors are
    stopped by the worker's own SIGTERM handling.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _start(name: str, args: list[str], env: dict[str, str], logs: Path) -> _Daemon:
    log = logs / f"{name}.log"
    handle = log.open("wb")
    proc = subprocess.Popen(
        [str(SPARK_HOME / "bin" / "spark-class"), *args],
        cwd=logs,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=handle,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the worker's executors too
        preexec_fn=_die_with_parent if sys.platform == "linux" else None,
    )
    return _Daemon(name, proc, log, handle)


def _stop(daemons: list[_Daemon]) -> None:
    """SIGTERM every process group (workers first), then SIGKILL what is left."""
    for daemon in reversed(daemons):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(daemon.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    for daemon in reversed(daemons):
        while time.monotonic() < deadline and _group_alive(daemon.proc.pid):
            daemon.proc.poll()
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(daemon.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            daemon.proc.wait(timeout=STOP_TIMEOUT)
        daemon.handle.close()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    # The leader may be a zombie (not yet waited for) while nothing else is left.
    return _members(pgid) > 0


def _members(pgid: int) -> int:
    """Live (non-zombie) processes of a process group, from /proc."""
    count = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                count += 1
    return count


def _wait_for(
    what: str, check: Any, daemons: list[_Daemon], timeout: float = START_TIMEOUT
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        dead = [d for d in daemons if d.proc.poll() is not None]
        if dead:
            alive = [d for d in daemons if d not in dead]
            raise ClusterError(
                f"{what}: {', '.join(d.name for d in dead)} exited\n"
                + "\n".join([*(d.tail() for d in dead), *(d.tail(10) for d in alive)])
            )
        time.sleep(0.25)
    raise ClusterError(
        f"{what}: not after {timeout:.0f} s\n" + "\n".join(d.tail() for d in daemons)
    )


@contextlib.contextmanager
def standalone_cluster(
    root: Path,
    *,
    workers: int = 2,
    worker_memory: str = "1g",
    executor_memory: str = "640m",
    daemon_memory: str = "256m",
    timeout: float = START_TIMEOUT,
    cores: int = 1,
) -> Iterator[StandaloneCluster]:
    """Start a master on 127.0.0.1 and ``workers`` workers of ``cores`` cores each (one by
    default: several applications at once need more) on 127.0.0.2, .3, ...

    Yields once the master's JSON status lists every worker ALIVE; stops every JVM it
    started on exit, also when the start failed.
    """
    root.mkdir(parents=True, exist_ok=True)
    logs, work, local, conf = (root / d for d in ("logs", "work", "local", "conf"))
    for d in (logs, work, local, conf):
        d.mkdir(exist_ok=True)
    base = {
        k: v
        for k, v in os.environ.items()
        # Nothing of the caller's Spark setup, nor a crash armed for a driver.
        if not k.startswith(("SPARK_", "PYSPARK_", "CONNECTORS_"))
    }
    base.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_CONF_DIR=str(conf),  # empty: no spark-env.sh / spark-defaults.conf
        SPARK_LOG_DIR=str(logs),
        SPARK_DAEMON_MEMORY=daemon_memory,
        SPARK_DAEMON_JAVA_OPTS="-XX:-UsePerfData",  # no /tmp/hsperfdata_* files
        SPARK_LOCAL_DIRS=str(local),  # executors' block manager dirs
        PYSPARK_PYTHON=sys.executable,
    )
    daemons: list[_Daemon] = []
    try:
        master_port, web_port = free_port(), free_port()
        master = _start(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host", "127.0.0.1",
                "--port", str(master_port),
                "--webui-port", str(web_port),
            ],
            {**base, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_MASTER_HOST": "127.0.0.1"},
            logs,
        )
        daemons.append(master)

        # The port Spark really bound (it moves on if ours was taken meanwhile).
        def master_started() -> tuple[str, str] | None:
            text = master.log.read_text(errors="replace") if master.log.exists() else ""
            url = re.search(r"Starting Spark master at (spark://\S+)", text)
            web = re.search(r"MasterWebUI.* started at (http://\S+)", text)
            if not (url and web):
                return None
            port = web.group(1).rsplit(":", 1)[1].rstrip("/")
            return url.group(1), f"http://127.0.0.1:{port}"

        master_url, web_url = _wait_for("master start", master_started, daemons, timeout)
        hosts = tuple(f"127.0.0.{2 + i}" for i in range(workers))
        for i, host in enumerate(hosts):
            worker_dir = work / host
            worker_dir.mkdir(exist_ok=True)
            daemons.append(
                _start(
                    f"worker-{i + 1}",
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        "--host", host,
                        "--webui-port", str(free_port()),
                        "--cores", str(cores),
                        "--memory", worker_memory,
                        "--work-dir", str(worker_dir),
                        master_url,
                    ],
                    {**base, "SPARK_LOCAL_IP": host, "SPARK_WORKER_DIR": str(worker_dir)},
                    logs,
                )
            )
        cluster = StandaloneCluster(master_url, web_url, root, hosts, executor_memory, daemons)

        def all_alive() -> bool:
            try:
                state = cluster.state()
            except (OSError, urllib.error.URLError, ValueError):
                return False
            alive = {w.get("host") for w in state.get("workers", []) if w.get("state") == "ALIVE"}
            return alive >= set(hosts)

        _wait_for(f"workers {', '.join(hosts)} registered", all_alive, daemons, timeout)
        yield cluster
    finally:
        _stop(daemons)


def processes_under(root: Path) -> list[str]:
    """Live processes started for the cluster under ``root`` (to assert none is left).

    Found by ``root`` in their command line or environment: daemons, executors and the
    executors' Python workers (``pyspark.daemon`` makes its own process group, so a
    process-group check alone would miss them) all inherit ``SPARK_CONF_DIR``.
    """
    found = []
    needle = str(root).encode()
    for proc in Path("/proc").glob("[0-9]*"):
        if proc.name == str(os.getpid()):
            continue
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes()
            if needle in cmdline or needle in (proc / "environ").read_bytes():
                if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
                line = cmdline.replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{proc.name}: {line[:300]}")
    return found


def executor_jvms(cluster: StandaloneCluster) -> list[int]:
    """The pids of this cluster's executor JVMs (``CoarseGrainedExecutorBackend``), told
    from other clusters' by its root in their environment (``SPARK_CONF_DIR``), as
    :func:`processes_under` finds the cluster's processes."""
    found = []
    needle = str(cluster.root).encode()
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes()
            if b"CoarseGrainedExecutorBackend" in cmdline and (
                    needle in cmdline or needle in (proc / "environ").read_bytes()):
                found.append(int(proc.name))
    return found


def kill_executors_once(cluster: StandaloneCluster, fired: Path,
                        timeout: float = 300.0) -> tuple[threading.Thread, list[int]]:
    """Start a thread that SIGKILLs every executor JVM of ``cluster`` once ``fired`` exists
    (the ``once=`` file of a task's ``action=stall`` crash point: the task has prepared and
    stalls), half a second after. Returns the thread and the list of pids it killed (filled
    in when it has); join the thread before reading the list."""
    killed: list[int] = []

    def kill() -> None:
        deadline = time.monotonic() + timeout
        while not fired.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # the stall has begun: the transaction is prepared
        for pid in executor_jvms(cluster):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread, killed
