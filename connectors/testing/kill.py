"""The real-kill harness: run your streaming driver as a child process, SIGKILL it at a crash
point (or at a random moment), restart it on the same checkpoint, and prove what happened.

The conformance suite (:mod:`connectors.testing.conformance`) crashes sinks in-process;
this harness kills real processes, the way the project's own kill tests do:

- :func:`run_driver` runs ``python -m <module> <args>`` in its own process group, arms
  ``CONNECTORS_CRASH_AT`` (with ``CONNECTORS_TEST_MODE=1``; both are needed) for it and its
  Spark tasks, and SIGKILLs it from outside after ``kill_after`` seconds (or once
  ``kill_when()`` holds) when asked; whatever the driver left running is reaped.
- :class:`KillJob` is one driver program plus its checkpoint and crash log: subclass it,
  give :meth:`KillJob.args`, and it runs, kills and restarts that program.
- :func:`kill_at_each` kills a job at each crash point of a plan in turn (a restarted
  driver meets the next one), proving each kill: the driver died by SIGKILL, the crash log
  names the point, sink and batch, and Spark's offset log has the batch while its commit
  log does not (so the restart replays it). Then one clean run. You check the target row
  by row afterwards: nothing missing, nothing twice, nothing left prepared or open.
- :func:`kill_at_random` kills a job at random moments instead (each once the target shows
  progress, a random delay later), then one clean run; at least one kill must land.

.. example-needs: spark

Example (the example file-system sink's driver, ``examples/stream_to_files.py``)::

    from pathlib import Path

    from connectors.sdk import CrashPoint
    from connectors.testing.kill import KillJob, kill_at_each
    from examples.fs_sink import read_output

    class FilesJob(KillJob):
        module = "examples.stream_to_files"

        def args(self):
            return ["--source", "rate", "--batches", "3", "--rows-per-batch", "50",
                    "--out", str(self.root / "out"), "--checkpoint", str(self.checkpoint)]

    job = FilesJob(Path(path))
    runs = kill_at_each(job, [(CrashPoint.AFTER_DECISION, "files", 1)])
    assert [r.returncode for r in runs] == [-9, 0]
    # row by row: every value of the 3 batches exactly once
    assert sorted(read_output(job.root / "out")["value"].to_pylist()) == list(range(150))

Depends on the standard library and :mod:`connectors.core` only (the driver is the one
that needs Spark).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from connectors.core.protocol.crash import ENV_CRASH_AT, ENV_CRASH_LOG, ENV_TEST_MODE
from connectors.core.states import CrashPoint
from connectors.testing.checkpoint import finished_batches, spark_batches

__all__ = ["DriverRun", "KillJob", "finished_batches", "kill_at_each", "kill_at_random",
           "point_reached", "reached", "run_driver", "spark_batches"]

#: A metrics line's message (:meth:`connectors.core.metrics.BatchMetrics.emit`), and its fields.
_METRICS_LINE = re.compile(r"\bbatch (sink_id=\S* batch_id=\d+ .*)$")
_FIELD = re.compile(r"(\w+)=(\S*)")

#: Seconds one driver run may take: a hung Spark job fails the test, not the whole run.
DRIVER_TIMEOUT = 300.0
#: Where Spark keeps its scratch (it wins over ``spark.local.dir``).
ENV_SPARK_LOCAL_DIRS = "SPARK_LOCAL_DIRS"


@dataclass
class DriverRun:
    """One run of a driver program: its exit code (``-9``: SIGKILLed), its output (stdout
    and stderr merged) and how long it took."""

    returncode: int
    output: str
    seconds: float

    def tail(self, n: int = 60) -> str:
        """The last ``n`` lines of the output (for assertion messages)."""
        return "\n".join(self.output.splitlines()[-n:])

    def metrics(self, sink_id: str | None = None,
                batch: int | None = None) -> list[dict[str, str]]:
        """The per-batch metrics lines the run logged (logger ``connectors.metrics`` at
        INFO: ``batch sink_id=... batch_id=... outcome=...``), in order, each as
        ``{key: value}``; only those of ``sink_id`` and ``batch`` when given."""
        found = []
        for line in self.output.splitlines():
            match = _METRICS_LINE.search(line)
            if match is None:
                continue
            fields = dict(_FIELD.findall(match.group(1)))
            if sink_id is not None and fields.get("sink_id") != sink_id:
                continue
            if batch is not None and fields.get("batch_id") != str(batch):
                continue
            found.append(fields)
        return found

    def batch_metrics(self, sink_id: str, batch: int) -> dict[str, str]:
        """The first metrics line of ``sink_id``'s ``batch``; AssertionError if none."""
        found = self.metrics(sink_id, batch)
        assert found, f"no metrics line of sink {sink_id} batch {batch}:\n{self.tail()}"
        return found[0]


