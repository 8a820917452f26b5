"""The S3 run of ``delta_bench``: DeltaSink (default path, tag) against a plain Delta append,
both on ``s3a://`` tables of the same S3 API, with the sink's ledger as objects beside its table.

The server, bucket and keys come from ``EOS_S3_ENDPOINT``, ``EOS_S3_BUCKET``,
``EOS_S3_ACCESS_KEY`` and ``EOS_S3_SECRET_KEY`` (``scripts/services start`` writes them to
``.services.env``, which is read when they are not in the environment). The method is the
local run's: the same cached micro-batches written by both contenders batch by batch, the
order rotating with the batch and the round, an untimed batch 0 per round (table creation,
the start of the sink's driver run: binding, the lease), every table checked after its
round (rows, sum of ids), and the ratio of the wall time of all timed batches with a 95 %
bootstrap interval over the batch pairs. Each round's tables are deleted after its check:
the test services' S3 API (moto) keeps every object in memory.

Printed beside the ratio, from the sink's metrics (``BatchMetrics.extra``): its own steps
(its time minus Delta's write, ``write_ms``), the requests its ledger made per batch
(``ledger_requests``: the lease's background renewals aside) and the lease's renewals per
minute (``ObstoreStore.lease_requests``), with the latency of one small request to the
server measured before the rounds (what each of those requests costs).
"""

from __future__ import annotations

import os
import time
from argparse import Namespace
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from benchmarks._common import format_table, load_service_env, median, ratio_interval

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from connectors.delta import DeltaSink
    from connectors.lake.store import ObstoreStore

__all__ = ["S3_TARGET", "S3Run", "S3Server", "report_s3", "run_s3", "s3_part", "s3_server"]

S3_ENV = ("EOS_S3_ENDPOINT", "EOS_S3_BUCKET", "EOS_S3_ACCESS_KEY", "EOS_S3_SECRET_KEY")
S3_TARGET = 1.05
KINDS = ("plain-s3", "sink-s3")


@dataclass(frozen=True)
class S3Server:
    """An S3 API and a bucket to write the benchmark's tables in."""

    endpoint: str
    bucket: str
    access_key: str
    secret_key: str = field(repr=False)

    def hadoop_confs(self) -> dict[str, str]:
        """The ``spark.hadoop.fs.s3a.*`` confs for Spark's s3a file system (and the ledger's
        client, which reads the same confs from the session)."""
        return {
            "spark.hadoop.fs.s3a.endpoint": self.endpoint,
            "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.connection.ssl.enabled": str(
                self.endpoint.startswith("https://")).lower(),
            "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
            "spark.hadoop.fs.s3a.access.key": self.access_key,
            "spark.hadoop.fs.s3a.secret.key": self.secret_key,
        }

    def store(self, prefix: str) -> ObstoreStore:
        """An obstore client for ``prefix`` of the bucket, as the sink's ledger builds one."""
        from connectors.lake.store import ObstoreStore, options_for

        confs = self.hadoop_confs()
        location = f"s3a://{self.bucket}/{prefix}"
        return ObstoreStore(location, options_for(location, confs.get, None))


def s3_server() -> tuple[S3Server | None, list[str]]:
    """The S3 API from ``EOS_S3_*`` (else ``.services.env``), or ``None`` and the names
    of the variables that are missing."""
    values = {key: load_service_env(key) for key in S3_ENV}
    missing = [key for key, value in values.items() if not value]
    if missing:
        return None, missing
    endpoint, bucket, access, secret = (str(values[key]) for key in S3_ENV)
    return S3Server(endpoint, bucket, access, secret), []


def delete_prefix(store: ObstoreStore) -> int:
    """Delete every object under the store's prefix (moto keeps them in memory)."""
    keys = store.keys("")
    for key in keys:
        store.delete(key)
    return len(keys)


def request_latency_ms(store: ObstoreStore, n: int = 20) -> tuple[float, float, float]:
    """Median ms of a small PUT, GET and DELETE on the server (``n`` of each)."""
    took: dict[str, list[float]] = {"put": [], "get": [], "delete": []}
    for i in range(n):
        key = f"probe/{i:04d}.json"
        for what in took:
            t0 = time.perf_counter()
            if what == "put":
                store.put(key, b'{"probe": 1}')
            elif what == "get":
                store.read(key)
            else:
                store.delete(key)
            took[what].append((time.perf_counter() - t0) * 1000)
    return median(took["put"]), median(took["get"]), median(took["delete"])


