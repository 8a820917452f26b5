"""Kafka write throughput: KafkaSink against Spark's built-in Kafka writer and a plain
confluent-kafka producer loop.

Run from the repository root, with Kafka up (``scripts/services start``)::

    python -m benchmarks.kafka_bench            # 500,000 records per run, 9 runs each
    python -m benchmarks.kafka_bench --quick    # 100,000 records, 1 run: a smoke test

For each value size (``--sizes``, default 100 and 1000 bytes) every contender writes the
same cached DataFrame (``key`` = the id as a string, ``value`` = the id padded to the
size; ``--partitions`` partitions, materialised before any timing) into its own topic with
``--topic-partitions`` partitions:

``spark-kafka``         ``df.write.format("kafka")``: Spark's built-in writer (Kafka's Java
                        producer, idempotent, acks=all), at-least-once
``kafka-sink``          ``connectors.kafka.KafkaSink`` as configured by default
                        (``barrier=False``: records validated in the slotting shuffle's
                        map stage before the slots run; slot producers kept by the Python
                        workers between batches): exactly-once; the deterministic slotting
                        shuffle included
``kafka-sink-fresh``    the default sink with ``reuse_producers=False``: every slot task
                        starts a new producer (``init_transactions``), as before the
                        producers were kept
``kafka-sink-barrier``  the default sink with ``barrier=True`` (one barrier stage)
``plain-producer``      no Spark: ``--partitions`` processes, each a confluent-kafka
                        ``produce()`` loop over pre-built Python bytes (what a Python
                        producer record by record reaches without Spark)

Before timing, every Spark contender writes ``--warm-runs`` (12) full-size batches,
untimed, in rounds: the JVM's JIT compilers still took 1.6-2.1 CPU-s per round of the four
contenders in rounds 2-6 (about half a core over a ~3.7 s round), and 0.3-1.2 CPU-s (median
0.6) in rounds 10-29; a stream that runs for hours is further along still. Written alone,
Spark's writer took 0.97 s for its second 500k-record batch of 100 B and 0.51-0.56 s from
the seventh on. The table's "JIT ms per run" (the compilers' time during a timed run,
median) shows how settled the JVM was. Timed runs are interleaved (round ``r`` starts
with contender ``r``), every run is checked (the topic's ``read_committed`` end offsets
grew by at least the record count), and
msgs/s is the median over the runs; the sink's ratio is also given per round (Spark's
writer's time over the sink's in the same round), whose median moves less than the ratio
of the medians when the machine's pace drifts during a run. A second part writes tiny
batches (``--tiny-rows``) back to back, as ``foreachBatch`` would in a low-latency stream,
and reports the per-batch cost of the sink's transactions, fencing and barrier over
Spark's writer. Nothing is asserted: the target (KafkaSink >= 1.0x Spark's writer) is
printed next to the results.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import platform
import sys
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from benchmarks._common import (
    format_table,
    load_service_env,
    machine_cpu_seconds,
    median,
    ratio_interval,
    stopwatch,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

logger = logging.getLogger("benchmarks.kafka_bench")

TARGET_VS_SPARK = 1.0
CONTENDERS = ("spark-kafka", "kafka-sink", "kafka-sink-fresh", "kafka-sink-barrier",
              "plain-producer")
#: Those also timed with tiny batches (the per-batch overhead).
TINY = ("spark-kafka", "kafka-sink", "kafka-sink-fresh", "kafka-sink-barrier")
Writer = Callable[["DataFrame", str], None]


def make_df(spark: SparkSession, rows: int, size: int, partitions: int) -> DataFrame:
    from pyspark.sql import functions as sf

    df = spark.range(0, rows, 1, partitions).select(
        sf.col("id").cast("string").alias("key"),
        sf.rpad(sf.col("id").cast("string"), size, "x").cast("binary").alias("value"),
    )
    df = df.cache()
    assert df.count() == rows
    return df


def end_offsets(bootstrap: str, topic: str) -> int:
    """Sum of the read_committed end offsets of ``topic`` (control records included)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                         "isolation.level": "read_committed"})
    try:
        for attempt in range(20):  # a topic created a moment ago may have no leader yet
            try:
                meta = consumer.list_topics(topic, timeout=30)
                return sum(
                    consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30,
                                                   cached=False)[1]
                    for p in meta.topics[topic].partitions)
            except KafkaException:
                if attempt == 19:
                    raise
                time.sleep(0.5)
        raise AssertionError("unreachable")
    finally:
        consumer.close()


