"""Chaos soak: streaming jobs into every sink on a standalone cluster, failures at random.

``python -m benchmarks.chaos --failures 300`` starts a Spark standalone cluster from pip's
pyspark (a master and two workers), one streaming job per sink (PostgreSQL from JSON
files, Kafka from a Kafka topic, Delta from JSON files; ``--sinks`` picks), feeds them new
input while they run, and at random moments (``--interval``) causes one failure of a kind
drawn from ``--kinds``: SIGKILL a driver, an executor JVM or a Python worker, restart
PostgreSQL (``immediate``) or the Kafka broker (SIGKILL), until ``--failures`` failures
happened or ``--minutes`` passed. A job that ends (killed, failed, or done with what was
there) is started again on its checkpoint at once. Then the failures stop, every job runs
once more to its end, and every target is checked row by row.

It prints a table per sink (driver exits, rows expected and seen, duplicates, missing,
lingering transactions) and the failures of each kind, and writes to ``--out``:
``chaos.md`` (the tables), ``chaos.json`` (every failure and progress sample) and
``chaos.png`` (batches committed over time per sink, each failure marked). Exit 0 when
every sink is exact.

Needs the services of ``scripts/services`` (``. ./.services.env``); restarting PostgreSQL
and Kafka needs the native ones (``scripts/services start``). Not CI's: each failure kind
it injects has a dedicated kill or outage test in CI's test lane; campaigns are run by hand
and recorded in benchmarks/README.md with their date and commit.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks._chaos_faults import KINDS, Failure, strike
from benchmarks._chaos_jobs import REPO, SinkJob, make_jobs
from benchmarks._chaos_report import Progress, table, timeline_png

DEFAULT_OUT = REPO / "benchmarks" / "charts"  # chaos.md, chaos.json, chaos.png


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.chaos",
                                description=(__doc__ or "").splitlines()[0])
    p.add_argument("--failures", type=int, default=15, help="failures to cause (default 15)")
    p.add_argument("--each", type=int, default=None,
                   help="instead: this many failures of each kind, in a shuffled order")
    p.add_argument("--quick", action="store_true",
                   help="a short campaign: --each 1 --interval 15 30 --rows-per-feed 100")
    p.add_argument("--minutes", type=float, default=None, help="stop causing them after this")
    p.add_argument("--sinks", default="postgres,kafka,delta")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"of {', '.join(KINDS)}")
    p.add_argument("--interval", type=float, nargs=2, default=(15.0, 45.0),
                   metavar=("MIN", "MAX"),
                   help="seconds between two failures, drawn uniformly (default 15 45: a "
                        "driver needs ~15 s to start on a loaded 2-core machine)")
    p.add_argument("--feed-every", type=float, default=3.0, help="seconds between new input")
    p.add_argument("--rows-per-feed", type=int, default=200)
    p.add_argument("--seed", type=int, default=40)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--drain-timeout", type=float, default=600.0)
    return p


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECTORS_CRASH")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYSPARK_PYTHON"] = sys.executable
    return env


class Sampler(threading.Thread):
    """Every second, each job's committed batches, until stopped (drain included)."""

    def __init__(self, jobs: list[SinkJob], t0: float, into: list[Progress]) -> None:
        super().__init__(name="chaos-sampler", daemon=True)
        self.jobs, self.t0, self.into = jobs, t0, into
        self.done = threading.Event()

    def run(self) -> None:
        while True:
            for job in self.jobs:
                n = job.committed()
                if n is not None:
                    self.into.append((time.monotonic() - self.t0, job.name, n))
            if self.done.wait(1.0):
                return

    def stop(self) -> None:
        self.done.set()
        self.join()
        for job in self.jobs:  # the last word
            n = job.committed()
            if n is not None:
                self.into.append((time.monotonic() - self.t0, job.name, n))


def _wait(job: SinkJob, deadline: float) -> int | None:
    """Until ``job``'s driver ends: its exit code (None when none was running)."""
    if job.proc is None:
        return None
    while (code := job.poll()) is None:
        if time.monotonic() > deadline:
            job.kill()
            raise SystemExit(f"{job.name}: its driver did not end in time "
                             f"(log: {job.root / 'driver.log'})")
        time.sleep(0.5)
    return code