def run_driver(
    args: Sequence[str],
    *,
    module: str | None = None,
    command: Sequence[str] | None = None,
    crash: str | None = None,
    crash_log: Path | None = None,
    kill_after: float | None = None,
    kill_when: Callable[[], bool] | None = None,
    timeout: float = DRIVER_TIMEOUT,
    root: Path | None = None,
    env: Mapping[str, str] | None = None,
    kill_signal: int = signal.SIGKILL,
) -> DriverRun:
    """Run ``python -m module args`` (or ``command args``) to its end, or SIGKILL it.

    ``command``: what starts the driver instead of ``python -m module``, e.g. a
    ``spark-submit`` line ending in the program's file (``[spark_submit, "--master",
    "spark://host:7077", "--archives", "env.tar.gz#environment", "job.py"]``); exactly one
    of ``module`` and ``command``. A kill from outside goes to ``command``'s whole process
    group (spark-submit's JVM and the Python driver it started: the JVM alone would leave
    the driver running), to the ``python -m`` process alone otherwise (its JVM follows it).

    ``crash``: a ``CONNECTORS_CRASH_AT`` spec armed in the driver and its tasks (any spec
    already in the environment is dropped). ``crash_log``: the file every crash point
    reached is appended to (``CONNECTORS_CRASH_LOG``). ``kill_after``: SIGKILL the driver
    from outside that many seconds after it started, or, with ``kill_when``, after
    ``kill_when()`` first returned true (polled every 50 ms), unless it ended before.
    ``root``: the working directory, put first on ``PYTHONPATH`` (an earlier release's tree
    for upgrade tests). ``env``: extra environment variables. ``kill_signal``: the signal
    sent instead of SIGKILL (``signal.SIGTERM``: a deploy's stop, which a driver that
    installed :func:`connectors.stop_on_sigterm` turns into a graceful stop); the driver
    then ends by itself, within ``timeout``.

    Spark's scratch space (``SPARK_LOCAL_DIRS``: block manager directories and the copy of
    every jar of ``spark.jars`` each local executor fetches, 13 MB for Delta, 690 MB with
    the S3 bundle) is a new temporary directory per run, removed once the driver and what
    it left are gone: a SIGKILLed driver runs no shutdown hook, and its scratch would
    otherwise stay in ``/tmp`` for good. A ``SPARK_LOCAL_DIRS`` in the environment or in
    ``env`` is used as given and left alone.
    """
    environ = dict(os.environ)
    environ.pop(ENV_CRASH_AT, None)
    environ.update(env or {})
    if crash:
        environ[ENV_CRASH_AT] = crash
        environ[ENV_TEST_MODE] = "1"
    if crash_log is not None:
        environ[ENV_CRASH_LOG] = str(crash_log)
    cwd = Path.cwd() if root is None else root
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(cwd), environ.get("PYTHONPATH")]))
    environ.setdefault("PYSPARK_PYTHON", sys.executable)
    scratch = None
    if not environ.get(ENV_SPARK_LOCAL_DIRS):
        scratch = tempfile.mkdtemp(prefix="connectors-driver-")
        environ[ENV_SPARK_LOCAL_DIRS] = scratch
    if (module is None) == (command is None):
        raise ValueError("run_driver: give exactly one of module and command")
    argv = [*command] if command is not None else [sys.executable, "-m", str(module)]
    try:
        return _run([*argv, *args], cwd, environ, kill_after, kill_when, timeout, kill_signal,
                    group=command is not None)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _run(argv: Sequence[str], cwd: Path, environ: dict[str, str],
         kill_after: float | None, kill_when: Callable[[], bool] | None, timeout: float,
         kill_signal: int, *, group: bool) -> DriverRun:
    """:func:`run_driver`'s process: started, killed when asked, and reaped."""
    start = time.monotonic()
    proc = subprocess.Popen(
        list(argv), cwd=cwd, env=environ, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        if kill_after is not None:
            if kill_when is not None:
                while proc.poll() is None and not kill_when():
                    if time.monotonic() - start > timeout:
                        break
                    time.sleep(0.05)
            try:
                out, _ = proc.communicate(timeout=kill_after)
            except subprocess.TimeoutExpired:
                if group:
                    os.killpg(proc.pid, kill_signal)
                else:
                    proc.send_signal(kill_signal)
                out, _ = proc.communicate(timeout=timeout)
        else:
            out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"driver did not finish in {timeout} s:\n{out[-5000:]}") from None
    finally:
        _reap_group(proc.pid)
    return DriverRun(proc.returncode, out, time.monotonic() - start)


