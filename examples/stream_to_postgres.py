"""A real Structured Streaming job into PostgreSQL, exactly once, with ``PostgresSink``.

The same two replayable sources as ``examples/stream_to_files.py``:

- ``files``: JSON files in ``--input`` (one file per micro-batch, ``Trigger.AvailableNow``:
  the query ends by itself when every file is processed), columns
  ``id LONG, name STRING, amount DOUBLE, ts TIMESTAMP``;
- ``rate``: Spark's ``rate-micro-batch`` source, ``--rows-per-batch`` rows per batch; its
  ``value`` becomes ``id`` (``[b*R, (b+1)*R)`` in batch ``b``), with ``name``, ``amount``
  and ``ts`` derived from it, so both sources fill the same table. Batches from
  ``--batches`` on are not written (the program then stops the query).

The target table needs the columns ``id bigint, name text, amount double precision,
ts timestamptz`` (``--create-table`` creates it from the batch's schema; with
``--mode upsert`` and ``--key-columns id`` it gets that primary key).

The connection string comes from ``--conninfo`` or ``$EOS_POSTGRES_CONNINFO``; its password
is never printed. Run it, kill it (``CONNECTORS_TEST_MODE=1`` with ``CONNECTORS_CRASH_AT``
arms a crash point), run it again with the same ``--checkpoint``: every input row is in the
table exactly once. ``python -m examples.stream_to_postgres -h``.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time

from pyspark.sql import DataFrame
from pyspark.sql import functions as sf

from connectors.postgres import PostgresSink
from examples.stream_to_files import INPUT_SCHEMA, build_session, make_input_files

__all__ = ["ENV_CONNINFO", "INPUT_SCHEMA", "main", "make_input_files", "run"]

ENV_CONNINFO = "EOS_POSTGRES_CONNINFO"
log = logging.getLogger("examples.stream_to_postgres")


def make_sink(args: argparse.Namespace) -> PostgresSink:
    keys = [k.strip() for k in (args.key_columns or "").split(",") if k.strip()]
    return PostgresSink(
        args.conninfo,
        args.table,
        sink_id=args.sink_id,
        mode=args.mode,
        key_columns=keys or None,
        create_table=args.create_table,
        ledger_table=args.ledger_table,
        lock_timeout=args.lock_timeout,
    )


def _rate_rows(df: DataFrame) -> DataFrame:
    """The rate source's ``(timestamp, value)`` as the table's ``(id, name, amount, ts)``."""
    return df.select(
        sf.col("value").alias("id"),
        sf.concat(sf.lit("rate-"), sf.col("value").cast("string")).alias("name"),
        (sf.col("value") * sf.lit(0.25)).alias("amount"),
        sf.col("timestamp").alias("ts"),
    )


def run(args: argparse.Namespace) -> int:
    sink = make_sink(args)  # validates the options before Spark starts
    log.info("writing into %s of %s as sink %s (mode %s)", args.table, sink.conninfo,
             args.sink_id, args.mode)
    spark = build_session(args.master, ["spark.app.name=connectors-stream-to-postgres",
                                        *args.conf])
    try:
        if args.source == "files":
            df = (
                spark.readStream.schema(INPUT_SCHEMA)
                .option("maxFilesPerTrigger", 1)
                .json(args.input)
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
            sink(_rate_rows(batch_df), batch_id)

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
    parser.add_argument("--source", choices=["files", "rate"], default="files")
    parser.add_argument("--input", help="input directory of JSON files (files source)")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--conninfo", default=None,
                        help=f"libpq connection string (default ${ENV_CONNINFO})")
    parser.add_argument("--table", default="public.events")
    parser.add_argument("--sink-id", default="events-pg")
    parser.add_argument("--mode", choices=["append", "upsert"], default="append")
    parser.add_argument("--key-columns", default="",
                        help="upsert key, comma-separated (e.g. id)")
    parser.add_argument("--create-table", action="store_true",
                        help="create the table from the batch's schema if it is missing")
    parser.add_argument("--ledger-table", default="public.eos_ledger")
    parser.add_argument("--lock-timeout", default="30s")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--batches", type=int, default=5, help="rate source: batches to write")
    parser.add_argument("--rows-per-batch", type=int, default=1000)
    parser.add_argument("--conf", action="append", default=[], help="extra Spark conf k=v")
    args = parser.parse_args(argv)
    args.conninfo = args.conninfo or os.environ.get(ENV_CONNINFO)
    if not args.conninfo:
        parser.error(f"pass --conninfo or set ${ENV_CONNINFO}")
    if args.source == "files" and not args.input:
        parser.error("--source files needs --input")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    start = time.monotonic()
    code = run(args)
    log.info("finished in %.1f s", time.monotonic() - start)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
