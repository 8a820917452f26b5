"""DeltaSink vs a plain Delta append of the same micro-batches: the wall-time ratio.

Run from the repository root::

    python -m benchmarks.delta_bench               # 6 batches x 500,000 rows, 7 rounds
    python -m benchmarks.delta_bench --quick       # 3 batches x 100,000 rows, 7 rounds

Every contender writes the same cached micro-batches (``--rows`` rows each of ``id bigint,
name string, amount double, ts timestamp``, ``--partitions`` partitions, materialised
before any timing) into its own fresh Delta table, batch by batch:

``plain``       ``df.write.format("delta").mode("append").save(path)``: at-least-once
``plain-txn``   the same with Delta's ``txnAppId``/``txnVersion`` options: Delta's own
                idempotent write as Delta 4.4 does it alone (it looks the version up in
                the snapshot's reconstructed state: one more Spark job per commit)
``delta-sink``  ``DeltaSink(path, sink_id=..., create_table=True)(df, batch_id)``:
                exactly-once on its default commit path, "tag" (userMetadata tag, the
                ledger's intent and lease, no Delta txn id, so no txn lookup; nothing
                hashed while writing: a replay is compared with the files its commit
                added); ``--path txn_seed|txn`` benchmarks another path in its place
``sink-txn-seed`` with ``--all-paths``: ``DeltaSink(..., delta_txn_id=True)``, Delta's txn
                id with the accelerator answering Delta's lookup from the checksum
``sink-txn``    with ``--all-paths``: ``DeltaSink(..., delta_txn_id=True, txn_seed=False)``,
                Delta's txn id, Delta reconstructs its state for every lookup

Each table first gets one small untimed write (batch 0: table creation; for the sink also
the start of its driver run: binding, the one read of the log), as a long-running stream has
it behind it; the timed batches are 1..N, the steady state. Interleaved: within a round,
batch ``i`` is written by every contender back to back, the order rotating with ``i`` and
the round, so that load changes hit all alike. A round's time per contender is the sum over
its batches. The reported ratio is the sink's wall time over the plain append's, summed over
every timed batch of every round (``--rounds``, default 7), with a 95 % bootstrap interval
over the batch pairs (batch ``i`` of the sink and of the plain append, written in the same
rotation): on a 2-core machine one round moves by +-5-10 %, so the interval says whether the
run decides the target. The medians of the round ratios and of the paired per-batch ratios
are printed too, and the sink's own cost, measured inside its call (its time minus Delta's
write, ``BatchMetrics.extra["write_ms"]``), which no load change between contenders moves.
Every table is checked after its round (row count and sum of ids), so a contender that loses
or duplicates rows fails the benchmark. The target (DeltaSink / plain <= 1.03) is printed
next to the measurement.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks._common import format_table, median, ratio_interval

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TARGET_RATIO = 1.03


def make_batches(spark: SparkSession, batches: int, rows: int, partitions: int) -> list[DataFrame]:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F  # noqa: N812

    out = []
    for b in range(batches):
        idc = F.col("id")
        df = spark.range(b * rows, (b + 1) * rows, 1, partitions).select(
            idc.alias("id"),
            F.concat(F.lit("customer-"), F.lpad((idc % 1_000_003).cast("string"), 7, "0"))
            .alias("name"),
            ((idc % 100_000) / F.lit(100.0)).alias("amount"),
            F.timestamp_micros(F.lit(1_700_000_000_000_000) + idc * 1001).alias("ts"),
        ).persist(StorageLevel.MEMORY_ONLY)
        df.count()
        out.append(df)
    return out


def check(spark: SparkSession, path: Path, rows: int) -> None:
    from pyspark.sql import functions as F  # noqa: N812

    got = spark.read.format("delta").load(str(path)).agg(F.count("*"), F.sum("id")).first()
    assert got is not None
    ids = rows - 1000  # the warm-up batch 0 repeats ids 0..999
    expected = (rows, ids * (ids - 1) // 2 + 999 * 1000 // 2)
    if (got[0], got[1]) != expected:
        raise SystemExit(f"{path}: table holds {got[0]} rows, sum {got[1]}; expected {expected}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500_000, help="rows per micro-batch")
    parser.add_argument("--batches", type=int, default=6, help="micro-batches per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="3 batches of 100,000 rows")
    parser.add_argument("--no-verify", action="store_true",
                        help="DeltaSink(verify_replay=False): replays not compared")
    parser.add_argument("--path", choices=["tag", "txn_seed", "txn"], default="tag",
                        help="the commit path of the delta-sink contender (default tag)")
    parser.add_argument("--all-paths", action="store_true",
                        help="also time sink-txn-seed and sink-txn side by side")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.batches = 100_000, 3
    if args.rounds < 3:
        parser.error("--rounds must be >= 3 (the ratio is a median)")
    logging.basicConfig(level=logging.WARNING)

    from connectors.delta import DeltaSink
    from connectors.spark import get_session

    path_options: dict[str, dict[str, object]] = {
        "tag": {}, "txn_seed": {"delta_txn_id": True},
        "txn": {"delta_txn_id": True, "txn_seed": False},
    }
    sink_kinds = {"delta-sink": path_options[args.path]}
    if args.all_paths:
        sink_kinds.update({"sink-txn-seed": path_options["txn_seed"],
                           "sink-txn": path_options["txn"]})

    spark = get_session("delta-bench", components=["delta"],
                        conf={"spark.sql.session.timeZone": "UTC"})
    spark.sparkContext.setLogLevel("ERROR")
    root = Path(tempfile.mkdtemp(prefix="delta-bench-"))
    load_before = os.getloadavg()
    started = time.monotonic()
    try:
        batches = make_batches(spark, args.batches, args.rows, args.partitions)
        # Warm-up (JIT, Delta's classes, Python workers): one small write of each kind.
        warmup = batches[0].limit(1000)
        warmup.write.format("delta").mode("append").save(str(root / "warm-plain"))
        DeltaSink(str(root / "warm-sink"), sink_id="warm", create_table=True)(warmup, 0)
        kinds = ["plain", "plain-txn", *sink_kinds]
        per_round: list[dict[str, float]] = []
        replay_s = 0.0
        paired: list[float] = []  # batch i of the sink / batch i of plain, written just
        # before or after it: load changes cancel out
        sink_s: list[float] = []  # every timed batch of the sink, and of plain beside it
        plain_s: list[float] = []
        own_ms: list[float] = []  # the sink's own steps: its call minus Delta's write
        warm = batches[0].limit(1000)
        for r in range(args.rounds):
            paths = {k: root / f"{k}-{r}" for k in kinds}
            sinks = {k: DeltaSink(str(paths[k]), sink_id="bench", create_table=True,
                                  verify_replay=not args.no_verify, **opts)  # type: ignore[arg-type]
                     for k, opts in sink_kinds.items()}
            sink = sinks["delta-sink"]
            # Batch 0, untimed: the table exists and the sink's run has started.
            warm.write.format("delta").mode("append").save(str(paths["plain"]))
            (warm.write.format("delta").mode("append").option("txnAppId", "bench")
             .option("txnVersion", 0).save(str(paths["plain-txn"])))
            for each in sinks.values():
                each(warm, 0)
            times = dict.fromkeys(kinds, 0.0)
            batch_times: dict[str, float] = {}
            for i, df in enumerate(batches, start=1):
                shift = (i + r) % len(kinds)
                for who in kinds[shift:] + kinds[:shift]:
                    t0 = time.perf_counter()
                    if who == "plain":
                        df.write.format("delta").mode("append").save(str(paths[who]))
                    elif who == "plain-txn":
                        (df.write.format("delta").mode("append").option("txnAppId", "bench")
                         .option("txnVersion", i).save(str(paths[who])))
                    else:
                        sinks[who](df, i)
                    batch_times[who] = time.perf_counter() - t0
                    times[who] += batch_times[who]
                    if who == "delta-sink":
                        assert sink.last_metrics is not None
                        own_ms.append(batch_times[who] * 1000
                                      - sink.last_metrics.extra["write_ms"])
                paired.append(batch_times["delta-sink"] / batch_times["plain"])
                sink_s.append(batch_times["delta-sink"])
                plain_s.append(batch_times["plain"])
            for k, each in sinks.items():
                assert each.last_metrics is not None
                ran = [key for key in each.last_metrics.extra if key.startswith("delta_path_")]
                want = {"delta-sink": args.path, "sink-txn-seed": "txn_seed",
                        "sink-txn": "txn"}[k]
                if ran != [f"delta_path_{want}"]:
                    print(f"! {k} took {ran}, not delta_path_{want}", flush=True)
                each.close()
            if r == args.rounds - 1:
                # What a crash costs at restart: the replay of the last batch, compared
                # with the files its commit added (two aggregation jobs), nothing written.
                again = DeltaSink(str(paths["delta-sink"]), sink_id="bench",
                                  verify_replay=not args.no_verify,
                                  **path_options[args.path])  # type: ignore[arg-type]
                t0 = time.perf_counter()
                again(batches[-1], len(batches))
                replay_s = time.perf_counter() - t0
                assert again.last_metrics is not None
                assert again.last_metrics.outcome == "replayed", again.last_metrics
                again.close()
            for k in kinds:
                check(spark, paths[k], args.rows * args.batches + 1000)
                shutil.rmtree(paths[k], ignore_errors=True)
            per_round.append(times)
            print(f"round {r}: " + ", ".join(f"{k} {times[k]:.2f} s" for k in kinds)
                  + f"; sink/plain {times['delta-sink'] / times['plain']:.3f}, "
                  f"sink/plain-txn {times['delta-sink'] / times['plain-txn']:.3f}", flush=True)
        for df in batches:
            df.unpersist()
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    vs_plain = [t["delta-sink"] / t["plain"] for t in per_round]
    vs_txn = [t["delta-sink"] / t["plain-txn"] for t in per_round]
    txn_cost = [t["plain-txn"] / t["plain"] for t in per_round]
    print()
    print(f"# {args.batches} micro-batches x {args.rows:,} rows, {args.partitions} partitions, "
          f"{args.rounds} interleaved rounds"
          + (" (verify_replay=False)" if args.no_verify else "")
          + f" (delta-sink path: {args.path})")
    print()
    rows = [
        [f"round {i}", *(f"{t[k]:.2f}" for k in kinds), f"{a:.3f}", f"{b:.3f}"]
        for i, (t, a, b) in enumerate(zip(per_round, vs_plain, vs_txn, strict=True))
    ]
    rows.append(["median", *(f"{median([t[k] for t in per_round]):.2f}" for k in kinds),
                 f"{median(vs_plain):.3f}", f"{median(vs_txn):.3f}"])
    print(format_table(["", "plain (s)", "plain + txn (s)", "DeltaSink (s)",
                        *(f"{k} (s)" for k in kinds[3:]),
                        "sink / plain", "sink / plain+txn"], rows))
    print()
    total = sum(sink_s) / sum(plain_s)
    low, high = ratio_interval(sink_s, plain_s)
    verdict = ("met" if total <= TARGET_RATIO else "NOT met") + (
        "" if high <= TARGET_RATIO or low > TARGET_RATIO
        else "; the interval holds the target: more --rounds decide it")
    print(f"* DeltaSink / plain Delta append, the wall time of all {len(sink_s)} timed batches: "
          f"{total:.3f}, 95 % interval {low:.3f}-{high:.3f} (bootstrap over the batch pairs; "
          f"target <= {TARGET_RATIO}: {verdict})")
    print(f"* the median of the {args.rounds} round ratios: {median(vs_plain):.3f}; of the "
          f"{len(paired)} paired per-batch ratios (batch i of the sink / batch i of plain, "
          f"back to back): {median(paired):.3f}")
    print(f"* the sink's own steps (its call minus Delta's write, measured inside the same "
          f"call): median {median(own_ms):.1f} ms per batch, "
          f"{median(own_ms) / 1000 / median(plain_s) * 100:.1f} % of a plain append")
    print(f"* Delta's own txnAppId/txnVersion write / plain: {median(txn_cost):.3f}; "
          f"DeltaSink / that: {median(vs_txn):.3f} (below 1: the tag path needs no txn "
          "lookup, the txn_seed path answers it from the commit's checksum; docs/delta.md)")
    for k in kinds[3:]:
        others = [t[k] / t["plain"] for t in per_round]
        print(f"* {k} / plain: median of the round ratios {median(others):.3f}")
    print(f"* once per crash: the replay of a recorded {args.rows:,}-row batch (checked "
          f"against its commit's files, nothing written) took {replay_s:.2f} s, including "
          "the start of the sink's driver run")
    load_after = os.getloadavg()
    print(f"* wall time {time.monotonic() - started:.0f} s; 1-min load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after, on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
