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

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf

from connectors.delta import DeltaSink, DeltaSinks

# The job loop (common flags, logging, session, sources, query); this file adds its sink.
from examples._runner import (
    INPUT_SCHEMA,
    conf_items,
    job_parser,
    parse_job_args,
    rate_as_input_rows,
    run_timed,
    stream,
)
from examples.stream_to_files import make_input_files

__all__ = ["INPUT_SCHEMA", "build_session", "main", "make_input_files", "run"]

logger = logging.getLogger("examples.stream_to_delta")  # not __name__ ("__main__" under -m)


def build_session(master: str, conf: list[str], *, connect: bool = False,
                  s3: bool = False) -> SparkSession:
    """A small-machine session with the Delta jars (``connectors.spark``); ``connect``: a
    Spark Connect client (of a local server that gets the jars, or of ``sc://...``); ``s3``:
    also S3A's jars (``s3a://`` tables; the endpoint and keys are the user's
    ``spark.hadoop.fs.s3a.*`` confs, or S3A's default credential chain)."""
    from connectors.spark import session_builder

    settings = {
        "spark.app.name": "connectors-stream-to-delta",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.streaming.stopTimeout": "30s",
        "spark.sql.files.maxPartitionBytes": "16k",
        **conf_items(conf),
    }
    builder = session_builder("connectors-stream-to-delta", master=master,
                              components=["delta", "s3"] if s3 else ["delta"], conf=settings,
                              connect=connect)
    return builder.getOrCreate()


def make_sinks(args: argparse.Namespace) -> DeltaSink | DeltaSinks:
    keys = [k.strip() for k in (args.merge_on or "").split(",") if k.strip()]
    main_sink = DeltaSink(args.path, sink_id=args.sink_id, merge_on=keys or None,
                          create_table=True, merge_schema=args.merge_schema,
                          query_name=args.query_name or None)
    if not args.merge_path:
        return main_sink
    merge_sink = DeltaSink(args.merge_path, sink_id=args.merge_sink_id, merge_on=["key"],
                           create_table=True, query_name=args.query_name or None)
    return DeltaSinks([main_sink, merge_sink])


def run(args: argparse.Namespace) -> int:
    sink = make_sinks(args)  # validates the options before Spark starts
    logger.info("writing %s", sink)
    s3 = any(p.startswith(("s3a://", "s3://")) for p in (args.path, args.merge_path))
    spark = build_session(args.master, args.conf, connect=args.connect, s3=s3)

    def with_key(df: DataFrame) -> DataFrame:
        """``--key-mod N``: a column ``key = id % N`` for ``--merge-on key``."""
        return df.withColumn("key", sf.col("id") % sf.lit(args.key_mod)) if args.key_mod else df

    return stream(spark, args, sink, files=with_key,
                  rate=lambda df: with_key(rate_as_input_rows(df)))


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(__doc__.splitlines()[0])
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
    args = parse_job_args(parser, argv)
    keys = [k.strip() for k in args.merge_on.split(",")]
    if (args.merge_path or "key" in keys) and not args.key_mod:
        parser.error("MERGE on key needs --key-mod N")
    return run_timed(run, args, logger)


if __name__ == "__main__":
    raise SystemExit(main())
