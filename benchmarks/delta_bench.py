"""DeltaSink vs a plain Delta append of the same micro-batches, with the accelerator on and off.

Run from the repository root::

    python -m benchmarks.delta_bench            # 6 batches x 500,000 rows, 13 rounds (~5-8 min)
    python -m benchmarks.delta_bench --s3-only  # the S3 run alone (6 x 100,000 rows, 13 rounds)
    python -m benchmarks.delta_bench --quick    # 3 x 100,000 rows, 3 rounds, + a short S3 run
    python -m benchmarks.delta_bench --smoke    # 1 x 2,000 rows, 1 round, + the same on S3:
                                                # every contender and check, no verdict (CI)

One run prints every contender side by side. Each writes the same cached micro-batches
(``--rows`` rows each of ``id bigint, name string, amount double, ts timestamp``,
``--partitions`` partitions, materialised before any timing) into its own fresh Delta table,
batch by batch:

=================  ==============================================================  ===========
contender          what                                                            accelerator
=================  ==============================================================  ===========
``plain``          ``df.write.format("delta").mode("append").save(path)``:         -
                   at-least-once, the reference of every ratio
``plain-txn``      the same with Delta's ``txnAppId``/``txnVersion`` options:       -
                   Delta's own idempotent write alone (Delta 4.4 looks the
                   version up in the snapshot's reconstructed state: one more
                   Spark job per commit)
``delta-sink``     ``DeltaSink(path, sink_id=..., create_table=True)``: the sink    not used
                   on its default commit path, "tag" (userMetadata tag, the
                   ledger's intent and lease, no Delta txn id, so no txn lookup
                   for an accelerator to answer; nothing hashed while writing)
``sink-txn-seed``  ``DeltaSink(..., delta_txn_id=True)``: Delta's txn id, its      ON
                   lookup answered from the commit's checksum by the accelerator
                   (``connectors.delta._txn_seed``, verified Delta 4.4.0 classes)
``sink-txn``       ``DeltaSink(..., delta_txn_id=True, txn_seed=False)``: Delta's   OFF
                   txn id, Delta reconstructs its state for every lookup
=================  ==============================================================  ===========

The Delta sink has one accelerator, and only its ``delta_txn_id=True`` paths have a lookup
for it to answer. It is switched per sink by the public ``txn_seed`` option (``None``, the
default: on wherever the classes are the verified ones; ``False``: off), and for the whole
process by ``CONNECTORS_ACCELERATORS=off``, which the library reads on every call (when a
sink's driver run picks its path and after every commit), not once per process. The bench
uses the constructor option, so the accelerator runs on and off side by side in one JVM;
with ``CONNECTORS_ACCELERATORS=off`` set, ``sink-txn-seed`` falls back to the txn path and
the bench says so. The path each sink took is read from its metrics
(``BatchMetrics.extra["delta_path_<path>"]``) and printed next to its figures.
``--path tag|txn_seed|txn`` times only that one sink path (with both plain contenders);
``--no-verify`` builds the sinks with ``verify_replay=False``.

Each table first gets one small untimed write (batch 0: table creation; for a sink also the
start of its driver run: binding, the one read of the log), as a long-running stream has it
behind it; the timed batches are 1..N, the steady state. Interleaved: within a round, batch
``i`` is written by every contender back to back, the order rotating with ``i`` and the
round, so that load changes hit all alike. Every table is checked after its round (row
count and sum of ids): a contender that loses or duplicates rows ends the benchmark with a
non-zero exit status. Nothing timed is asserted.

Reported per contender: its ratio to the plain append, the wall time of all its timed
batches over plain's, with a 95 % bootstrap interval over the batch pairs (batch ``i`` of
the contender and of plain, written in the same rotation; ``_common.ratio_interval``); the
medians of the round ratios and of the paired per-batch ratios; for a sink its own cost,
measured inside its call (its time minus Delta's write, ``BatchMetrics.extra["write_ms"]``),
which no load change between contenders moves. The target, DeltaSink <= 1.03x plain append,
is printed beside each sink's measurement with a verdict: met, NOT met, or undecided when
the interval holds 1.03 (then the bench estimates the rounds that would decide it).

Why 13 rounds: the margin to decide is 3 % (a sink at ~1.00x against the 1.03 target). On
this 2-core machine one batch pair moves by +-10-15 %, and 42 pairs (7 rounds of 6 batches,
2026-11-22) gave an interval 0.965-1.047, half-width 0.041; the width shrinks as one over
the square root of the pairs, so a half-width under 0.03 needs 42 x (0.041 / 0.03)^2 = 78
pairs: 13 rounds of 6 batches. A loaded machine (load above the core count) doubles the
width; the verdict then says "undecided" rather than claim the target. ``--quick`` (3
rounds of 3 small batches) is a smoke test: every contender, every row check, and no verdict
(its 9 batch pairs cannot decide a 3 % margin).

The S3 run (``--s3``: after the local one; ``--s3-only``: alone; ``_delta_s3``): DeltaSink on
its default path against a plain Delta append, both on ``s3a://`` tables of the S3 API that
``EOS_S3_ENDPOINT``/``EOS_S3_BUCKET``/``EOS_S3_ACCESS_KEY``/``EOS_S3_SECRET_KEY`` name (else
``.services.env``; refused when absent), the sink's ledger as objects beside its table. Same
method and rounds, ``--s3-rows`` rows per batch (100,000: the test services' S3 API, moto,
keeps every object in memory and serves one request at a time; each round's tables are
deleted after its check). Target <= 1.05x; printed beside it: the sink's own steps, its
ledger's requests per batch and the lease's renewals per minute. ``--quick`` includes a short
S3 run (3 x 20,000 rows, 3 rounds) when the S3 variables are set (an error without them under
``CI=true``; else skipped with a note); ``--no-s3`` leaves it out.

``--smoke`` (CI's smoke test) is for correctness only: every contender and the S3 run (same
rules as ``--quick``) at the smallest size, 1 round of 1 timed batch of 2,000 rows after each
table's batch 0, with the replay of a recorded batch and every table's check; no warm-up
tables (each round's batch 0 already starts every sink's driver run), no verdict.
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
from typing import TYPE_CHECKING, Any

from benchmarks._chart import Panel, default_chart_path, draw_chart
from benchmarks._common import (
    SMOKE_NOTE,
    format_table,
    make_batches,
    median,
    ratio_interval,
    ratio_verdict,
)
from benchmarks._delta_s3 import S3Run, report_s3, s3_part, s3_server

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from connectors.delta import DeltaSink

TARGET_RATIO = 1.03
DEFAULT_ROUNDS, QUICK_ROUNDS = 13, 3

#: Sink contender -> (its commit path, DeltaSink's options for it, the accelerator's part).
SINKS: dict[str, tuple[str, dict[str, Any], str]] = {
    "delta-sink": ("tag", {}, "not used (no txn lookup)"),
    "sink-txn-seed": ("txn_seed", {"delta_txn_id": True}, "ON"),
    "sink-txn": ("txn", {"delta_txn_id": True, "txn_seed": False}, "OFF (txn_seed=False)"),
}
PLAIN = ("plain", "plain-txn")


def check(spark: SparkSession, who: str, path: Path | str, rows: int) -> None:
    """The table holds every row exactly once (count and sum of ids), else exit 1."""
    from pyspark.sql import functions as F  # noqa: N812

    got = spark.read.format("delta").load(str(path)).agg(F.count("*"), F.sum("id")).first()
    assert got is not None
    ids = rows - 1000  # the warm-up batch 0 repeats ids 0..999
    expected = (rows, ids * (ids - 1) // 2 + 999 * 1000 // 2)
    if (got[0], got[1]) != expected:
        raise SystemExit(f"{who} ({path}): the table holds {got[0]} rows, sum of ids "
                         f"{got[1]}; expected {expected}: rows lost or duplicated")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500_000, help="rows per micro-batch")
    parser.add_argument("--batches", type=int, default=6, help="micro-batches per round")
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"default {DEFAULT_ROUNDS} ({QUICK_ROUNDS} with --quick)")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--quick", action="store_true",
                        help=f"3 batches of 100,000 rows, {QUICK_ROUNDS} rounds: a smoke test")
    parser.add_argument("--no-verify", action="store_true",
                        help="DeltaSink(verify_replay=False): replays not compared")
    parser.add_argument("--path", choices=["tag", "txn_seed", "txn"], default=None,
                        help="time only the sink on this commit path (default: all three)")
    parser.add_argument("--all-paths", action="store_true",
                        help="all three sink paths (the default now; kept for old commands)")
    parser.add_argument("--s3", action="store_true",
                        help="also the S3 run (the EOS_S3_* variables or .services.env)")
    parser.add_argument("--s3-only", action="store_true", help="only the S3 run")
    parser.add_argument("--smoke", action="store_true",
                        help="correctness only (CI): 1 batch of 2,000 rows, 1 round, + the "
                             "S3 run as small; every contender and check; no verdict")
    parser.add_argument("--no-s3", action="store_true",
                        help="--quick or --smoke without its S3 run")
    parser.add_argument("--s3-rows", type=int, default=None,
                        help="rows per micro-batch of the S3 run (100,000; 20,000 with --quick)")
    parser.add_argument("--chart", default=str(default_chart_path("delta_bench")),
                        help="the contenders' table as a PNG chart "
                             "(benchmarks/charts/delta_bench.png)")
    args = parser.parse_args(argv)
    if args.quick and args.smoke:
        parser.error("--quick or --smoke, not both")
    if args.quick:
        args.rows, args.batches = 100_000, 3
    if args.smoke:  # >= 1,000 rows: batch 0 (the first 1,000 of them) repeats its ids
        args.rows, args.batches = 2_000, 1
        args.rounds = 1 if args.rounds is None else args.rounds
    if args.s3_rows is None:
        args.s3_rows = 2_000 if args.smoke else 20_000 if args.quick else 100_000
    short = args.quick or args.smoke  # a run that judges nothing
    server, missing = s3_server()
    want_s3 = args.s3 or args.s3_only or (short and not args.no_s3)
    if want_s3 and server is None:
        why = (f"the S3 run needs {', '.join(missing)} (the environment or .services.env: "
               "`bash scripts/services start` writes them)")
        if args.s3 or args.s3_only or os.environ.get("CI") == "true":
            parser.error(why)
        print(f"* {'--smoke' if args.smoke else '--quick'} without its S3 run: {why}",
              flush=True)
        want_s3 = False
    if args.rounds is None:
        args.rounds = QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS
    if args.rounds < 3 and not args.smoke:
        parser.error("--rounds must be >= 3 (the round ratio is a median)")
    logging.basicConfig(level=logging.WARNING)
    # sink-txn's driver runs each log that the accelerator is off (txn_seed=False), once per
    # round: the table below says so once.
    logging.getLogger("connectors.delta._table_commits").setLevel(logging.ERROR)

    from connectors.delta import DeltaSink
    from connectors.delta._txn_seed import ACCELERATORS_ENV, seed_problem
    from connectors.spark import get_session

    sink_kinds = {k: v for k, v in SINKS.items() if args.path in (None, v[0])}
    head = next(iter(sink_kinds))  # the default path's sink unless --path says another
    kinds = [*PLAIN, *sink_kinds]

    s3_confs = server.hadoop_confs() if want_s3 and server is not None else {}
    spark = get_session("delta-bench", components=["delta", "s3"] if s3_confs else ["delta"],
                        conf={"spark.sql.session.timeZone": "UTC", **s3_confs})
    spark.sparkContext.setLogLevel("ERROR")
    s3_run: S3Run | None = None
    if args.s3_only:
        assert server is not None
        try:
            s3_run = s3_part(spark, server, args, make_batches, check)
        finally:
            spark.stop()
        report_s3(s3_run, server, quick=args.quick, smoke=args.smoke)
        return 0
    problem = seed_problem(spark)  # why the accelerator cannot run here (None: it can)
    root = Path(tempfile.mkdtemp(prefix="delta-bench-"))
    load_before = os.getloadavg()
    started = time.monotonic()
    per_round: list[dict[str, float]] = []
    batch_s: dict[str, list[float]] = {k: [] for k in kinds}  # every timed batch, by kind:
    # index j of each list is the same batch of the same round, written in one rotation
    own_ms: dict[str, list[float]] = {k: [] for k in sink_kinds}  # call minus Delta's write
    took: dict[str, set[str]] = {k: set() for k in sink_kinds}  # commit paths observed
    replay_s = 0.0
    try:
        batches = make_batches(spark, args.batches, args.rows, args.partitions)
        # Warm-up (JIT, Delta's classes, Python workers): one small write of each kind.
        warm = batches[0].limit(1000)
        if not args.smoke:  # each round's batch 0 goes the same ways, untimed
            warm.write.format("delta").mode("append").save(str(root / "warm-plain"))
            for k, (_, opts, _) in sink_kinds.items():
                DeltaSink(str(root / f"warm-{k}"), sink_id="warm", create_table=True,
                          **opts)(warm, 0)
        for r in range(args.rounds):
            paths = {k: root / f"{k}-{r}" for k in kinds}
            sinks: dict[str, DeltaSink] = {
                k: DeltaSink(str(paths[k]), sink_id="bench", create_table=True,
                             verify_replay=not args.no_verify, **opts)
                for k, (_, opts, _) in sink_kinds.items()}
            # Batch 0, untimed: the table exists and the sink's run has started.
            warm.write.format("delta").mode("append").save(str(paths["plain"]))
            (warm.write.format("delta").mode("append").option("txnAppId", "bench")
             .option("txnVersion", 0).save(str(paths["plain-txn"])))
            for each in sinks.values():
                each(warm, 0)
            times = dict.fromkeys(kinds, 0.0)
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
                    spent = time.perf_counter() - t0
                    times[who] += spent
                    batch_s[who].append(spent)
                    if who in sinks:
                        metrics = sinks[who].last_metrics
                        assert metrics is not None
                        own_ms[who].append(spent * 1000 - metrics.extra["write_ms"])
                        took[who].update(key.removeprefix("delta_path_")
                                         for key in metrics.extra
                                         if key.startswith("delta_path_"))
            for each in sinks.values():
                each.close()
            if r == args.rounds - 1:
                # What a crash costs at restart: the replay of the last batch, compared
                # with the files its commit added (two aggregation jobs), nothing written.
                again = DeltaSink(str(paths[head]), sink_id="bench",
                                  verify_replay=not args.no_verify, **sink_kinds[head][1])
                t0 = time.perf_counter()
                again(batches[-1], len(batches))
                replay_s = time.perf_counter() - t0
                assert again.last_metrics is not None
                assert again.last_metrics.outcome == "replayed", again.last_metrics
                again.close()
            for k in kinds:
                check(spark, k, paths[k], args.rows * args.batches + 1000)
                shutil.rmtree(paths[k], ignore_errors=True)
            per_round.append(times)
            print(f"round {r}: " + ", ".join(f"{k} {times[k]:.2f} s" for k in kinds)
                  + "; / plain: " + ", ".join(f"{k} {times[k] / times['plain']:.3f}"
                                              for k in kinds[1:]), flush=True)
        for df in batches:
            df.unpersist()
        local_s, load_after = time.monotonic() - started, os.getloadavg()
        if want_s3:
            assert server is not None
            s3_run = s3_part(spark, server, args, make_batches, check)
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)

    def accelerator(k: str) -> str:
        if k not in sink_kinds:
            return "-"
        want, _, part = sink_kinds[k]
        if took[k] != {want}:
            return f"{part}? took {'/'.join(sorted(took[k]))}" + (
                f" ({problem})" if problem else "")
        return part

    n = len(batch_s["plain"])
    print()
    print(f"# {args.batches} micro-batches x {args.rows:,} rows, {args.partitions} partitions, "
          f"{args.rounds} interleaved rounds ({n} batch pairs per contender)"
          + (", verify_replay=False" if args.no_verify else ""))
    print("# the accelerator (Delta txn lookup from the checksum): "
          + ("available in this driver" if problem is None else f"unavailable: {problem}")
          + f"; {ACCELERATORS_ENV}={os.environ.get(ACCELERATORS_ENV, '(unset)')}")
    print()
    print(format_table(
        ["round", *(f"{k} (s)" for k in kinds)],
        [[str(i), *(f"{t[k]:.2f}" for k in kinds)] for i, t in enumerate(per_round)]
        + [["median", *(f"{median([t[k] for t in per_round]):.2f}" for k in kinds)]]))
    print()
    rows = []
    summary: dict[str, tuple[float, float, float]] = {}
    for k in kinds:
        total = sum(batch_s[k]) / sum(batch_s["plain"])
        low, high = ratio_interval(batch_s[k], batch_s["plain"])
        summary[k] = (total, low, high)
        rounds_ratio = median([t[k] / t["plain"] for t in per_round])
        paired = median([a / b for a, b in zip(batch_s[k], batch_s["plain"], strict=True)])
        path = ("/".join(sorted(took[k])) if k in sink_kinds
                else "txnAppId" if k == "plain-txn" else "-")
        rows.append([k, path, accelerator(k), f"{median([t[k] for t in per_round]):.2f}",
                     f"{total:.3f} [{low:.3f}-{high:.3f}]" if k != "plain" else "1",
                     f"{rounds_ratio:.3f}", f"{paired:.3f}",
                     f"{median(own_ms[k]):.1f}" if k in own_ms else "-"])
    print(format_table(["contender", "commit path", "accelerator", "round median (s)",
                        "/ plain, all batches [95 %]", "round ratio median",
                        "paired batch median", "sink's own ms/batch"], rows, align="lll"))
    print()
    if args.chart:
        panel = Panel(f"{args.batches} batches x {args.rows:,} rows per round",
                      {k: [t[k] / t["plain"] for t in per_round] for k in kinds[1:]},
                      "the contender's wall time / a plain Delta append's (per round)",
                      better="lower")
        chart = draw_chart(args.chart, "delta_bench: DeltaSink vs a plain append", [panel])
        print(f"chart: {chart}")
        print()
    plain_batch = median(batch_s["plain"])
    print(f"* target: DeltaSink <= {TARGET_RATIO}x plain append (wall time of all {n} timed "
          "batches, 95 % bootstrap interval over the batch pairs)")
    for k in sink_kinds:
        total, low, high = summary[k]
        label = {"delta-sink": "DeltaSink, default path (tag; the accelerator not used)",
                 "sink-txn-seed": "DeltaSink(delta_txn_id=True), accelerator ON",
                 "sink-txn": "DeltaSink(delta_txn_id=True, txn_seed=False), accelerator OFF",
                 }[k]
        print(f"  - {label}: {total:.3f}x [{low:.3f}-{high:.3f}]: "
              + ("not judged (--smoke)" if args.smoke
                 else "not judged (--quick: too few batches)" if args.quick
                 else ratio_verdict(total, low, high, args.rounds, TARGET_RATIO))
              + "; its own steps "
              f"{median(own_ms[k]):.1f} ms per batch "
              f"({median(own_ms[k]) / 1000 / plain_batch * 100:.1f} % of a plain append)")
    total, low, high = summary["plain-txn"]
    print(f"* Delta's own txnAppId/txnVersion write / plain: {total:.3f}x [{low:.3f}-{high:.3f}]"
          " (Delta 4.4 reconstructs the table state for the txn lookup on every commit; "
          "docs/delta.md)")
    print(f"* once per crash: the replay of a recorded {args.rows:,}-row batch by {head} "
          f"(checked against its commit's files, nothing written) took {replay_s:.2f} s, "
          "including the start of the sink's driver run")
    print(f"* every table checked after every round (rows, sum of ids): exact; wall time "
          f"{local_s:.0f} s; 1-min load average {load_before[0]:.1f} "
          f"before, {load_after[0]:.1f} after, on {os.cpu_count()} CPUs")
    if s3_run is not None and server is not None:
        report_s3(s3_run, server, quick=args.quick, smoke=args.smoke)
    if args.smoke:
        print(f"* {SMOKE_NOTE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
