"""A real Structured Streaming job into Delta tables, exactly once, with ``DeltaSink``.

The same two replayable sources as ``examples/stream_to_files.py``:

- ``files``: JSON files in ``--input`` (one file per micro-batch, ``Trigger.AvailableNow``:
  the query ends by itself when every file is processed), columns
  ``id LONG, name STRING, amount DOUBLE, ts TIMESTAMP``;
- ``rate``: Spark's ``rate-micro-batch`` source, ``--rows-per-batch`` rows per batch; its
  ``value`` becomes ``id`` (``[b*R, (b+1)*R)`` in batch ``b``), with ``name``, ``amount``
  and ``ts`` derived from it. Batches from ``--batches`` on are not written (the program
  then stops the query).

``--key-mod N`` adds a column ``key = id % N`` (several rows per key in every batch), for
``--merge-on key``: the table then holds, per key, the row with the greatest id.

``--path`` is written by one sink (``--sink-id``; append, or MERGE with ``--merge-on``);
``--merge-path`` adds a second sink (``--merge-sink-id``) fed by the same batches through
``DeltaSinks``, which MERGEs on ``key`` into that table.

Run it, kill it (``CONNECTORS_TEST_MODE=1`` with ``CONNECTORS_CRASH_AT`` arms a crash
point), run it again with the same ``--checkpoint``: every input row is in the tables
exactly once. ``python -m examples.stream_to_delta -h``.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf

from connectors.delta import DeltaSink, DeltaSinks
from examples.stream_to_files import INPUT_SCHEMA, make_input_files

__all__ = ["INPUT_SCHEMA", "build_session", "main", "make_input_files", "run"]

log = logging.getLogger("examples.stream_to_delta")


def build_session(master: str, conf: list[str]) -> SparkSession:
    """A small-machine session with the Delta jars (``connectors.spark``)."""
    from connectors.spark import session_builder

    settings = {
        "spark.app.name": "connectors-stream-to-delta",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.streaming.stopTimeout": "30s",
        "spark.sql.files.maxPartitionBytes": "16k",
    }
    for item in conf:
        key, _, value = item.partition("=")
        settings[key] = value
    builder = session_builder("connectors-stream-to-delta", master=master,
                              components=["delta"], conf=settings)
    return builder.getOrCreate()


def make_sinks(args: argparse.Namespace) -> DeltaSink | DeltaSinks:
    keys = [k.strip() for k in (args.merge_on or "").split(",") if k.strip()]
    main_sink = DeltaSink(args.path, sink_id=args.sink_id, merge_on=keys or None,
                          create_table=True, merge_schema=args.merge_schema)
    if not args.merge_path:
        return main_sink
    merge_sink = DeltaSink(args.merge_path, sink_id=args.merge_sink_id, merge_on=["key"],
                           create_table=True)
    return DeltaSinks([main_sink, merge_sink])


def _rate_rows(df: DataFrame) -> DataFrame:
    """The rate source's ``(timestamp, value)`` as ``(id, name, amount, ts)``."""
    return df.select(
        sf.col("value").alias("id"),
        sf.concat(sf.lit("rate-"), sf.col("value").cast("string")).alias("name"),
        (sf.col("value") * sf.lit(0.25)).alias("amount"),
        sf.col("timestamp").alias("ts"),
    )


def _with_key(df: DataFrame, key_mod: int) -> DataFrame:
    return df.withColumn("key", sf.col("id") % sf.lit(key_mod)) if key_mod else df


def run(args: argparse.Namespace) -> int:
    sink = make_sinks(args)  # validates the options before Spark starts
    log.info("writing %s", sink)
    spark = build_session(args.master, args.conf)
    try:
        write: Callable[[DataFrame, int], None]
        if args.source == "files":
            df = (
                spark.readStream.schema(INPUT_SCHEMA)
                .option("maxFilesPerTrigger", 1)
                .json(args.input)
            )
            df = _with_key(df, args.key_mod)
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
            sink(_with_key(_rate_rows(batch_df), args.key_mod), batch_id)

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
    parser.add_argument("--path", required=True, help="the Delta table's path")
    parser.add_argument("--sink-id", default="events-delta")
    parser.add_argument("--merge-on", default="", help="MERGE keys, comma-separated (e.g. key)")
    parser.add_argument("--merge-schema", action="store_true")
    parser.add_argument("--key-mod", type=int, default=0,
                        help="add a column key = id %% N (0: no key column)")
    parser.add_argument("--merge-path", default="",
                        help="a second table, MERGEd on key by a second sink (needs --key-mod)")
    parser.add_argument("--merge-sink-id", default="events-merge")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--batches", type=int, default=5, help="rate source: batches to write")
    parser.add_argument("--rows-per-batch", type=int, default=1000)
    parser.add_argument("--conf", action="append", default=[], help="extra Spark conf k=v")
    args = parser.parse_args(argv)
    if args.source == "files" and not args.input:
        parser.error("--source files needs --input")
    keys = [k.strip() for k in args.merge_on.split(",")]
    if (args.merge_path or "key" in keys) and not args.key_mod:
        parser.error("MERGE on key needs --key-mod N")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    start = time.monotonic()
    code = run(args)
    log.info("finished in %.1f s", time.monotonic() - start)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
