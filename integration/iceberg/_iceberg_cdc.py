"""A deterministic change stream into Iceberg by MERGE, alone or fanned out with PostgreSQL.

Run as a program (``python -m integration.iceberg._iceberg_cdc --warehouse DIR --checkpoint
CKPT --batches N --rows-per-batch R [--pg-conninfo URL --pg-table T --pg-ledger L
--pg-sink-id S]``) it streams Spark's ``rate-micro-batch`` source through the change stream of
``integration.delta._delta_cdc`` (value ``v`` becomes one change of ``id``: ``op``, ``seq``,
``name``, ``amount``, ``bucket``; several changes per key in a batch and across batches,
deletes of existing and of unknown keys) into ``lake.db.changes`` (a Hadoop catalog on
``DIR``) with ``IcebergSink(merge_on=["id"], sequence_column="seq", delete_when="s.op =
'd'", update_when="s.seq > t.seq", exclude_columns=["op"])``. With ``--pg-conninfo`` the
same batches also go to a PostgreSQL table (``PostgresSink(mode="changes")`` on the same
key, operation and sequence) under one ``FanOut`` decision per batch (fan-out id
``--fan-id``; its decisions in PostgreSQL's ledger table ``--pg-ledger``).

``--null-bucket-at B`` makes one change of batch ``B`` bad input (a NULL ``bucket``, which a
test's table requires). After the whole input both tables must hold ``expected_merge`` of
it: the last change of each key, deleted keys absent.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from integration.delta._delta_cdc import changes

__all__ = ["ICEBERG_SINK", "PG_SINK", "TABLE", "main"]

TABLE = "lake.db.changes"
ICEBERG_SINK = "cdc-iceberg"
PG_SINK = "cdc-pg"


def with_null(df: Any, batch: int, rows_per_batch: int) -> Any:
    """``df`` with a NULL ``bucket`` in batch ``batch``'s last change (an upsert that wins its
    key in the batch), for the bad-input test; ``df`` itself for ``batch < 0``."""
    if batch < 0:
        return df
    from pyspark.sql import functions as F

    last = (batch + 1) * rows_per_batch - 1
    return df.withColumn("bucket", F.when(F.col("seq") == last, F.lit(None).cast("long"))
                         .otherwise(F.col("bucket")))


def make_sink(args: Any) -> Any:
    from connectors import FanOut
    from connectors.iceberg import IcebergSink
    from connectors.postgres import PostgresSink

    name = args.query_name or None
    iceberg = IcebergSink(TABLE, sink_id=ICEBERG_SINK, merge_on=["id"], sequence_column="seq",
                          delete_when="s.op = 'd'", update_when="s.seq > t.seq",
                          exclude_columns=["op"], create_table=True, query_name=name)
    if not args.pg_conninfo:
        return iceberg
    pg = PostgresSink(args.pg_conninfo, args.pg_table, sink_id=args.pg_sink_id, mode="changes",
                      key_columns=["id"], op_column="op", sequence_column="seq",
                      ledger_table=args.pg_ledger, query_name=name)
    return FanOut(iceberg, pg, sink_id=args.fan_id, query_name=name)


def main(argv: list[str] | None = None) -> int:
    from examples._runner import job_parser, parse_job_args, run_timed, stream
    from examples.stream_to_iceberg import build_session, catalog_conf

    parser = job_parser("a deterministic change stream into Iceberg", sources=("rate",))
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--warehouse", required=True)
    parser.add_argument("--pg-conninfo", default="")
    parser.add_argument("--pg-table", default="")
    parser.add_argument("--pg-ledger", default="public.eos_ledger")
    parser.add_argument("--pg-sink-id", default=PG_SINK)
    parser.add_argument("--fan-id", default="cdc-fan")
    parser.add_argument("--null-bucket-at", type=int, default=-1,
                        help="bad input: the last change of this batch has a NULL bucket")
    args = parse_job_args(parser, ["--source", "rate", *(argv if argv is not None else
                                                           sys.argv[1:])])
    log = logging.getLogger("integration.iceberg._iceberg_cdc")

    def run(args: Any) -> int:
        sink = make_sink(args)
        spark = build_session(args.master, args.conf, catalog_conf(args.warehouse),
                              connect=args.connect)
        spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.db")
        return stream(spark, args, sink, rate=lambda df: with_null(
            changes(df, args.rows_per_batch), args.null_bucket_at, args.rows_per_batch))

    return run_timed(run, args, log)


if __name__ == "__main__":
    raise SystemExit(main())
