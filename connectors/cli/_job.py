"""The demo's streaming job (a child process of ``connectors demo``; one driver run).

``python -m connectors.cli._job run ...`` streams JSON files (one file per micro-batch,
``Trigger.AvailableNow``, a replayable source) into the chosen sink with a checkpoint.
``python -m connectors.cli._job ids ...`` prints the ids the target holds (one JSON line),
read the way a downstream user would: Delta with Spark, PostgreSQL with a query, Kafka
with a ``read_committed`` consumer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

INPUT_SCHEMA = "id LONG, name STRING, amount DOUBLE, ts TIMESTAMP"


#: The streaming query's name, given to the sink too: under Spark Connect that is how the
#: sink (in the foreachBatch worker, next to the server) knows which query calls it.
QUERY_NAME = "connectors-demo"

def make_input_files(directory: Path, files: int, rows_per_file: int) -> int:
    """``files`` JSON files of ``rows_per_file`` rows with ids ``0..n-1``; returns ``n``."""
    directory.mkdir(parents=True, exist_ok=True)
    n = 0
    for f in range(files):
        lines = []
        for _ in range(rows_per_file):
            lines.append(json.dumps({
                "id": n, "name": f"customer-{n:07d}", "amount": n * 0.25,
                "ts": f"2026-01-01T{(n // 3600) % 24:02d}:{(n // 60) % 60:02d}:{n % 60:02d}Z",
            }))
            n += 1
        tmp = directory / f".part-{f:05d}.json.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(directory / f"part-{f:05d}.json")
    return n


def _session(args: argparse.Namespace) -> Any:
    from connectors.spark import get_session

    components = {"delta": ["delta"], "kafka": ["kafka"], "postgres": []}[args.sink]
    if args.sink == "delta" and args.target.startswith(("s3a://", "s3://")):
        components.append("s3")
    connect = bool(getattr(args, "connect", False)) and args.mode == "run"
    conf = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.streaming.stopTimeout": "30s",
        # Small splits: every file becomes several tasks (several transactions per batch).
        "spark.sql.files.maxPartitionBytes": "64k",
    }
    conf.update(item.split("=", 1) for item in args.conf)
    return get_session("connectors-demo", master="local[2]", components=components,
                       connect=connect, conf=conf)


def make_sink(args: argparse.Namespace) -> Any:
    if args.sink == "delta":
        from connectors.delta import DeltaSink

        return DeltaSink(args.target, sink_id=args.sink_id, create_table=True,
                         query_name=QUERY_NAME)
    if args.sink == "postgres":
        from connectors.postgres import PostgresSink

        return PostgresSink(args.conninfo, args.target, sink_id=args.sink_id, create_table=True,
                            query_name=QUERY_NAME)
    from connectors.kafka import KafkaSink

    return KafkaSink(args.target, {"bootstrap.servers": args.bootstrap}, sink_id=args.sink_id,
                     query_name=QUERY_NAME)


#: A line the demo reads from a run's log: ``MILESTONE <name> <unix time>``.
MILESTONE = "MILESTONE"


def milestone(name: str) -> None:
    """Print when this run reached ``name`` (``session``, ``query_started``,
    ``first_commit``): the demo shows a restart's three times from these lines."""
    print(f"{MILESTONE} {name} {time.time():.3f}", flush=True)


def run(args: argparse.Namespace) -> int:
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as sf

    sink = make_sink(args)
    spark = _session(args)
    milestone("session")
    df = spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(args.input)
    committed: list[int] = []

    def write(batch: DataFrame, batch_id: int) -> None:
        if args.sink == "kafka":
            batch = batch.select(sf.col("id").cast("string").alias("key"),
                                 sf.to_json(sf.struct("*")).alias("value"))
        sink(batch, batch_id)
        if not committed:
            milestone("first_commit")
        committed.append(batch_id)

    query = (df.writeStream.queryName(QUERY_NAME).foreachBatch(write)
             .option("checkpointLocation", args.checkpoint)
             .trigger(availableNow=True).start())
    milestone("query_started")
    try:
        query.awaitTermination()
    finally:
        sink.close()
    return 0


def target_ids(args: argparse.Namespace) -> list[int]:
    """The ids the target holds, duplicates included."""
    if args.sink == "postgres":
        from connectors.postgres.admin import column_values

        return [int(v) for v in column_values(args.conninfo, args.target, "id")]
    if args.sink == "kafka":
        return _kafka_ids(args.bootstrap, args.target)
    spark = _session(args)
    rows = spark.read.format("delta").load(args.target).select("id").collect()
    return [int(r[0]) for r in rows]


def _kafka_ids(bootstrap: str, topic: str) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"demo-{os.getpid()}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    try:
        meta = consumer.list_topics(topic, timeout=30)
        parts = sorted(meta.topics[topic].partitions)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in parts}
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        ids: list[int] = []
        done = {p for p in parts if ends[p] == 0}
        while len(done) < len(parts):
            msg = consumer.poll(5.0)
            if msg is None:
                # read_committed stops at the last stable offset: an end offset past it is
                # a transaction marker, or an open transaction (then this never finishes).
                positions = consumer.position([TopicPartition(topic, p) for p in parts])
                done |= {tp.partition for tp in positions
                         if tp.offset is not None and tp.offset >= ends[tp.partition] - 1}
                continue
            if msg.error():
                continue
            value = msg.value()
            if value is not None:
                ids.append(int(json.loads(value)["id"]))
            offset, partition = msg.offset(), msg.partition()
            if offset is not None and partition is not None and offset >= ends[partition] - 1:
                done.add(partition)
        return ids
    finally:
        consumer.close()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m connectors.cli._job")
    p.add_argument("mode", choices=["run", "ids"])
    p.add_argument("--sink", choices=["delta", "postgres", "kafka"], required=True)
    p.add_argument("--target", required=True, help="Delta path, table, or topic")
    p.add_argument("--sink-id", default="connectors-demo")
    p.add_argument("--input")
    p.add_argument("--checkpoint")
    p.add_argument("--conninfo", default=os.environ.get("EOS_POSTGRES_CONNINFO"))
    p.add_argument("--bootstrap", default=os.environ.get("EOS_KAFKA_BOOTSTRAP"))
    p.add_argument("--connect", action="store_true",
                   help="run as a Spark Connect client of a local Connect server")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark conf (the demo's --conf)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.mode == "run":
        return run(args)
    print("IDS " + json.dumps(target_ids(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
