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
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as sf

from connectors.kafka import KafkaSink
from examples._kafka_client import config_from_env, spark_source_options

# The job loop (common flags, logging, session, sources, query); this file adds its sink.
from examples._runner import (
    build_session,
    job_parser,
    parse_job_args,
    rate_as_input_rows,
    run_timed,
    stream,
)
from examples.stream_to_files import make_input_files

__all__ = ["ENV_BOOTSTRAP", "main", "make_input_files", "run"]

ENV_BOOTSTRAP = "EOS_KAFKA_BOOTSTRAP"
logger = logging.getLogger("examples.stream_to_kafka")  # not __name__ ("__main__" under -m)


def make_sink(args: argparse.Namespace) -> KafkaSink:
    config: dict[str, Any] = {"bootstrap.servers": args.bootstrap}
    if args.kafka_config_env:
        config.update(config_from_env(args.kafka_config_env))
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
        query_name=args.query_name or None,
        **({} if args.small_batch_rows is None else {"small_batch_rows": args.small_batch_rows}),
    )


def _records(df: DataFrame) -> DataFrame:
    """``id, name, amount, ts`` rows as Kafka records: key = id, value = JSON of the row."""
    return df.select(
        sf.col("id").cast("string").alias("key"),
        sf.to_json(sf.struct(*[sf.col(c) for c in df.columns])).alias("value"),
    )


def _rate_records(df: DataFrame) -> DataFrame:
    return _records(rate_as_input_rows(df))


def run(args: argparse.Namespace) -> int:
    sink = make_sink(args)  # validates the options before Spark starts
    logger.info("writing into topic %s as %r", args.topic, sink)
    conf = ["spark.app.name=connectors-stream-to-kafka"]
    if args.source == "kafka":  # Spark's Kafka source is not in pip's pyspark
        from connectors.spark import resolve_jars

        conf.append("spark.jars=" + ",".join(resolve_jars(["kafka"])))
    spark = build_session(args.master, [*conf, *args.conf], connect=args.connect)
    # The kafka source's records (key, value, headers) are copied as they are.
    source_options = (spark_source_options(config_from_env(args.input_kafka_config_env))
                      if args.input_kafka_config_env else None)
    bootstrap = (source_options or {}).get("kafka.bootstrap.servers", args.bootstrap)
    return stream(spark, args, sink, files=_records, rate=_rate_records,
                  bootstrap=bootstrap, source_options=source_options)


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(__doc__.splitlines()[0], sources=("files", "rate", "kafka"))
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--topic", required=True, help="the topic to write")
    parser.add_argument("--bootstrap", default=None,
                        help=f"bootstrap.servers (default ${ENV_BOOTSTRAP})")
    parser.add_argument("--kafka-conf", action="append", default=[],
                        help="extra librdkafka producer property k=v (no secrets: a "
                        "command line is visible to every user; use --kafka-config-env)")
    parser.add_argument("--kafka-config-env", metavar="VAR", default=None,
                        help="environment variable holding a JSON object of librdkafka "
                        "properties for the sink (SASL, TLS: where secrets belong)")
    parser.add_argument("--input-kafka-config-env", metavar="VAR", default=None,
                        help="kafka source: environment variable holding a JSON object of "
                        "librdkafka properties, translated for Spark's Kafka source")
    parser.add_argument("--sink-id", default="events-kafka")
    parser.add_argument("--slots", type=int, default=None)
    parser.add_argument("--barrier", action=argparse.BooleanOptionalAction, default=False,
                        help="run the slots as one barrier stage (default: ordinary tasks, "
                        "records validated in a separate job first)")
    parser.add_argument("--create-topic", action="store_true")
    parser.add_argument("--topic-partitions", type=int, default=1)
    parser.add_argument("--small-batch-rows", type=int, default=None,
                        help="batches of at most this many records skip the slotting shuffle "
                        "(default: the sink's, 1000; 0: never)")
    args = parse_job_args(parser, argv, from_env=("bootstrap", ENV_BOOTSTRAP))
    return run_timed(run, args, logger)


if __name__ == "__main__":
    raise SystemExit(main())
