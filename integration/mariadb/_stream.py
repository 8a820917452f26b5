"""A real Structured Streaming job into MariaDB with the (not yet public) ``MariaDBSink``.

The job loop of ``examples/stream_to_postgres.py`` (``examples._runner``: the ``files`` and
``rate`` sources, the columns ``id LONG, name STRING, amount DOUBLE, ts TIMESTAMP``) with
MariaDB as its target: ``python -m integration.mariadb._stream --checkpoint CKPT --input DIR
[--url URL] [--table events] [--sink-id S] [--create-table]``. The address comes from
``--url`` or ``$EOS_MARIADB_URL``; its password is never printed. It moves to ``examples/``
when the sink is public (issue 54).
"""

from __future__ import annotations

import argparse
import logging

from connectors.mariadb._sink import MariaDBSink
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
logger = logging.getLogger("integration.mariadb._stream")


def run(args: argparse.Namespace) -> int:
    sink = MariaDBSink(args.url, args.table, sink_id=args.sink_id,
                       create_table=args.create_table, ledger_table=args.ledger_table,
                       query_name=args.query_name or None)
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
    parser.add_argument("--create-table", action="store_true")
    parser.add_argument("--ledger-table", default="eos_ledger")
    args = parse_job_args(parser, argv, from_env=("url", ENV_URL))
    return run_timed(run, args, logger)


if __name__ == "__main__":
    raise SystemExit(main())
