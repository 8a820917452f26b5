"""Where a sink's batch spends its time in the driver: each protocol step, and the py4j
calls made during it (``kafka_bench --profile``).

The sink's driver runs a batch as a sequence of protocol commands
(:mod:`connectors.core.protocol`), each performed by
:class:`connectors.core.driver.executor.Executor`; :class:`DriverProfile` times every
``Executor.perform`` call by the command's type (nested commands, such as a fan-out's
``ForTarget``, count in the outer step), and in classic PySpark every py4j round trip
(``py4j.clientserver.ClientServerConnection.send_command``) by the step it happened in.
It wraps both for the ``with`` block only, and records only inside :meth:`batch`: a
profiling aid of the benchmark, which the library never loads.

Example::

    with DriverProfile() as profile:
        for i in range(40):
            with profile.batch():
                sink(df, i)
    print(profile.table())
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Iterator
from typing import Any

from benchmarks._common import format_table, median

__all__ = ["DriverProfile"]

#: py4j calls made outside any protocol step (the sink's call before its first command).
OUTSIDE = "(outside a step)"


class DriverProfile:
    """Per batch: each protocol step's wall time, and its py4j calls and their time."""

    def __init__(self) -> None:
        self.batches: list[dict[str, list[float]]] = []  # step -> [ms, py4j calls, py4j ms]
        self.totals: list[float] = []
        self._current: dict[str, list[float]] | None = None
        self._step: list[str] = []
        self._undo: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> DriverProfile:
        from connectors.core.driver.executor import Executor

        self._wrap(Executor, "perform", self._timed_step)
        try:
            from py4j.clientserver import ClientServerConnection
        except ImportError:  # no py4j (Spark Connect only): steps without py4j figures
            return self
        self._wrap(ClientServerConnection, "send_command", self._timed_call)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Record the steps of the sink call inside the block as one batch."""
        self._current = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
        started = time.perf_counter()
        try:
            yield
        finally:
            self.totals.append((time.perf_counter() - started) * 1000)
            self.batches.append(dict(self._current))
            self._current = None

    def reset(self) -> None:
        """Forget the batches recorded so far."""
        self.batches.clear()
        self.totals.clear()

    def table(self) -> str:
        """Each step's median over the batches: ms, py4j calls, py4j ms; the batch's total."""
        if not self.batches:
            return "(no batch recorded)"
        steps: list[str] = []
        for figures in self.batches:
            steps.extend(s for s in figures if s not in steps)

        def med(step: str, i: int) -> float:
            return median([b[step][i] if step in b else 0.0 for b in self.batches])

        rows = [[s, f"{med(s, 0):.2f}", f"{med(s, 1):.0f}", f"{med(s, 2):.2f}"] for s in steps]
        rows.append(["whole sink call", f"{median(self.totals):.2f}",
                     f"{median([sum(f[1] for f in b.values()) for b in self.batches]):.0f}",
                     f"{median([sum(f[2] for f in b.values()) for b in self.batches]):.2f}"])
        return format_table(["driver step (in order)", "median ms", "py4j calls",
                             "py4j ms"], rows, "lrrr")

    # ---- the wrappers ----
    def _wrap(self, owner: Any, name: str, make: Any) -> None:
        original = getattr(owner, name)
        self._undo.append((owner, name, original))
        setattr(owner, name, make(original))

    def _timed_step(self, original: Any) -> Any:
        profile = self

        def perform(executor: Any, command: Any) -> Any:
            if profile._current is None or profile._step:  # not recording, or nested
                return original(executor, command)
            step = type(command).__name__
            profile._step.append(step)
            started = time.perf_counter()
            try:
                return original(executor, command)
            finally:
                profile._step.pop()
                if profile._current is not None:
                    profile._current[step][0] += (time.perf_counter() - started) * 1000

        return perform

    def _timed_call(self, original: Any) -> Any:
        profile = self

        def send_command(connection: Any, command: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(connection, command)
            finally:
                current = profile._current
                if current is not None:
                    figures = current[profile._step[-1] if profile._step else OUTSIDE]
                    figures[1] += 1
                    figures[2] += (time.perf_counter() - started) * 1000

        return send_command
