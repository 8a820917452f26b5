"""Restarting a target while a streaming job writes into it (issue 40: ride out a target's
restart): the job is one driver run, never restarted from outside; the target goes down
each time the job has committed ``every`` more batches; the time from the target's return
to the next committed batch is measured."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from connectors.testing.kill import DriverRun, KillJob, spark_batches

__all__ = ["Outages", "ride_out", "started_while_down"]


@dataclass
class Outages:
    """What a job went through: its one run, and per outage the seconds the target was
    down (as the restart took) and from its return to the job's next committed batch."""

    run: DriverRun
    down_s: list[float] = field(default_factory=list)
    recovered_s: list[float] = field(default_factory=list)

    def report(self, what: str) -> str:
        rows = [f"  outage {i + 1}: down {d:5.1f} s, next committed batch {r:5.1f} s after "
                "its return" for i, (d, r) in enumerate(zip(self.down_s, self.recovered_s,
                                                            strict=True))]
        return "\n".join([f"{what}: {len(rows)} outage(s) ridden out by one driver run",
                          *rows])


def _poll(progress: Callable[[], int | None], until: Callable[[int], bool], *,
          done: Callable[[], bool], timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            now = progress()
        except Exception:  # the target is down: its state cannot be read either
            now = None
        if now is not None and until(now):
            return now
        if done():
            return None
        time.sleep(0.2)
    raise AssertionError(f"no progress within {timeout:.0f} s")


def ride_out(job: KillJob, *, progress: Callable[[], int | None],
             restart: Callable[[int], None],
             outages: int, every: int, timeout: float = 600.0) -> Outages:
    """Run ``job`` once; after each ``every`` committed batches (``progress()``, which
    may raise while the target is down), ``restart(k)`` the target for outage ``k`` (from
    0; it returns once the target is back). Returns the run and the times; the caller
    checks the run's exit code and the output."""
    down: list[float] = []
    recovered: list[float] = []
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(job.run)
        for k in range(outages):
            goal = (k + 1) * every
            before = _poll(progress, lambda n, g=goal: n >= g, done=future.done,
                           timeout=timeout)
            assert before is not None, (
                f"the job ended before outage {k + 1} (it reached {goal} batches?):\n"
                f"{future.result().tail()}")
            started = time.monotonic()
            restart(k)
            back = time.monotonic()
            down.append(back - started)
            after = _poll(progress, lambda n, b=before: n > b, done=future.done,
                          timeout=timeout)
            assert after is not None, (
                f"the job ended after outage {k + 1} without a new batch:\n"
                f"{future.result().tail()}")
            recovered.append(time.monotonic() - back)
        run = future.result(timeout=timeout)
    return Outages(run, down, recovered)


def started_while_down(job: KillJob, *, stop: Callable[[], object],
                       start: Callable[[], object], down_after: float = 10.0,
                       timeout: float = 600.0) -> tuple[DriverRun, float]:
    """``stop()`` the target, run ``job`` once, and ``start()`` the target ``down_after``
    seconds after the query's first batch is in Spark's offset log (the sink is asking
    for the target by then); the query must still run then. Returns the run and the
    seconds from the target's return to the run's end; the target is started again in
    any case."""
    stop()
    try:
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(job.run)
            deadline = time.monotonic() + timeout
            while not spark_batches(job.checkpoint)[0]:
                assert not future.done(), future.result().tail()
                assert time.monotonic() < deadline, f"no batch planned in {timeout:.0f} s"
                time.sleep(0.2)
            time.sleep(down_after)
            assert not future.done(), (
                f"the query ended while its target was down:\n{future.result().tail()}")
            start()
            back = time.monotonic()
            run = future.result(timeout=timeout)
            return run, time.monotonic() - back
    finally:
        start()  # a no-op when it runs