@dataclass
class S3Run:
    """What the S3 run measured (every list index: the same batch of the same round)."""

    rows: int
    batches: int
    rounds: int
    batch_s: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    per_round: list[dict[str, float]] = field(default_factory=list)
    own_ms: list[float] = field(default_factory=list)  # the sink's call minus Delta's write
    write_ms: list[float] = field(default_factory=list)  # Delta's write inside the sink
    requests: list[int] = field(default_factory=list)  # ledger_requests, timed batches
    first_requests: list[int] = field(default_factory=list)  # batch 0: the run's start
    lease_requests: int = 0  # the lease's requests after batch 0, until close
    lease_s: float = 0.0  # ... over this long
    latency_ms: tuple[float, float, float] = (float("nan"),) * 3
    paths: set[str] = field(default_factory=set)
    wall_s: float = 0.0
    load: tuple[float, float] = (float("nan"), float("nan"))  # 1-min load before, after


def s3_part(
    spark: SparkSession, server: S3Server, args: Namespace,
    make_batches: Callable[[SparkSession, int, int, int], list[DataFrame]],
    check: Callable[[SparkSession, str, str, int], None],
) -> S3Run:
    """The S3 run over its own cached batches (``--batches`` x ``--s3-rows`` rows)."""
    batches = make_batches(spark, args.batches, args.s3_rows, args.partitions)
    try:
        return run_s3(spark, server, batches, rows=args.s3_rows, rounds=args.rounds,
                      verify=not args.no_verify, check=check)
    finally:
        for df in batches:
            df.unpersist()


def run_s3(
    spark: SparkSession, server: S3Server, batches: Sequence[DataFrame], *, rows: int,
    rounds: int, verify: bool, check: Callable[[SparkSession, str, str, int], None],
    echo: Callable[[str], None] = print,
) -> S3Run:
    """Time the plain append and the sink on S3, ``rounds`` rounds of ``batches``."""
    from connectors.delta import DeltaSink

    started, load = time.monotonic(), os.getloadavg()[0]
    base = f"delta-bench-{os.getpid()}-{int(time.time())}"
    result = S3Run(rows=rows, batches=len(batches), rounds=rounds)
    probe = server.store(f"{base}/probe")
    result.latency_ms = request_latency_ms(probe)
    warm = batches[0].limit(1000)
    try:
        # No warm-up of its own: every round's untimed batch 0 (table creation) warms s3a's
        # client and Delta's S3 log store, and the local run (if any) warmed the JVM.
        for r in range(rounds):
            paths = {k: f"s3a://{server.bucket}/{base}/{k}-{r}" for k in KINDS}
            sink = DeltaSink(paths["sink-s3"], sink_id="bench", create_table=True,
                             verify_replay=verify)
            warm.write.format("delta").mode("append").save(paths["plain-s3"])
            sink(warm, 0)
            result.first_requests.append(int(_metric(sink, "ledger_requests")))
            lease_from, lease_t0 = _lease_requests(sink), time.monotonic()
            times = dict.fromkeys(KINDS, 0.0)
            for i, df in enumerate(batches, start=1):
                shift = (i + r) % len(KINDS)
                for who in KINDS[shift:] + KINDS[:shift]:
                    t0 = time.perf_counter()
                    if who == "plain-s3":
                        df.write.format("delta").mode("append").save(paths[who])
                    else:
                        sink(df, i)
                    spent = time.perf_counter() - t0
                    times[who] += spent
                    result.batch_s[who].append(spent)
                    if who == "sink-s3":
                        write_ms = _metric(sink, "write_ms")
                        result.write_ms.append(write_ms)
                        result.own_ms.append(spent * 1000 - write_ms)
                        result.requests.append(int(_metric(sink, "ledger_requests")))
                        assert sink.last_metrics is not None
                        result.paths.update(k.removeprefix("delta_path_")
                                            for k in sink.last_metrics.extra
                                            if k.startswith("delta_path_"))
            result.lease_requests += _lease_requests(sink) - lease_from
            result.lease_s += time.monotonic() - lease_t0
            sink.close()
            for k in KINDS:
                check(spark, k, paths[k], rows * len(batches) + 1000)
            result.per_round.append(times)
            echo(f"s3 round {r}: " + ", ".join(f"{k} {times[k]:.2f} s" for k in KINDS)
                 + f"; sink / plain {times['sink-s3'] / times['plain-s3']:.3f}")
            for k in KINDS:
                delete_prefix(server.store(f"{base}/{k}-{r}"))
    finally:
        for name in ("probe", *(f"{k}-{r}" for k in KINDS for r in range(rounds))):
            try:
                delete_prefix(server.store(f"{base}/{name}"))
            except Exception as exc:  # clean-up: say so, keep the result
                echo(f"s3: could not delete {base}/{name}: {exc}")
    result.wall_s = time.monotonic() - started
    result.load = (load, os.getloadavg()[0])
    return result