#: Per output partition: the broker keeps about this much (older segments deleted), so that
#: a run, which writes ~45 GB at 1 KB, does not fill the broker's disk. The checks read end
#: offsets, which deletion leaves alone.
RETAINED_BYTES = 256 * 1024 * 1024
SEGMENT_BYTES = 64 * 1024 * 1024


def create_topic(admin: AdminClient, name: str, partitions: int) -> None:
    config = {"retention.bytes": str(RETAINED_BYTES), "segment.bytes": str(SEGMENT_BYTES)}
    admin.create_topics([NewTopic(name, partitions, 1, config=config)])[name].result(60)


def _plain_worker(args: tuple[str, str, int, int, int]) -> int:
    bootstrap, topic, start, count, size = args
    keys = [str(i).encode() for i in range(start, start + count)]
    values = [str(i).encode().ljust(size, b"x") for i in range(start, start + count)]
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "batch.size": 1_000_000, "enable.idempotence": True, "acks": "all",
                         "queue.buffering.max.messages": 500_000})
    produce, poll = producer.produce, producer.poll
    for i in range(count):
        while True:
            try:
                produce(topic, values[i], keys[i])
                break
            except BufferError:
                poll(0.05)
    assert producer.flush(120) == 0
    return count


def plain_producer(bootstrap: str, topic: str, rows: int, size: int, procs: int) -> float:
    """Seconds for ``procs`` processes to produce ``rows`` records (building the Python
    bytes is not timed: the near-limit of the client library)."""
    ctx = multiprocessing.get_context("fork")
    share = rows // procs
    jobs = [(bootstrap, topic, i * share, share if i < procs - 1 else rows - i * share, size)
            for i in range(procs)]
    with ctx.Pool(procs) as pool, stopwatch() as t:
        assert sum(pool.map(_plain_worker, jobs)) == rows
    # Building the key/value lists is inside the pool: time it alone and subtract.
    with stopwatch() as build:
        for job in jobs[:1]:
            _s, _c = job[2], job[3]
            [str(i).encode() for i in range(_s, _s + _c)]
            [str(i).encode().ljust(size, b"x") for i in range(_s, _s + _c)]
    return max(t[0] - build[0], 1e-9)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=500_000, help="records per run (500,000)")
    p.add_argument("--runs", type=int, default=9,
                   help="timed runs per contender (9; single rounds of Spark's writer moved "
                        "by up to 30 %% within one run on a 2-core machine)")
    p.add_argument("--warm-runs", type=int, default=12,
                   help="untimed full-size runs per Spark contender first (12): the JVM's "
                        "JIT compilers took 1.6-2.1 CPU-s per round of the four "
                        "contenders in rounds 2-6, 0.3-1.2 in rounds 10-29")
    p.add_argument("--quick", action="store_true", help="smoke test: 100,000 rows, 1 run")
    p.add_argument("--sizes", default="100,1000", help="value sizes in bytes (100,1000)")
    p.add_argument("--partitions", type=int, default=2, help="input partitions = slots (2)")
    p.add_argument("--topic-partitions", type=int, default=2)
    p.add_argument("--tiny-rows", type=int, default=100, help="records per tiny batch (100)")
    p.add_argument("--tiny-batches", type=int, default=10, help="timed tiny batches (10)")
    p.add_argument("--bootstrap", default=None, help="default: $EOS_KAFKA_BOOTSTRAP")
    p.add_argument("--driver-memory", default="3g")
    p.add_argument("--json", default=None, help="also write the results to this file")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.runs, args.tiny_batches, args.warm_runs = 100_000, 1, 5, 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    bootstrap = load_service_env("EOS_KAFKA_BOOTSTRAP", args.bootstrap)
    if not bootstrap:
        print("no Kafka: pass --bootstrap or run scripts/services start", file=sys.stderr)
        return 2
    from connectors.kafka import KafkaSink
    from connectors.spark import get_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = get_session("kafka-bench", master=f"local[{args.partitions}]", components=["kafka"],
                        conf={"spark.driver.memory": args.driver_memory,
                              "spark.ui.enabled": "false",
                              "spark.sql.shuffle.partitions": str(args.partitions)})
    spark.sparkContext.setLogLevel("ERROR")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tag = uuid.uuid4().hex[:6]
    results: dict[str, Any] = {
        "rows": args.rows, "runs": args.runs, "sizes": {},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    batch_ids: dict[str, int] = {}
    sinks: dict[str, Any] = {}
    created: list[str] = []

    def topic_for(name: str, size: int) -> str:
        topic = f"bench-{tag}-{name}-{size}"
        if topic not in created:
            create_topic(admin, topic, args.topic_partitions)
            created.append(topic)
        return topic

    def sink_for(name: str, topic: str, size: int) -> Any:
        key = f"{name}-{size}"
        if key not in sinks:
            sinks[key] = KafkaSink(topic, {"bootstrap.servers": bootstrap},
                                   sink_id=f"bench-{tag}-{key}"[:40], slots=args.partitions,
                                   barrier=name.startswith("kafka-sink-barrier"),
                                   reuse_producers=not name.startswith("kafka-sink-fresh"))
            batch_ids[key] = 0
        return sinks[key]

    cpu: dict[str, list[float]] = {}
    jit: dict[str, list[float]] = {}
    # The JVM's JIT compilers' time (ms, all compiler threads): a run that still pays for
    # compiling Spark's planner and the task code is not at its steady pace.
    compilation = spark.sparkContext._jvm.java.lang.management.ManagementFactory \
        .getCompilationMXBean()

    def run(name: str, df: DataFrame, rows: int, size: int, phase: str) -> float:
        topic = topic_for(name if phase == "big" else f"{name}-t", size)
        before = end_offsets(bootstrap, topic)
        cpu_before = machine_cpu_seconds()
        jit_before = compilation.getTotalCompilationTime()
        if name == "plain-producer":
            seconds = plain_producer(bootstrap, topic, rows, size, args.partitions)
        elif name == "spark-kafka":
            with stopwatch() as t:
                (df.write.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                 .option("topic", topic).save())
            seconds = t[0]
        else:
            sink = sink_for(name + ("" if phase == "big" else "-t"), topic, size)
            key = f"{name + ('' if phase == 'big' else '-t')}-{size}"
            with stopwatch() as t:
                sink(df, batch_ids[key])
            batch_ids[key] += 1
            seconds = t[0]
            m = sink.last_metrics
            if m is not None:
                results.setdefault("metrics", []).append(
                    {"contender": name, "size": size, "phase": phase, **m.extra,
                     "prepare_ms": m.prepare_ms, "decide_ms": m.decide_ms})
        cpu_after = machine_cpu_seconds()
        if cpu_before is not None and cpu_after is not None:
            cpu.setdefault(f"{name}/{phase}/{size}", []).append(cpu_after - cpu_before)
        if name != "plain-producer":
            jit.setdefault(f"{name}/{phase}/{size}", []).append(
                compilation.getTotalCompilationTime() - jit_before)
        grown = end_offsets(bootstrap, topic) - before
        assert grown >= rows, f"{name}: the topic grew by {grown} < {rows} records"
        return seconds

    try:
        for size in [int(s) for s in args.sizes.split(",")]:
            df = make_df(spark, args.rows, size, args.partitions)
            tiny = make_df(spark, args.tiny_rows, size, args.partitions)
            for name in CONTENDERS:  # warm-up: JIT, topics, sinks' internal topics
                run(name, tiny, args.tiny_rows, size, "warm")
                # The timed topics and sinks too: a first write to a new topic (and a sink's
                # first batch, which starts its driver run) took 2-3x a steady one.
                run(name, tiny, args.tiny_rows, size, "big")
            for _ in range(args.warm_runs):  # steady state: full-size batches, untimed
                for name in CONTENDERS:
                    if name != "plain-producer":  # new processes every run: nothing to warm
                        run(name, df, args.rows, size, "big")
            times: dict[str, list[float]] = {n: [] for n in CONTENDERS}
            cpu.clear()  # the timed runs only
            jit.clear()
            for r in range(args.runs):
                order = CONTENDERS[r % len(CONTENDERS):] + CONTENDERS[:r % len(CONTENDERS)]
                for name in order:
                    times[name].append(run(name, df, args.rows, size, "big"))
            tiny_times: dict[str, list[float]] = {n: [] for n in TINY}
            for _ in range(args.tiny_batches):
                for name in TINY:
                    tiny_times[name].append(run(name, tiny, args.tiny_rows, size, "tiny"))
            df.unpersist()
            tiny.unpersist()
            rates = {n: args.rows / median(ts) for n, ts in times.items()}
            tiny_ms = {n: 1000 * median(ts) for n, ts in tiny_times.items()}
            # Machine CPU-seconds per timed run (every process, the broker included).
            cpu_s = {n: median(cpu[k]) for n in CONTENDERS
                     if (k := f"{n}/big/{size}") in cpu and cpu[k]}
            jit_ms = {n: median(jit[k]) for n in CONTENDERS
                      if (k := f"{n}/big/{size}") in jit and jit[k]}
            results["sizes"][str(size)] = {"msgs_per_s": rates, "seconds": times,
                                           "tiny_batch_ms": tiny_ms, "cpu_seconds": cpu_s,
                                           "jit_ms": jit_ms}
            rows_out = [
                [n, f"{rates[n]:,.0f}", f"{rates[n] * size / 1e6:,.1f}",
                 f"{rates[n] / rates['spark-kafka']:.2f}x",
                 f"{cpu_s[n]:.2f}" if n in cpu_s else "-",
                 f"{jit_ms[n]:.0f}" if n in jit_ms else "-",
                 f"{tiny_ms[n]:.0f}" if n in tiny_ms else "-"]
                for n in CONTENDERS
            ]
            print(f"\n## value {size} B, {args.rows:,} records, {args.partitions} partitions, "
                  f"median of {args.runs}")
            print(format_table(["contender", "msgs/s", "MB/s (values)", "vs spark-kafka",
                                "machine CPU-s per run", "JIT ms per run",
                                f"{args.tiny_rows}-record batch ms"], rows_out))
            ratio = rates["kafka-sink"] / rates["spark-kafka"]
            # Per round (the contenders ran back to back): Spark's writer's time / the sink's.
            paired = sorted(a / b for a, b in zip(times["spark-kafka"], times["kafka-sink"],
                                                  strict=True))
            results["sizes"][str(size)]["paired_ratios"] = paired
            # Bootstrap over the rounds: how far the machine's noise moves the ratio.
            low, high = ratio_interval(times["spark-kafka"], times["kafka-sink"])
            results["sizes"][str(size)]["ratio_interval_95"] = [low, high]
            overhead = tiny_ms["kafka-sink"] - tiny_ms["spark-kafka"]
            overhead_b = tiny_ms["kafka-sink-barrier"] - tiny_ms["spark-kafka"]
            verdict = "met" if ratio >= TARGET_VS_SPARK else "NOT met"
            print(f"KafkaSink (default, barrier=False) / Spark's writer: {ratio:.2f}x (target "
                  f">= {TARGET_VS_SPARK}x: {verdict}); barrier=True: "
                  f"{rates['kafka-sink-barrier'] / rates['spark-kafka']:.2f}x; "
                  f"reuse_producers=False: {rates['kafka-sink-fresh'] / rates['spark-kafka']:.2f}x"
                  f" (reuse: {rates['kafka-sink'] / rates['kafka-sink-fresh']:.2f}x); per-batch "
                  f"overhead over Spark's writer: {overhead:.0f} ms (default), "
                  f"{overhead_b:.0f} ms (barrier=True); paired per round: median "
                  f"{median(paired):.2f}x, {paired[0]:.2f}x-{paired[-1]:.2f}x; total time "
                  f"over the rounds {sum(times['spark-kafka']) / sum(times['kafka-sink']):.2f}x, "
                  f"95 % bootstrap interval {low:.2f}x-{high:.2f}x")
            if "spark-kafka" in cpu_s and "kafka-sink" in cpu_s:
                mine, theirs = cpu_s["kafka-sink"], cpu_s["spark-kafka"]
                print(f"Machine CPU per {args.rows:,}-record run (JVM, Python workers, broker): "
                      f"KafkaSink {mine:.2f} s, Spark's writer {theirs:.2f} s "
                      f"({mine / theirs:.2f}x)")
        tiny_metrics = [m for m in results.get("metrics", []) if m["phase"] == "tiny"]
        if tiny_metrics:
            for name in ("kafka-sink", "kafka-sink-fresh", "kafka-sink-barrier"):
                ms = [m for m in tiny_metrics if m["contender"] == name]
                if ms:
                    txn = median([m["txn_ms"] for m in ms])
                    wait = median([m["barrier_wait_ms"] for m in ms])
                    total = median([m["sink_ms"] for m in ms])
                    print(f"{name}: {args.tiny_rows}-record batch: slot transaction {txn:.0f} ms"
                          f" (barrier wait {wait:.0f} ms), sink total {total:.0f} ms")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(results, fh, indent=1, default=str)
    finally:
        for sink in sinks.values():
            sink.close()
        names = [*created]
        for key in sinks:
            sid = sinks[key].sink_id
            names += [f"_connectors.{sid}.markers", f"_connectors.{sid}.ledger"]
        try:
            for future in admin.delete_topics(names, operation_timeout=60).values():
                future.result(60)
        except Exception as exc:
            print(f"warning: could not delete the benchmark topics: {exc}", file=sys.stderr)
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
