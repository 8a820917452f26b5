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

import connectors
from connectors.postgres import PostgresSink

# The job loop (common flags, logging, session, sources, query); this file adds its sink.
from examples._runner import (
    INPUT_SCHEMA,
    DataSourceForm,
    build_session,
    job_parser,
    parse_job_args,
    rate_as_input_rows,
    run_timed,
    stream,
)
from examples.stream_to_files import make_input_files

__all__ = ["ENV_CONNINFO", "INPUT_SCHEMA", "main", "make_input_files", "run"]

ENV_CONNINFO = "EOS_POSTGRES_CONNINFO"
logger = logging.getLogger("examples.stream_to_postgres")  # not __name__ ("__main__" under -m)


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
        query_name=args.query_name or None,
    )


def data_source_form(args: argparse.Namespace) -> DataSourceForm:
    """``--form datasource``: the same sink as ``format("connectors.postgres")``."""
    options = {"conninfo": args.conninfo, "table": args.table, "sink_id": args.sink_id,
               "mode": args.mode, "ledger_table": args.ledger_table,
               "lock_timeout": args.lock_timeout, "create_table": str(args.create_table)}
    if args.key_columns:
        options["key_columns"] = args.key_columns
    return DataSourceForm("connectors.postgres", options)


def run(args: argparse.Namespace) -> int:
    sink = make_sink(args)  # validates the options before Spark starts
    logger.info("writing into %s of %s as sink %s (mode %s)", args.table, sink.conninfo,
                args.sink_id, args.mode)
    spark = build_session(args.master, ["spark.app.name=connectors-stream-to-postgres",
                                        *args.conf], connect=args.connect)
    if args.form == "datasource":
        connectors.register(spark)
        return stream(spark, args, data_source_form(args), rate=rate_as_input_rows)
    # Both sources fill the same table: the rate rows become (id, name, amount, ts).
    return stream(spark, args, sink, rate=rate_as_input_rows)


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(__doc__.splitlines()[0])
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
    parser.add_argument("--form", choices=["callable", "datasource"], default="callable",
                        help="foreachBatch(sink) (callable), or the DataSource form: "
                             'format("connectors.postgres"); streams from files or kafka, '
                             "or a batch job (--batch-run)")
    args = parse_job_args(parser, argv, from_env=("conninfo", ENV_CONNINFO))
    if args.form == "datasource" and args.source == "rate" and args.batch_run is None:
        parser.error("--form datasource writes every batch the query runs: use --source "
                     "files or kafka (or --batch-run, a batch job)")
    return run_timed(run, args, logger)


if __name__ == "__main__":
    raise SystemExit(main())