def _drain(jobs: list[SinkJob], env: dict[str, str], timeout: float) -> None:
    """Failures over, input complete: each job's run in flight ends, then a run started
    after the last input must end with exit 0 (it wrote everything)."""
    deadline = time.monotonic() + timeout
    for job in jobs:
        _wait(job, deadline)
        for _attempt in range(3):
            job.start(env)
            if _wait(job, deadline) == 0:
                break
        else:
            raise SystemExit(f"{job.name}: 3 runs after the failures failed "
                             f"(log: {job.root / 'driver.log'})")


def campaign(args: argparse.Namespace) -> int:
    import integration.services as services
    from integration.support._standalone import standalone_cluster

    conninfo = os.environ.get("EOS_POSTGRES_CONNINFO", "")
    bootstrap = os.environ.get("EOS_KAFKA_BOOTSTRAP", "")
    if not conninfo or not bootstrap:
        raise SystemExit("no services: run `bash scripts/services start` and "
                         "`set -a; . ./.services.env; set +a` first")
    sinks = [s.strip() for s in args.sinks.split(",") if s.strip()]
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if unknown := set(kinds) - set(KINDS):
        raise SystemExit(f"unknown failure kinds {sorted(unknown)}: {', '.join(KINDS)}")
    rng = random.Random(args.seed)
    plan: list[str] | None = None
    if args.each is not None:
        plan = [k for k in kinds for _ in range(args.each)]
        rng.shuffle(plan)
        args.failures = len(plan)
    env = _env()
    root = Path(tempfile.mkdtemp(prefix="eos-chaos-"))
    failures: list[Failure] = []
    progress: list[Progress] = []
    with standalone_cluster(root / "cluster", workers=2, cores=len(sinks) + 1,
                            worker_memory="3g", executor_memory="512m") as cluster:
        conf = [*cluster.driver_conf(), "--master", cluster.master_url]
        jobs = make_jobs(root, sinks, conninfo=conninfo, bootstrap=bootstrap,
                         rows_per_feed=args.rows_per_feed, conf=conf)
        try:
            t0 = time.monotonic()
            for job in jobs:
                job.feed()
                job.start(env)
            next_feed = t0 + args.feed_every
            next_failure = t0 + rng.uniform(*args.interval)
            sampler = Sampler(jobs, t0, progress)
            sampler.start()
            print(f"chaos: {', '.join(sinks)} on {cluster.master_url}; {args.failures} "
                  f"failures of {', '.join(kinds)}; work dir {root}", flush=True)
            while len(failures) < args.failures and (
                    args.minutes is None or time.monotonic() - t0 < args.minutes * 60):
                now = time.monotonic()
                for job in jobs:
                    if job.poll() is not None:
                        job.start(env)
                if now >= next_feed:
                    for job in jobs:
                        job.feed()
                    next_feed = now + args.feed_every
                if now >= next_failure:
                    kind = plan[len(failures)] if plan is not None else rng.choice(kinds)
                    started = time.monotonic()
                    victim = strike(
                        kind, rng, jobs, cluster.root,
                        restart_postgres=lambda d: services.restart_postgres(
                            mode="immediate", downtime=d),
                        restart_kafka=lambda d: services.restart_kafka(kill=True, downtime=d))
                    if victim is not None:
                        failures.append(Failure(started - t0, kind, victim,
                                                time.monotonic() - started))
                        print(f"  {started - t0:7.1f} s  #{len(failures):3d}  {kind:13s} "
                              f"{victim}", flush=True)
                    next_failure = time.monotonic() + rng.uniform(*args.interval)
                time.sleep(0.2)
            _drain(jobs, env, args.drain_timeout)
            wall = time.monotonic() - t0
            sampler.stop()
            verdicts = {job.name: job.verdict() for job in jobs}
        finally:
            for job in jobs:
                job.kill()
    report = table(jobs, verdicts, failures, wall)
    print(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "chaos.md").write_text(report + "\n")
    (args.out / "chaos.json").write_text(json.dumps({
        "failures": [asdict(f) for f in failures], "progress": progress,
        "verdicts": {k: asdict(v) for k, v in verdicts.items()}, "wall_s": wall,
        "seed": args.seed}, indent=1))
    png = timeline_png(args.out / "chaos.png", progress, failures, sinks)
    print(f"timeline: {png}")
    for job in jobs:
        job.cleanup()
    return 0 if all(v.exact for v in verdicts.values()) else 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.quick:
        args.each, args.interval, args.rows_per_feed = 1, (15.0, 30.0), 100
    return campaign(args)


if __name__ == "__main__":
    raise SystemExit(main())
