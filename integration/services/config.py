"""Constants, results and configuration of the test services (names, ports, directories)."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final, Literal

from integration.services.tls import TlsFiles, ensure_tls

REPO_ROOT: Final = Path(__file__).resolve().parents[2]

#: Newest Kafka 4.x whose full runtime dependency set resolves on Maven Central
#: (4.4.0 is listed there, but its ``kafka-tools-api`` jar is missing).
DEFAULT_KAFKA_VERSION: Final = "4.3.1"
#: Logging binding added to the broker's classpath (Kafka 4 logs through log4j2).
LOG4J_VERSION: Final = "2.25.4"
SLF4J_VERSION: Final = "2.0.17"
DEPENDENCY_PLUGIN: Final = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

PG_ROLE: Final = "eos"
PG_PASSWORD: Final = "eos"
PG_DATABASE: Final = "eos"
PG_MAX_PREPARED_TRANSACTIONS: Final = 64
PG_MAX_CONNECTIONS: Final = 200
#: The language of the test cluster's messages: not English, so that no test can pass by
#: matching English text (Debian's PostgreSQL ships the German translation).
PG_LC_MESSAGES: Final = "de_DE.UTF-8"
HOST: Final = "127.0.0.1"

MARIADB_USER: Final = "eos"
MARIADB_PASSWORD: Final = "eos"
MARIADB_DATABASE: Final = "eos"
#: The TLS-only user (``REQUIRE SSL``), with the same grants as :data:`MARIADB_USER`.
MARIADB_TLS_USER: Final = "eos_tls"
MARIADB_TLS_PASSWORD: Final = "eos-tls-mariadb-pass-3Jd"
MARIADB_MAX_CONNECTIONS: Final = 200

ENV_POSTGRES: Final = "EOS_POSTGRES_CONNINFO"
ENV_KAFKA: Final = "EOS_KAFKA_BOOTSTRAP"
ENV_S3_ENDPOINT: Final = "EOS_S3_ENDPOINT"
ENV_S3_BUCKET: Final = "EOS_S3_BUCKET"
ENV_S3_ACCESS_KEY: Final = "EOS_S3_ACCESS_KEY"
ENV_S3_SECRET_KEY: Final = "EOS_S3_SECRET_KEY"
ENV_MARIADB_URL: Final = "EOS_MARIADB_URL"
ENV_MARIADB_HOST: Final = "EOS_MARIADB_HOST"
ENV_MARIADB_PORT: Final = "EOS_MARIADB_PORT"
ENV_MARIADB_USER: Final = "EOS_MARIADB_USER"
ENV_MARIADB_PASSWORD: Final = "EOS_MARIADB_PASSWORD"
ENV_MARIADB_DATABASE: Final = "EOS_MARIADB_DATABASE"
ENV_MARIADB_TLS_USER: Final = "EOS_MARIADB_TLS_USER"
ENV_MARIADB_TLS_PASSWORD: Final = "EOS_MARIADB_TLS_PASSWORD"
ENV_MARIADB_SSL_CA: Final = "EOS_MARIADB_SSL_CA"
#: Where the services keep their state, and their env file (defaults: ``<repo>/.services``,
#: ``<repo>/.services.env``).
ENV_SERVICES_DIR: Final = "EOS_SERVICES_DIR"
ENV_SERVICES_ENV_FILE: Final = "EOS_SERVICES_ENV_FILE"

#: The bucket the S3 service creates (a valid S3 name) and the fixed test credentials (moto
#: accepts any).
S3_BUCKET: Final = "eos-test"
S3_ACCESS_KEY: Final = "eos-test-access-key"
S3_SECRET_KEY: Final = "eos-test-secret-key"
S3_REGION: Final = "us-east-1"
#: moto's request log is rotated (one old copy kept) at a start that finds it this large.
S3_LOG_ROTATE_BYTES: Final = 20 * 1024 * 1024

ServiceName = Literal["postgres", "kafka", "s3", "mariadb"]
SERVICES: Final[tuple[ServiceName, ...]] = ("postgres", "kafka", "s3", "mariadb")
PgStopMode = Literal["smart", "fast", "immediate"]


class ServiceError(RuntimeError):
    """A service could not be set up, started or stopped; the message names the fix."""


# --------------------------------------------------------------------------- results


@dataclasses.dataclass(frozen=True)
class PostgresInfo:
    host: str
    port: int
    user: str = PG_ROLE
    password: str = PG_PASSWORD
    dbname: str = PG_DATABASE

    @property
    def conninfo(self) -> str:
        return f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{self.dbname}"

    @property
    def redacted(self) -> str:
        """The conninfo without the password, for printing."""
        return f"postgresql://{self.user}:***@{self.host}:{self.port}/{self.dbname}"


@dataclasses.dataclass(frozen=True)
class KafkaInfo:
    host: str
    port: int
    version: str
    sasl_port: int | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"


@dataclasses.dataclass(frozen=True)
class S3Info:
    host: str
    port: int
    bucket: str = S3_BUCKET
    access_key: str = S3_ACCESS_KEY
    secret_key: str = S3_SECRET_KEY
    region: str = S3_REGION

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclasses.dataclass(frozen=True)
class MariaDBInfo:
    host: str
    port: int
    version: str = "?"
    user: str = MARIADB_USER
    password: str = MARIADB_PASSWORD
    database: str = MARIADB_DATABASE

    @property
    def url(self) -> str:
        return f"mariadb://{self.user}:{self.password}@{self.host}:{self.port}/{self.database}"

    @property
    def redacted(self) -> str:
        """The URL without the password, for printing."""
        return f"mariadb://{self.user}:***@{self.host}:{self.port}/{self.database}"


@dataclasses.dataclass(frozen=True)
class Status:
    postgres: PostgresInfo | None
    kafka: KafkaInfo | None
    postgres_dir: Path | None
    kafka_dir: Path
    kafka_pid: int | None
    s3: S3Info | None = None
    s3_dir: Path | None = None
    s3_pid: int | None = None
    mariadb: MariaDBInfo | None = None
    mariadb_dir: Path | None = None
    mariadb_pid: int | None = None


# ------------------------------------------------------------------- configuration


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ServiceError(f"{name}={raw!r} is not a number") from exc


def service_timeout() -> float:
    """Seconds to wait for one service to answer (``$EOS_SERVICES_TIMEOUT``)."""
    return _env_float("EOS_SERVICES_TIMEOUT", 120.0)


#: (state directory, env file) of the instance this thread's calls act on, when
#: :func:`routed_to` set one (:mod:`integration.services.instance`); else the environment's.
_ROUTE: contextvars.ContextVar[tuple[Path, Path] | None] = contextvars.ContextVar(
    "eos_services_route", default=None)


@contextlib.contextmanager
def routed_to(state: Path, env: Path) -> Iterator[None]:
    """Within the block, this thread's calls of the services' functions act on the
    instance whose state is in ``state`` and whose env file is ``env`` (not the shared one
    of ``$EOS_SERVICES_DIR`` / ``<repo>/.services``)."""
    token = _ROUTE.set((state, env))
    try:
        yield
    finally:
        _ROUTE.reset(token)


def state_dir() -> Path:
    route = _ROUTE.get()
    if route is not None:
        return route[0]
    raw = os.environ.get(ENV_SERVICES_DIR, "").strip()
    return Path(raw).resolve() if raw else REPO_ROOT / ".services"


def env_file() -> Path:
    route = _ROUTE.get()
    if route is not None:
        return route[1]
    raw = os.environ.get(ENV_SERVICES_ENV_FILE, "").strip()
    return Path(raw).resolve() if raw else REPO_ROOT / ".services.env"


def cache_dir() -> Path:
    raw = os.environ.get("EOS_CACHE_DIR", "").strip()
    return Path(raw).expanduser().resolve() if raw else Path.home() / ".cache" / "connectors"


def tls_files() -> TlsFiles:
    """The secured services' certificates (:mod:`integration.services.tls`), made when missing."""
    try:
        return ensure_tls(state_dir() / "tls")
    except RuntimeError as exc:
        raise ServiceError(f"cannot make the test certificates: {exc}") from exc


def kafka_version() -> str:
    version = os.environ.get("EOS_KAFKA_VERSION", "").strip() or DEFAULT_KAFKA_VERSION
    if not re.fullmatch(r"4\.\d+\.\d+", version):
        raise ServiceError(
            f"EOS_KAFKA_VERSION={version!r}: expected a Kafka 4.x release such as 4.3.1"
        )
    return version


def _kafka_dir() -> Path:
    return state_dir() / "kafka"


def _s3_dir() -> Path:
    return state_dir() / "s3"


def _fallback_root(service: str) -> Path:
    """Where a service run by the service user keeps its files when that user cannot reach
    ``state_dir()``: one per state directory, so two checkouts never share one."""
    digest = hashlib.sha1(str(state_dir()).encode(), usedforsecurity=False).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"eos-services-{os.getuid()}-{digest}" / service


def _fallback_pg_root() -> Path:
    """Where the PostgreSQL cluster goes when the service user cannot reach ``state_dir()``."""
    return _fallback_root("postgres")
