"""The whole set-up: status, the env file (``.services.env``), start and stop of a selection."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from integration.services import secured as _secured
from integration.services.config import (
    ENV_KAFKA,
    ENV_MARIADB_DATABASE,
    ENV_MARIADB_HOST,
    ENV_MARIADB_PASSWORD,
    ENV_MARIADB_PORT,
    ENV_MARIADB_SSL_CA,
    ENV_MARIADB_TLS_PASSWORD,
    ENV_MARIADB_TLS_USER,
    ENV_MARIADB_URL,
    ENV_MARIADB_USER,
    ENV_POSTGRES,
    ENV_S3_ACCESS_KEY,
    ENV_S3_BUCKET,
    ENV_S3_ENDPOINT,
    ENV_S3_SECRET_KEY,
    MARIADB_TLS_PASSWORD,
    MARIADB_TLS_USER,
    SERVICES,
    KafkaInfo,
    MariaDBInfo,
    PostgresInfo,
    S3Info,
    ServiceName,
    Status,
    _kafka_dir,
    _s3_dir,
    env_file,
    state_dir,
)
from integration.services.kafka import _kafka_status, start_kafka, stop_kafka
from integration.services.mariadb import _mariadb_status, start_mariadb, stop_mariadb
from integration.services.postgres import _postgres_status, start_postgres, stop_postgres
from integration.services.process import _locked
from integration.services.s3 import _s3_status, start_s3, stop_s3
from integration.services.tls import TlsFiles

log = logging.getLogger("connectors.services")


# ---------------------------------------------------------------------- whole set-up


def status() -> Status:
    postgres, pg_root = _postgres_status()
    kafka, pid = _kafka_status()
    s3, s3_pid = _s3_status()
    mariadb, mariadb_dir, mariadb_pid = _mariadb_status()
    return Status(
        postgres=postgres,
        kafka=kafka,
        postgres_dir=pg_root,
        kafka_dir=_kafka_dir(),
        kafka_pid=pid,
        s3=s3,
        s3_dir=_s3_dir(),
        s3_pid=s3_pid,
        mariadb=mariadb,
        mariadb_dir=mariadb_dir,
        mariadb_pid=mariadb_pid,
    )


def read_env_file(path: Path | None = None) -> dict[str, str]:
    """KEY=VALUE pairs of ``.services.env`` (empty when absent)."""
    path = path or env_file()
    values: dict[str, str] = {}
    try:
        text = path.read_text()
    except OSError:
        return values
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        key = key.removeprefix("export ").strip()
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key] = value
    return values


def _refresh_env_file() -> None:
    """Rewrite ``.services.env`` with what runs now; remove it when nothing runs."""
    current = status()
    lines: list[str] = []
    if current.postgres is not None:
        lines.append(f"{ENV_POSTGRES}={current.postgres.conninfo}")
    if current.kafka is not None:
        lines.append(f"{ENV_KAFKA}={current.kafka.bootstrap}")
    pg = (current.postgres.host, current.postgres.port, current.postgres.dbname
          ) if current.postgres is not None else None
    sasl = (current.kafka.host, current.kafka.sasl_port) if (
        current.kafka is not None and current.kafka.sasl_port is not None) else None
    if pg is not None or sasl is not None:
        lines += _secured.env_lines(pg, sasl, TlsFiles(state_dir() / "tls"))
    if current.s3 is not None:
        lines.append(f"{ENV_S3_ENDPOINT}={current.s3.endpoint}")
        lines.append(f"{ENV_S3_BUCKET}={current.s3.bucket}")
        lines.append(f"{ENV_S3_ACCESS_KEY}={current.s3.access_key}")
        lines.append(f"{ENV_S3_SECRET_KEY}={current.s3.secret_key}")
    if current.mariadb is not None:
        lines += _mariadb_env_lines(current.mariadb)
    path = env_file()
    if not lines:
        path.unlink(missing_ok=True)
        return
    header = "# Written by scripts/services; shell-sourceable KEY=VALUE lines.\n"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(header + "\n".join(lines) + "\n")
    tmp.replace(path)


def _mariadb_env_lines(info: MariaDBInfo) -> list[str]:
    """MariaDB's address, its users and the CA that signed its certificate."""
    return [
        f"{ENV_MARIADB_URL}={info.url}",
        f"{ENV_MARIADB_HOST}={info.host}",
        f"{ENV_MARIADB_PORT}={info.port}",
        f"{ENV_MARIADB_USER}={info.user}",
        f"{ENV_MARIADB_PASSWORD}={info.password}",
        f"{ENV_MARIADB_DATABASE}={info.database}",
        f"{ENV_MARIADB_TLS_USER}={MARIADB_TLS_USER}",
        f"{ENV_MARIADB_TLS_PASSWORD}={MARIADB_TLS_PASSWORD}",
        f"{ENV_MARIADB_SSL_CA}={TlsFiles(state_dir() / 'tls').ca}",
    ]


def _selected(only: Sequence[str] | None) -> tuple[ServiceName, ...]:
    if not only:
        return SERVICES
    return tuple(name for name in SERVICES if name in only)


def start(
    only: Sequence[str] | None = None,
) -> tuple[PostgresInfo | None, KafkaInfo | None, S3Info | None, MariaDBInfo | None]:
    """Start the selected services (default all); idempotent."""
    names = _selected(only)
    postgres = start_postgres() if "postgres" in names else None
    kafka = start_kafka() if "kafka" in names else None
    s3 = start_s3() if "s3" in names else None
    mariadb = start_mariadb() if "mariadb" in names else None
    return postgres, kafka, s3, mariadb


def stop(only: Sequence[str] | None = None) -> None:
    """Stop the selected services (default all)."""
    names = _selected(only)
    if "mariadb" in names and not stop_mariadb():
        log.info("MariaDB was not running")
    if "s3" in names and not stop_s3():
        log.info("S3 (moto) was not running")
    if "kafka" in names and not stop_kafka():
        log.info("Kafka was not running")
    if "postgres" in names and not stop_postgres():
        log.info("PostgreSQL was not running")
    with _locked():
        _refresh_env_file()
