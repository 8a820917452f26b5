"""A real Structured Streaming job into Kafka, exactly once, with ``KafkaSink``.

Three replayable sources:

- ``files``: JSON files in ``--input`` (one file per micro-batch, ``Trigger.AvailableNow``),
  columns ``id LONG, name STRING, amount DOUBLE, ts TIMESTAMP`` (``examples/stream_to_files``);
- ``rate``: Spark's ``rate-micro-batch`` source, ``--rows-per-batch`` rows per batch, its
  ``value`` as ``id``; batches from ``--batches`` on are not written (then the program stops);
- ``kafka``: Spark's own Kafka source reading ``--input-topic`` from the earliest offset,
  ``--max-offsets-per-trigger`` records per batch, ``Trigger.AvailableNow``; records are
  copied (key, value, headers) into ``--topic``.

The files and rate rows become records with key ``id`` and a JSON value holding every
column. Consumers read ``--topic`` with ``isolation.level=read_committed``. Kill this
program (``CONNECTORS_TEST_MODE=1`` with ``CONNECTORS_CRASH_AT`` arms a crash point), run
it again with the same ``--checkpoint``: every input record is in the topic exactly once.
``python -m examples.stream_to_kafka -h``.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as sf

from connectors.kafka import KafkaSink
from examples.stream_to_files import INPUT_SCHEMA, build_session, make_input_files

__all__ = ["ENV_BOOTSTRAP", "main", "make_input_files", "run"]

ENV_BOOTSTRAP = "EOS_KAFKA_BOOTSTRAP"
log = logging.getLogger("examples.stream_to_kafka")


def make_sink(args: argparse.Namespace) -> KafkaSink:
    config: dict[str, Any] = {"bootstrap.servers": args.bootstrap}
    for item in args.kafka_conf:
        key, _, value = item.partition("=")
        config[key] = value
    return KafkaSink(
        args.topic,
        config,
        sink_id=args.sink_id,
        slots=args.slots,
        barrier=args.barrier,
        create_topic=args.create_topic,
        topic_partitions=args.topic_partitions,
    )


def _records(df: DataFrame) -> DataFrame:
    """``id, name, amount, ts`` rows as Kafka records: key = id, value = JSON of the row."""
    return df.select(
        sf.col("id").cast("string").alias("key"),
        sf.to_json(sf.struct(*[sf.col(c) for c in df.columns])).alias("value"),
    )


def _rate_rows(df: DataFrame) -> DataFrame:
    return df.select(
        sf.col("value").alias("id"),
        sf.concat(sf.lit("rate-"), sf.col("value").cast("string")).alias("name"),
        (sf.col("value") * sf.lit(0.25)).alias("amount"),
        sf.col("timestamp").alias("ts"),
    )


def run(args: argparse.Namespace) -> int:
    sink = make_sink(args)  # validates the options before Spark starts
    log.info("writing into topic %s as %r", args.topic, sink)
    conf = ["spark.app.name=connectors-stream-to-kafka"]
    if args.source == "kafka":  # Spark's Kafka source is not in pip's pyspark
        from connectors.spark import resolve_jars

        conf.append("spark.jars=" + ",".join(resolve_jars(["kafka"])))
    spark = build_session(args.master, [*conf, *args.conf])
    try:
        if args.source in ("files", "kafka"):
            if args.source == "files":
                df = _records(
                    spark.readStream.schema(INPUT_SCHEMA)
                    .option("maxFilesPerTrigger", 1)
                    .json(args.input)
                )
            else:
                df = (
                    spark.readStream.format("kafka")
                    .option("kafka.bootstrap.servers", args.bootstrap)
                    .option("subscribe", args.input_topic)
                    .option("startingOffsets", "earliest")
                    .option("maxOffsetsPerTrigger", args.max_offsets_per_trigger)
                    .option("kafka.isolation.level", "read_committed")
                    .option("includeHeaders", "true")
                    .load()
                    .select("key", "value", "headers")
                )
            query = (
                df.writeStream.foreachBatch(sink)
                .option("checkpointLocation", args.checkpoint)
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            return 0

        done = threading.Event()

        def write(batch_df: DataFrame, batch_id: int) -> None:
            if batch_id >= args.batches:
                done.set()  # past the planned batches: write nothing, let main stop the query
                return
            sink(_records(_rate_rows(batch_df)), batch_id)

        df = (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", args.rows_per_batch)
            .option("numPartitions", 2)
            .option("startTimestamp", 0)
            .load()
        )
        query = (
            df.writeStream.foreachBatch(write)
            .option("checkpointLocation", args.checkpoint)
            .trigger(processingTime="100 milliseconds")
            .start()
        )
        while not done.wait(0.2):
            if not query.isActive:
                query.awaitTermination()  # raises the query's error
                return 1
        query.stop()
        return 0
    finally:
        sink.close()
        spark.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", choices=["files", "rate", "kafka"], default="files")
    parser.add_argument("--input", help="input directory of JSON files (files source)")
    parser.add_argument("--input-topic", help="topic to read (kafka source)")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=500)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--topic", required=True, help="the topic to write")
    parser.add_argument("--bootstrap", default=None,
                        help=f"bootstrap.servers (default ${ENV_BOOTSTRAP})")
    parser.add_argument("--kafka-conf", action="append", default=[],
                        help="extra librdkafka producer property k=v")
    parser.add_argument("--sink-id", default="events-kafka")
    parser.add_argument("--slots", type=int, default=None)
    parser.add_argument("--barrier", action=argparse.BooleanOptionalAction, default=False,
                        help="run the slots as one barrier stage (default: ordinary tasks, "
                        "records validated in a separate job first)")
    parser.add_argument("--create-topic", action="store_true")
    parser.add_argument("--topic-partitions", type=int, default=1)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--batches", type=int, default=5, help="rate source: batches to write")
    parser.add_argument("--rows-per-batch", type=int, default=1000)
    parser.add_argument("--conf", action="append", default=[], help="extra Spark conf k=v")
    args = parser.parse_args(argv)
    args.bootstrap = args.bootstrap or os.environ.get(ENV_BOOTSTRAP)
    if not args.bootstrap:
        parser.error(f"pass --bootstrap or set ${ENV_BOOTSTRAP}")
    if args.source == "files" and not args.input:
        parser.error("--source files needs --input")
    if args.source == "kafka" and not args.input_topic:
        parser.error("--source kafka needs --input-topic")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    start = time.monotonic()
    code = run(args)
    log.info("finished in %.1f s", time.monotonic() - start)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
