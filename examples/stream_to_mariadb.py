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
    run_timed,
    stream,
)

__all__ = ["ENV_URL", "main"]

ENV_URL = "EOS_MARIADB_URL"
logger = logging.getLogger("examples.stream_to_mariadb")  # not __name__ ("__main__" under -m)


def run(args: argparse.Namespace) -> int:
    keys = [k.strip() for k in (args.key_columns or "").split(",") if k.strip()]
    sink = MariaDBSink(args.url, args.table, sink_id=args.sink_id, mode=args.mode,
                       key_columns=keys or None, create_table=args.create_table,
                       ledger_table=args.ledger_table, query_name=args.query_name or None)
    logger.info("writing into %s of %r as sink %s", args.table, sink.address, args.sink_id)
    spark = build_session(args.master, ["spark.app.name=connectors-stream-to-mariadb",
                                        *args.conf], connect=args.connect)
    return stream(spark, args, sink, rate=rate_as_input_rows)


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
    args = parse_job_args(parser, argv, from_env=("url", ENV_URL))
    return run_timed(run, args, logger)


if __name__ == "__main__":
    raise SystemExit(main())
