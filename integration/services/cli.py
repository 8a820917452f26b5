"""The command line (``python -m integration.services``, wrapped by ``scripts/services``)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence

from integration.services.config import SERVICES, PgStopMode, ServiceError, Status, env_file
from integration.services.control import _selected, start, status, stop
from integration.services.kafka import restart_kafka
from integration.services.mariadb import restart_mariadb
from integration.services.postgres import restart_postgres
from integration.services.s3 import restart_s3

log = logging.getLogger("connectors.services")


# ------------------------------------------------------------------------------ CLI


def _print_status(current: Status) -> None:
    if current.postgres is not None:
        print(f"postgres: running  {current.postgres.redacted}  (data {current.postgres_dir})")
    else:
        where = current.postgres_dir or "not initialised"
        print(f"postgres: stopped  ({where})")
    if current.kafka is not None:
        print(
            f"kafka:    running  {current.kafka.bootstrap}  (Kafka {current.kafka.version}, "
            f"pid {current.kafka_pid}, data {current.kafka_dir})"
        )
    else:
        print(f"kafka:    stopped  ({current.kafka_dir})")
    if current.s3 is not None:
        print(
            f"s3:       running  {current.s3.endpoint}  (moto, bucket {current.s3.bucket}, "
            f"pid {current.s3_pid}, log {current.s3_dir}/logs/moto.log)"
        )
    else:
        print(f"s3:       stopped  ({current.s3_dir})")
    if current.mariadb is not None:
        print(
            f"mariadb:  running  {current.mariadb.host}:{current.mariadb.port}  (MariaDB "
            f"{current.mariadb.version}, pid {current.mariadb_pid}, data "
            f"{current.mariadb_dir}/data)"
        )
    else:
        print(f"mariadb:  stopped  ({current.mariadb_dir or 'not initialised'})")
    path = env_file()
    print(f"env file: {path if path.exists() else '(none)'}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/services",
        description="Real PostgreSQL, Kafka, S3 (moto) and MariaDB for the integration tests, "
        "without Docker.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("start", "start the services (idempotent) and write .services.env"),
        ("stop", "stop the services and remove .services.env"),
        ("restart", "stop then start the services"),
        ("status", "show what runs (exit 0 only when all selected services run)"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument(
            "--only", action="append", choices=SERVICES, help="limit to one service (repeatable)"
        )
        if name == "restart":
            cmd.add_argument(
                "--mode",
                choices=("smart", "fast", "immediate"),
                default="fast",
                help="pg_ctl stop mode; MariaDB: immediate = SIGKILL, else SIGTERM",
            )
            cmd.add_argument(
                "--kill",
                action="store_true",
                help="SIGKILL the Kafka broker, moto and MariaDB instead of SIGTERM",
            )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="services: %(message)s", stream=sys.stderr)
    only: list[str] | None = args.only
    try:
        if args.command == "start":
            started = time.monotonic()
            start(only)
            log.info("all up in %.1fs; environment in %s", time.monotonic() - started, env_file())
            _print_status(status())
        elif args.command == "stop":
            stop(only)
            _print_status(status())
        elif args.command == "restart":
            names = _selected(only)
            if "postgres" in names:
                mode: PgStopMode = args.mode
                restart_postgres(mode)
            if "kafka" in names:
                restart_kafka(kill=args.kill)
            if "s3" in names:
                restart_s3(kill=args.kill)
            if "mariadb" in names:
                restart_mariadb("immediate" if args.kill else args.mode)
            _print_status(status())
        else:
            current = status()
            _print_status(current)
            wanted = _selected(only)
            up = {
                "postgres": current.postgres is not None,
                "kafka": current.kafka is not None,
                "s3": current.s3 is not None,
                "mariadb": current.mariadb is not None,
            }
            return 0 if all(up[name] for name in wanted) else 3
    except ServiceError as exc:
        log.error("error: %s", exc)
        return 1
    except KeyboardInterrupt:
        log.error("interrupted")
        return 130
    return 0
