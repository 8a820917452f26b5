"""A real Structured Streaming job into MariaDB, exactly once, with ``MariaDBSink``.

The job loop of ``examples/stream_to_postgres.py`` (``examples._runner``: the ``files`` and
``rate`` sources, the columns ``id LONG, name STRING, amount DOUBLE, ts TIMESTAMP``) with
MariaDB as its target. The table needs the columns ``id BIGINT, name LONGTEXT, amount
DOUBLE, ts DATETIME(6)`` (``--create-table`` creates it from the batch's schema; with
``--mode upsert`` and ``--key-columns id`` it gets that primary key).

The address comes from ``--url`` or ``$EOS_MARIADB_URL`` (``mariadb://user:password@host:
port/database``); its password is never printed. Run it, kill it (``CONNECTORS_TEST_MODE=1``
with ``CONNECTORS_CRASH_AT`` arms a crash point), run it again with the same
``--checkpoint``: every input row is in the table exactly once.
``python -m examples.stream_to_mariadb -h``.

With ``--changes`` the files are a change stream (``examples/stream_changes_to_postgres.py``'s
files and columns, ``id LONG, op STRING, seq LONG, name STRING, amount DOUBLE``) written
with ``mode="changes"`` (key ``id``, ``op_column="op"``, ``sequence_column="seq"``).
"""

from __future__ import annotations

import argparse
import logging

from connectors.mariadb import MariaDBSink
from examples._runner import (
    build_session,
    job_parser,
    parse_job_args,
    rate_as_input_rows,
    run_available_now,
    run_timed,
    stream,
)
from examples.stream_changes_to_postgres import CHANGE_SCHEMA

__all__ = ["ENV_URL", "main"]

ENV_URL = "EOS_MARIADB_URL"
logger = logging.getLogger("examples.stream_to_mariadb")  # not __name__ ("__main__" under -m)


def run(args: argparse.Namespace) -> int:
    keys = [k.strip() for k in (args.key_columns or "").split(",") if k.strip()]
    options: dict[str, object] = {"mode": args.mode, "key_columns": keys or None}
    if args.changes:
        options = {"mode": "changes", "key_columns": ["id"], "op_column": "op",
                   "sequence_column": "seq"}
    sink = MariaDBSink(args.url, args.table, sink_id=args.sink_id,
                       create_table=args.create_table, ledger_table=args.ledger_table,
                       query_name=args.query_name or None, **options)  # type: ignore[arg-type]
    logger.info("writing into %s of %r as sink %s", args.table, sink.address, args.sink_id)
    spark = build_session(args.master, ["spark.app.name=connectors-stream-to-mariadb",
                                        *args.conf], connect=args.connect)
    if not args.changes:
        return stream(spark, args, sink, rate=rate_as_input_rows)
    try:
        df = spark.readStream.schema(CHANGE_SCHEMA).option("maxFilesPerTrigger", 1).json(
            args.input)
        return run_available_now(df, sink, args.checkpoint, args.query_name or None)
    finally:
        sink.close()
        spark.stop()


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--url", default=None, help=f"mariadb:// URL (default ${ENV_URL})")
    parser.add_argument("--table", default="events")
    parser.add_argument("--sink-id", default="events-mariadb")
    parser.add_argument("--mode", choices=["append", "upsert"], default="append")
    parser.add_argument("--key-columns", default="", help="upsert: comma-separated key")
    parser.add_argument("--create-table", action="store_true")
    parser.add_argument("--ledger-table", default="eos_ledger")
    parser.add_argument("--changes", action="store_true",
                        help="the files are a change stream: mode='changes'")
    args = parse_job_args(parser, argv, from_env=("url", ENV_URL))
    return run_timed(run, args, logger)


if __name__ == "__main__":
    raise SystemExit(main())
