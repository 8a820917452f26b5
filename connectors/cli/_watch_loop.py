"""``connectors status --watch``: refresh until interrupted.

Each refresh reads every sink (:class:`~connectors.cli._watch.Observer`) and shows it:
redrawn in place when stdout is a terminal (ANSI clear and home, the cursor hidden until
the end), appended tables otherwise, or with ``--json`` one JSON document per line per
refresh (JSON Lines, flushed at once) for scripts. ``--prometheus-port`` and
``--prometheus-textfile`` export the same as gauges
(:class:`~connectors.cli._gauges.PrometheusGauges`). Ctrl-C (SIGINT) or SIGTERM ends the
watch with exit 0 and the terminal as it was.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TextIO

from connectors.cli._model import EXIT_OK
from connectors.cli._targets import Target
from connectors.cli._watch import Observer, Snapshot, json_line, render_screen
from connectors.core.errors import ConfigurationError

__all__ = ["add_watch_arguments", "run_watch"]

logger = logging.getLogger(__name__)

CLEAR_HOME = "\x1b[H\x1b[2J"
HIDE_CURSOR, SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"


def add_watch_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("watching")
    g.add_argument("--watch", action="store_true",
                   help="refresh a table of every sink until interrupted (Ctrl-C exits 0): "
                   "last committed batch, lag, unfinished batches, lingering transactions "
                   "and the oldest one's age, the last error reaching the target; with "
                   "--json one JSON document per line per refresh")
    g.add_argument("--interval", type=float, default=5.0, metavar="SECONDS",
                   help="seconds between refreshes with --watch (default 5)")
    g.add_argument("--checkpoint", action="append", default=[], dest="checkpoints",
                   metavar="PATH",
                   help="with --watch: a query's local Spark checkpoint directory "
                   "(repeatable); a sink bound to its query shows its lag behind Spark's "
                   "offset log")
    g.add_argument("--prometheus-port", type=int, metavar="PORT",
                   help="with --watch: serve the gauges (connectors_watch_*) on "
                   "http://0.0.0.0:PORT/metrics (needs spark-exactly-once[prometheus])")
    g.add_argument("--prometheus-textfile", metavar="PATH",
                   help="with --watch: write the gauges to PATH at every refresh "
                   "(node_exporter's textfile collector)")


class _Stop(BaseException):
    """SIGTERM: end the watch as Ctrl-C does (a ``BaseException`` like
    ``KeyboardInterrupt``, so that no ``except Exception`` around a target's call, where
    the watcher turns errors into rows, swallows it)."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def run_watch(args: argparse.Namespace, targets: Sequence[Target],
              rebuild: Callable[[str], Target], out: TextIO | None = None,
              stop: threading.Event | None = None, refreshes: int | None = None) -> int:
    """Watch ``targets`` every ``args.interval`` seconds until interrupted (or ``stop`` is
    set, or after ``refreshes`` refreshes: for tests)."""
    if args.interval <= 0:
        raise ConfigurationError("--interval must be a positive number of seconds")
    out = out or sys.stdout
    gauges = None
    if args.prometheus_port is not None or args.prometheus_textfile:
        from connectors.cli._gauges import PrometheusGauges

        gauges = PrometheusGauges()
        if args.prometheus_port is not None:
            try:
                gauges.serve(args.prometheus_port)
            except OSError as exc:
                raise ConfigurationError(
                    f"--prometheus-port {args.prometheus_port}: {exc.strerror}") from None
    observer = Observer(targets, rebuild, sink_ids=args.sink_ids,
                        checkpoints=args.checkpoints)
    redraw = not args.json and out.isatty()
    stop = stop or threading.Event()
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main else None
    if redraw:
        out.write(HIDE_CURSOR)
    done = 0
    try:
        while not stop.is_set():
            snapshot = observer.refresh()
            if gauges is not None:
                gauges.update(snapshot)
                if args.prometheus_textfile:
                    gauges.write_textfile(args.prometheus_textfile)
            _show(out, snapshot, args, redraw)
            done += 1
            if refreshes is not None and done >= refreshes:
                break
            stop.wait(args.interval)
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        if redraw:
            out.write(SHOW_CURSOR + "\n")
            out.flush()
        if in_main:
            signal.signal(signal.SIGTERM, previous)
        observer.close()
        if gauges is not None:
            gauges.close()
    return EXIT_OK


def _show(out: TextIO, snapshot: Snapshot, args: argparse.Namespace, redraw: bool) -> None:
    if args.json:
        out.write(json_line(snapshot) + "\n")
    elif redraw:
        out.write(CLEAR_HOME + render_screen(snapshot, args.interval))
    else:
        out.write(render_screen(snapshot, args.interval) + "\n")
    out.flush()