def _metric(sink: DeltaSink, key: str) -> float:
    metrics = sink.last_metrics
    assert metrics is not None
    value = metrics.extra.get(key)
    if value is None:
        raise SystemExit(f"s3: the sink's metrics carry no {key!r} ({metrics.extra})")
    return float(value)


def _lease_requests(sink: DeltaSink) -> int:
    """The lease's requests so far, from the ledger's store (private: a benchmark's view)."""
    ledger = sink._commits.ledger
    return int(getattr(getattr(ledger, "store", None), "lease_requests", 0))


def report_s3(run: S3Run, server: S3Server, *, quick: bool, smoke: bool = False) -> None:
    """Print the S3 run: the ratio with its interval, the per-round ratios, the sink's own
    steps, its ledger's requests per batch and the lease's renewals per minute."""
    plain, sink = run.batch_s["plain-s3"], run.batch_s["sink-s3"]
    n = len(plain)
    total = sum(sink) / sum(plain)
    low, high = ratio_interval(sink, plain)
    rounds = [t["sink-s3"] / t["plain-s3"] for t in run.per_round]
    paired = median([a / b for a, b in zip(sink, plain, strict=True)])
    print()
    print(f"# S3 ({server.endpoint}, bucket {server.bucket}): {run.batches} micro-batches x "
          f"{run.rows:,} rows, {run.rounds} interleaved rounds ({n} batch pairs); "
          f"{run.wall_s:.0f} s, 1-min load average {run.load[0]:.1f} before, {run.load[1]:.1f} "
          f"after, on {os.cpu_count()} CPUs")
    print()
    print(format_table(
        ["round", "plain-s3 (s)", "sink-s3 (s)", "sink / plain"],
        [[str(i), f"{t['plain-s3']:.2f}", f"{t['sink-s3']:.2f}", f"{q:.3f}"]
         for i, (t, q) in enumerate(zip(run.per_round, rounds, strict=True))]
        + [["median", f"{median([t['plain-s3'] for t in run.per_round]):.2f}",
            f"{median([t['sink-s3'] for t in run.per_round]):.2f}", f"{median(rounds):.3f}"]]))
    print()
    if smoke:
        verdict = "not judged (--smoke)"
    elif quick:
        verdict = "not judged (--quick: too few batches)"
    elif high <= S3_TARGET:
        verdict = "met"
    elif low > S3_TARGET:
        verdict = f"NOT met (by {(total / S3_TARGET - 1) * 100:.1f} % of the target)"
    else:
        verdict = (f"{'met' if total <= S3_TARGET else 'NOT met'} by the ratio, undecided by "
                   "the interval (it holds the target)")
    own = median(run.own_ms)
    print(f"* target: DeltaSink <= {S3_TARGET}x plain append on S3. DeltaSink (tag path, "
          f"ledger beside the table) / plain: {total:.3f}x [{low:.3f}-{high:.3f}] over all "
          f"{n} timed batches: {verdict}; per round " + ", ".join(f"{q:.3f}" for q in rounds)
          + f" (median {median(rounds):.3f}); paired batch median {paired:.3f}; commit path "
          + "/".join(sorted(run.paths)))
    print(f"* per batch, median: plain append {median(plain) * 1000:.0f} ms; the sink "
          f"{median(sink) * 1000:.0f} ms, of it Delta's write {median(run.write_ms):.0f} ms and "
          f"its own steps {own:.1f} ms (min {min(run.own_ms):.1f}, max "
          f"{max(run.own_ms):.1f}; {own / 1000 / median(plain) * 100:.1f} % of a plain append)")
    put, get, delete = run.latency_ms
    print(f"* the ledger's object-store requests per batch (ledger_requests, the lease's "
          f"renewals aside): min {min(run.requests)}, median {median(run.requests):g}, max "
          f"{max(run.requests)} over the {len(run.requests)} timed batches; the run's first "
          f"batch (binding, lists, lease taken aside) {median(run.first_requests):g}; one "
          f"small request to this server: PUT {put:.1f} ms, GET {get:.1f} ms, DELETE "
          f"{delete:.1f} ms (median of 20 each)")
    if run.lease_s > 0:
        print(f"* the lease's requests in the background: {run.lease_requests} in "
              f"{run.lease_s:.0f} s held, {run.lease_requests / run.lease_s * 60:.1f} per minute")
