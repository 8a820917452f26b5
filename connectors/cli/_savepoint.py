"""``savepoint``: the sink's last decided batch and, per source, the option a new query
starts right after it (:mod:`connectors.savepoints`); ``--stop-pid`` stops the query's
driver first, as Flink's stop-with-savepoint does.

The driver is stopped with SIGTERM: a driver that runs its query under
:func:`connectors.stop_on_sigterm` (what a deploy's SIGTERM should reach) stops it
gracefully: the batch in flight finishes, the next one is refused. The command waits for
the process to end, then reads the ledger and the checkpoint. A driver still alive after
``--stop-timeout`` is an error and no savepoint is printed: the query would go on writing
after it.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

from connectors.cli._model import EXIT_ATTENTION, EXIT_OK
from connectors.cli._targets import Target
from connectors.core.errors import ConfigurationError
from connectors.core.ledgers.file_ledger import write_atomic
from connectors.savepoints import Savepoint, take_savepoint

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True,
                   help="the query's checkpoint directory (local, or a file: URI)")
    p.add_argument("--output", metavar="FILE",
                   help="also write the savepoint's JSON document to FILE (what a new query "
                   "passes on; load it with connectors.savepoints.load_savepoint)")
    p.add_argument("--stop-pid", type=int, metavar="PID",
                   help="first stop the query's driver: SIGTERM to PID (a driver running "
                   "connectors.stop_on_sigterm stops gracefully), then wait for it to end")
    p.add_argument("--stop-timeout", type=float, default=180.0, metavar="SECONDS",
                   help="how long --stop-pid waits for the driver to end (default 180)")


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs: an ended process its parent has not reaped yet (a
    zombie) has ended."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a child of this process: reap it
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        pass
    try:  # Linux: the state field of /proc/PID/stat ("Z": ended, not reaped)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def stop_driver(pid: int, timeout: float) -> None:
    """SIGTERM to ``pid``, then wait until it ended (:class:`ConfigurationError` when it
    does not within ``timeout`` seconds, or when there is no such process)."""
    if pid <= 1:
        raise ConfigurationError(f"--stop-pid {pid} is not a driver's process id")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        raise ConfigurationError(f"--stop-pid {pid}: no such process") from None
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            raise ConfigurationError(
                f"the driver (pid {pid}) did not end within {timeout:.0f} s of SIGTERM: no "
                "savepoint taken (the query may still write). Does it run "
                "connectors.stop_on_sigterm(query)? Raise --stop-timeout for a long batch")
        time.sleep(0.2)


def run(args: argparse.Namespace, targets: list[Target]) -> int:
    if len(args.sink_ids) != 1:
        raise ConfigurationError("a savepoint is one sink's (or one FanOut's): pass exactly "
                                 "one --sink-id")
    if args.stop_pid is not None:
        stop_driver(args.stop_pid, args.stop_timeout)
    sink_id = args.sink_ids[0]
    found: Savepoint | None = None
    for target in targets:
        try:
            ledger = target.ledger(sink_id)
            try:
                if ledger.bound_query() is not None:
                    found = take_savepoint(ledger, args.checkpoint)
                    break
            finally:
                ledger.close()
        finally:
            target.close()
    if found is None:
        raise ConfigurationError(f"no ledger of sink {sink_id!r} in the target(s) named: the "
                                 "sink's (or FanOut's) ledger is where it writes (a FanOut's: "
                                 "its first target's, unless ledger= was given)")
    if args.output:
        write_atomic(Path(args.output), (found.dumps() + "\n").encode())
    print(found.dumps() if args.json else found.describe())
    return EXIT_OK if found.resumable else EXIT_ATTENTION