def _reap_group(pgid: int) -> None:
    """Kill what the driver left (its JVM notices the dead driver, but do not wait on it)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.25)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def reached(crash_log: Path) -> list[str]:
    """Lines of the crash log: one per crash point reached."""
    return crash_log.read_text().splitlines() if crash_log.exists() else []


def point_reached(crash_log: Path, point: CrashPoint, sink_id: str, batch: int | None = None,
                  **fields: Any) -> bool:
    """Whether the crash log has ``point`` for ``sink_id`` (and ``batch``, and every other
    ``field=value`` given): lines read ``<point> sink=<id> batch=<n> <field>=<value>...``."""
    want = {"sink": sink_id, **{k: str(v) for k, v in fields.items()}}
    if batch is not None:
        want["batch"] = str(batch)
    for line in reached(crash_log):
        if line.startswith(f"{point.value} "):
            # (a line being appended while a kill_when predicate polls may be partial)
            words = dict(w.split("=", 1) for w in line.split()[1:] if "=" in w)
            if all(words.get(k) == v for k, v in want.items()):
                return True
    return False


class KillJob:
    """One streaming driver program, its checkpoint and its crash log, under ``root``.

    Subclass it: set :attr:`module` (run as ``python -m``) and return the program's
    arguments from :meth:`args` (use :attr:`checkpoint` for its checkpoint); ``cwd``: the
    directory it runs in, first on ``PYTHONPATH`` (default: the current one). :meth:`run`
    runs it once (arguments as :func:`run_driver`'s); :meth:`reached` asks the crash log.
    """

    #: The driver program, run as ``python -m module``.
    module: ClassVar[str]

    def __init__(self, root: Path, *, sink_id: str = "", cwd: Path | None = None) -> None:
        self.root = root
        #: The sink :meth:`reached` asks about unless told another.
        self.sink_id = sink_id
        self.cwd = cwd
        self.checkpoint = root / "ckpt"
        self.crash_log = root / "crash.log"

    def args(self) -> list[str]:
        """The program's command-line arguments."""
        raise NotImplementedError("return the driver program's arguments")

    def run(self, *extra: str, **kwargs: Any) -> DriverRun:
        """One run with :meth:`args` plus ``extra``; ``kwargs`` go to :func:`run_driver`."""
        kwargs.setdefault("root", self.cwd)
        return run_driver([*self.args(), *extra], module=self.module,
                          crash_log=self.crash_log, **kwargs)

    def reached(self, point: CrashPoint, batch: int | None = None, *,
                sink_id: str | None = None, **fields: Any) -> bool:
        """Whether a run reached ``point`` for ``sink_id`` (default :attr:`sink_id`), and
        ``batch`` and every ``field=value`` given (``partition=2``, ...)."""
        return point_reached(self.crash_log, point, sink_id or self.sink_id, batch, **fields)


def kill_at_each(job: KillJob, plan: Sequence[tuple[CrashPoint, str, int]], *,
                 after_kill: Callable[[CrashPoint, str, int, DriverRun], None] | None = None,
                 once_dir: Path | None = None,
                 killed: Callable[[DriverRun], None] | None = None) -> list[DriverRun]:
    """SIGKILL ``job``'s driver at each ``(point, sink_id, batch)`` of ``plan``, in order,
    restarting it each time; then run it once more to its end. Returns every run.

    One spec arms every point of the plan, each spent once (``once=`` files), so each
    restart dies at the next point: order the plan as a restarted driver meets the points.
    Each kill is proved (the exit was SIGKILL; the crash log names the point, sink and
    batch; Spark's offset log holds the batch and its commit log does not) before
    ``after_kill`` (your checks of what the target holds at that point) runs. The last run
    must exit 0. Checking the output row by row is yours.

    ``killed`` checks how a killed run ended (default: SIGKILLed). Under Spark Connect the
    sink's driver side runs in the server's foreachBatch worker: the worker SIGKILLs
    itself and the client ends with the query's error instead.
    """
    def sigkilled(run: DriverRun) -> None:
        assert run.returncode == -9, f"the driver was not SIGKILLed\n{run.tail()}"

    check_killed = killed or sigkilled
    spent = once_dir or job.root
    spec = ";".join(f"{p.value}:batch={b}:sink={s}:once={spent / f'once-{i}'}"
                    for i, (p, s, b) in enumerate(plan))
    runs = []
    for point, sink_id, batch in plan:
        run = job.run(crash=spec)
        runs.append(run)
        try:
            check_killed(run)
        except AssertionError as exc:
            raise AssertionError(f"at {point.value} of sink {sink_id} batch {batch}: "
                                 f"{exc}") from None
        assert job.reached(point, batch, sink_id=sink_id), (
            f"{point.value} of sink {sink_id} batch {batch} not reached: "
            f"{reached(job.crash_log)}")
        offsets, commits = spark_batches(job.checkpoint)
        assert batch in offsets and batch not in commits, (
            f"Spark's checkpoint: offsets {sorted(offsets)}, commits {sorted(commits)}")
        if after_kill is not None:
            after_kill(point, sink_id, batch, run)
    final = job.run(crash=spec)
    runs.append(final)
    assert final.returncode == 0, final.tail()
    assert len(reached(job.crash_log)) >= len(plan), reached(job.crash_log)
    return runs


def kill_at_random(job: KillJob, *, progress: Callable[[], int], runs: int = 2,
                   max_delay: float = 2.0, seed: int = 0,
                   check: Callable[[DriverRun], None] | None = None) -> list[DriverRun]:
    """Run ``job`` ``runs`` times, each SIGKILLed at a random moment unless it ends first,
    then once more to its end. Returns every run.

    ``progress()`` counts what the target has recorded (batches in its ledger, say): each
    run is killed a random ``0..max_delay`` seconds (from ``random.Random(seed)``) after
    that count first grows past its value when the run started, so the kill lands while
    the driver writes. A run that was not killed and the last run go to ``check`` (default:
    it must exit 0). At least one run must have been killed, or the delays were too long
    for the machine. Checking the output row by row is yours.
    """
    def exited_cleanly(run: DriverRun) -> None:
        assert run.returncode == 0, run.tail()

    check = check or exited_cleanly
    rng = random.Random(seed)
    done: list[DriverRun] = []
    for _ in range(runs):
        before = progress()

        def moved(before: int = before) -> bool:
            return progress() > before

        run = job.run(kill_after=rng.uniform(0.0, max_delay), kill_when=moved)
        done.append(run)
        if run.returncode != -9:
            check(run)
    final = job.run()
    done.append(final)
    check(final)
    kills = sum(r.returncode == -9 for r in done)
    assert kills >= 1, "no run was killed: the delays were too long for this machine"
    return done
