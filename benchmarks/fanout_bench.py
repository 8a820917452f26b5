"""A fan-out's batch time against the hand-written composition, side by side (issue 41).

One Spark session (``local[2]``, Delta's jars) writes the same batches two ways, each into
targets of its own: a PostgreSQL table (``PostgresSink``), a Kafka topic (``KafkaSink``, 2
slots; key ``id``, value the row as JSON) and a Delta table (``DeltaSink``):

- ``fan-out``: ``FanOut(pg, (kafka, records), delta)``: one decision per batch;
- ``one after another``: ``pg(df, r); kafka(records(df), r); delta(df, r)``, what users
  write by hand (each target exactly once on its own, no decision across them).

Both are called as batch jobs (``run_batch`` / ``fan.run_batch``, run ids 0, 1, ...) with
the same input per round (``--rows`` rows, cached before timing, so neither pays the read),
alternating which goes first. The first ``--warmup`` rounds are not counted, and a
throwaway Delta table of 11 commits warms Delta's checkpoint writer first (its first use
in a JVM costs ~1.5 s: it landed on whichever way committed version 10 first). Printed: each
round's two times, then the median of each, the ratio fan-out / one after another (median,
and its spread: min-max over the rounds). After the rounds each target's rows are checked
(every id once); a failure ends with a non-zero exit status. Nothing timed is asserted.

PostgreSQL and Kafka come from ``$EOS_POSTGRES_CONNINFO`` / ``$EOS_KAFKA_BOOTSTRAP`` or
``.services.env``. ``python -m benchmarks.fanout_bench`` (20,000 rows, 2 + 10 rounds,
~6 min on 2 cores); ``--quick`` (2,000 rows, 1 + 3 rounds, a short run); ``--smoke``
(CI's smoke test, correctness only: 2,000 rows, 1 + 1 rounds, both ways and every target's
check, without the checkpoint writer's warm-up table, which only evens out the timing;
no verdict).
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import psycopg
from confluent_kafka.admin import AdminClient
from psycopg import sql

from benchmarks._common import SMOKE_NOTE, load_service_env


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fanout_bench",
                                description=(__doc__ or "").splitlines()[0])
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="2,000 rows, 1 + 3 rounds")
    p.add_argument("--smoke", action="store_true",
                   help="correctness only (CI): 2,000 rows, 1 + 1 rounds, no checkpoint "
                        "warm-up table; every check; no verdict")
    return p


def _input(spark: Any, rows: int, round_no: int) -> Any:
    from pyspark.sql import functions as sf

    start = round_no * rows
    return (spark.range(start, start + rows, numPartitions=2)
            .select(sf.col("id"), sf.concat(sf.lit("name-"), sf.col("id").cast("string"))
                    .alias("name"), (sf.col("id") * 0.25).alias("amount"),
                    sf.timestamp_seconds(sf.col("id")).alias("ts")))


def _targets(conninfo: str, bootstrap: str, token: str, way: str, root: str) -> dict[str, Any]:
    from connectors.delta import DeltaSink
    from connectors.kafka import KafkaSink
    from connectors.postgres import PostgresSink

    base = f"fb-{token}-{way}"
    return {
        "pg": PostgresSink(conninfo, f"public.eos_fbench_{token}_{way}", sink_id=f"{base}-pg",
                           ledger_table=f"public.eos_fbench_{token}_l", create_table=True),
        "kafka": KafkaSink(f"eos-fbench-{token}-{way}", {"bootstrap.servers": bootstrap},
                           sink_id=f"{base}-k", slots=2, create_topic=True),
        "delta": DeltaSink(f"{root}/{way}", sink_id=f"{base}-d", create_table=True),
    }


def _check(spark: Any, conninfo: str, bootstrap: str, token: str, root: str,
           total: int) -> list[str]:
    """Every target of both ways holds ids 0..total-1 exactly once; the problems found."""
    from integration.support._kafka import read_all

    problems = []
    for way in ("fan", "seq"):
        with psycopg.connect(conninfo) as conn:
            n, distinct = conn.execute(sql.SQL("SELECT count(*), count(DISTINCT id) FROM {}")
                                       .format(sql.Identifier(f"eos_fbench_{token}_{way}"))
                                       ).fetchone() or (0, 0)
        ids = [int(m.key or b"-1") for m in read_all(bootstrap, f"eos-fbench-{token}-{way}")]
        delta = spark.read.format("delta").load(f"{root}/{way}")
        for name, (count, unique) in (("postgres", (n, distinct)),
                                      ("kafka", (len(ids), len(set(ids)))),
                                      ("delta", (delta.count(),
                                                 delta.select("id").distinct().count()))):
            if (count, unique) != (total, total):
                problems.append(f"{way} {name}: {count} rows, {unique} distinct, want {total}")
    return problems


def _cleanup(conninfo: str, bootstrap: str, token: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE %s",
            [f"eos_fbench_{token}%"]).fetchall()]
        for name in names:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [t for t in admin.list_topics(timeout=30).topics if f"fb-{token}" in t
              or f"fbench-{token}" in t]
    if topics:
        for future in admin.delete_topics(topics, operation_timeout=30).values():
            future.result(30)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.quick and args.smoke:
        parser.error("--quick or --smoke, not both")
    if args.quick:
        args.rows, args.rounds, args.warmup = 2_000, 3, 1
    if args.smoke:  # > 1,000 rows: the Kafka sink's batches go through its shuffle
        args.rows, args.rounds, args.warmup = 2_000, 1, 1
    conninfo = load_service_env("EOS_POSTGRES_CONNINFO")
    bootstrap = load_service_env("EOS_KAFKA_BOOTSTRAP")
    if not conninfo or not bootstrap:
        print("no services: run `bash scripts/services start` first", file=sys.stderr)
        return 2
    from connectors import FanOut
    from examples.stream_fan_out import records
    from examples.stream_to_delta import build_session

    spark = build_session("local[2]", ["spark.sql.shuffle.partitions=2"])
    token = secrets.token_hex(3)
    root = tempfile.mkdtemp(prefix="eos-fbench-")
    fan_t = _targets(conninfo, bootstrap, token, "fan", root)
    seq_t = _targets(conninfo, bootstrap, token, "seq", root)
    fan = FanOut(fan_t["pg"], (fan_t["kafka"], records), fan_t["delta"], sink_id=f"fb-{token}")

    def one_after_another(df: Any, run_id: int) -> None:
        seq_t["pg"].run_batch(df, run_id)
        seq_t["kafka"].run_batch(records(df), run_id)
        seq_t["delta"].run_batch(df, run_id)

    # Delta writes a checkpoint every 10th commit; the first one in a JVM loads and compiles
    # its writer (~1.5 s here), which would land on whichever way commits version 10 first.
    warm = f"{root}/checkpoint-warm-up"
    for i in range(0 if args.smoke else 11):
        _input(spark, 10, i).write.format("delta").mode("append").save(warm)
    ways: dict[str, Callable[[Any, int], Any]] = {"fan": fan.run_batch,
                                                  "seq": one_after_another}
    times: dict[str, list[float]] = {"fan": [], "seq": []}
    try:
        for r in range(args.warmup + args.rounds):
            df = _input(spark, args.rows, r).persist()
            df.count()
            order = ("fan", "seq") if r % 2 == 0 else ("seq", "fan")
            took = {}
            for way in order:
                started = time.perf_counter()
                ways[way](df, r)
                took[way] = time.perf_counter() - started
            df.unpersist()
            counted = r >= args.warmup
            if counted:
                for way in ways:
                    times[way].append(took[way])
            print(f"round {r:2d}{'' if counted else ' (warm-up)'}: fan-out "
                  f"{took['fan'] * 1000:7.0f} ms, one after another {took['seq'] * 1000:7.0f} "
                  f"ms, ratio {took['fan'] / took['seq']:.3f}", flush=True)
        problems = _check(spark, conninfo, bootstrap, token, root,
                          args.rows * (args.warmup + args.rounds))
    finally:
        fan.close()
        for sink in seq_t.values():
            sink.close()
        _cleanup(conninfo, bootstrap, token)
        spark.stop()
    ratios = [f / s for f, s in zip(times["fan"], times["seq"], strict=True)]
    print()
    print("| way | median ms/batch | min-max ms |")
    print("|:--|--:|--:|")
    for way, label in (("fan", "fan-out"), ("seq", "one after another")):
        print(f"| {label} | {statistics.median(times[way]) * 1000:.0f} | "
              f"{min(times[way]) * 1000:.0f}-{max(times[way]) * 1000:.0f} |")
    print(f"\nfan-out / one after another, per round: median {statistics.median(ratios):.3f}, "
          f"min-max {min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)} rounds "
          f"({args.rows} rows a batch; target <= 1.1"
          + (f"; {SMOKE_NOTE})" if args.smoke else ")"))
    for problem in problems:
        print(f"NOT EXACT: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
