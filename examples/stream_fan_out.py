"""One streaming job into PostgreSQL, Kafka and Delta Lake under one decision per batch.

Each micro-batch of the JSON files in ``--input`` (columns ``id LONG, name STRING,
amount DOUBLE, ts TIMESTAMP``, one file per batch, ``Trigger.AvailableNow``), or of the
``rate`` source (the same columns, ``--batches`` of ``--rows-per-batch``), goes to a
PostgreSQL table, a Kafka topic (key ``id``, value the row as JSON) and a Delta table, in
all three or in none (docs/fan-out.md; the fan-out's decisions are kept in PostgreSQL's
ledger table).

Run it, kill it (``CONNECTORS_TEST_MODE=1`` with
``CONNECTORS_CRASH_AT=after_decision:sink=<fan-out id>`` arms a crash point), run it
again with the same ``--checkpoint``: every input row is in each target exactly once.
``python -m examples.stream_fan_out -h``.
"""

from __future__ import annotations

import argparse
import logging

from pyspark.sql import DataFrame
from pyspark.sql import functions as sf

from connectors import FanOut
from connectors.delta import DeltaSink
from connectors.kafka import KafkaSink
from connectors.postgres import PostgresSink
from examples._runner import job_parser, parse_job_args, rate_as_input_rows, run_timed, stream
from examples.stream_to_delta import build_session

__all__ = ["main", "make_fan_out", "run"]

logger = logging.getLogger("examples.stream_fan_out")  # not __name__ ("__main__" under -m)


def records(df: DataFrame) -> DataFrame:
    """The rows as Kafka records: key = id, value = the row as JSON (deterministic)."""
    return df.select(sf.col("id").cast("string").alias("key"),
                     sf.to_json(sf.struct(*[sf.col(c) for c in df.columns])).alias("value"))


def make_fan_out(args: argparse.Namespace) -> FanOut:
    name = args.query_name or None
    return FanOut(
        PostgresSink(args.conninfo, args.table, sink_id=args.pg_sink_id or f"{args.sink_id}-pg",
                     ledger_table=args.ledger_table, query_name=name),
        (KafkaSink(args.topic, {"bootstrap.servers": args.bootstrap},
                   sink_id=args.kafka_sink_id or f"{args.sink_id}-kafka", slots=2,
                   create_topic=True,
                   query_name=name), records),
        DeltaSink(args.path, sink_id=args.delta_sink_id or f"{args.sink_id}-delta",
                  create_table=True,
                  query_name=name),
        sink_id=args.sink_id, query_name=name)


def run(args: argparse.Namespace) -> int:
    fan = make_fan_out(args)  # validates the options before Spark starts
    logger.info("writing %r", fan)
    spark = build_session(args.master, args.conf, connect=args.connect)
    return stream(spark, args, fan, rate=rate_as_input_rows)


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--conninfo", default=None,
                        help="libpq connection string (default $EOS_POSTGRES_CONNINFO)")
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    parser.add_argument("--table", required=True, help="the PostgreSQL table")
    parser.add_argument("--ledger-table", default="public.eos_ledger")
    parser.add_argument("--topic", required=True, help="the Kafka topic")
    parser.add_argument("--path", required=True, help="the Delta table's path")
    parser.add_argument("--sink-id", default="events-fan",
                        help="the fan-out's id; the targets' are <id>-pg, -kafka, -delta "
                             "unless given")
    for target in ("pg", "kafka", "delta"):
        parser.add_argument(f"--{target}-sink-id", default=None)
    args = parse_job_args(parser, argv, from_env=("conninfo", "EOS_POSTGRES_CONNINFO"))
    return run_timed(run, args, logger)


if __name__ == "__main__":
    raise SystemExit(main())
