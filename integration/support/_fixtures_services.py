"""Session fixtures that hand the integration tests a real PostgreSQL, Kafka and S3 API
(MariaDB's, resolved the same way: integration/support/_fixtures_mariadb.py).

``postgres_conninfo`` / ``kafka_bootstrap`` / ``s3_service`` resolve each service once per
session:

1. ``$EOS_POSTGRES_CONNINFO`` / ``$EOS_KAFKA_BOOTSTRAP`` / ``$EOS_S3_ENDPOINT`` when set
   (must answer), else the same keys from ``<repo>/.services.env`` (written by
   ``scripts/services start``; used only when the service answers, a stale file is
   ignored). S3's bucket and keys come from the same place (``EOS_S3_BUCKET``,
   ``EOS_S3_ACCESS_KEY``, ``EOS_S3_SECRET_KEY``; unset ones default to the native
   service's);
2. a Docker engine that answers ``docker info``: pytest-docker's ``docker_services`` with
   ``docker/docker-compose.yml`` (pytest-docker is only touched on this path; the compose
   file has no S3, which always comes from 1 or 3; MariaDB is ``$EOS_MARIADB_URL``);
3. otherwise the native services of :mod:`integration.services`, started here and stopped
   at session end only when this session started them.

``$EOS_SERVICES_BACKEND`` = ``auto`` (default), ``docker`` or ``native`` forces 2 or 3.
A service that cannot be had fails the test under ``CI=true`` and skips it elsewhere.

``native_postgres`` / ``native_kafka`` / ``native_s3`` give a test that restarts, stops or
kills a service one of its module's own (:class:`~integration.services.instance.ServiceInstance`,
native, started on demand): the shared ones serve the other tests meanwhile, so these tests
run beside them on any worker.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar
from urllib.parse import urlsplit

import pytest

from integration import services as _services
from integration.services.instance import ServiceInstance

__all__ = [
    "NativeKafka",
    "NativePostgres",
    "NativeS3",
    "S3Service",
    "ServiceResolver",
    "docker_compose_file",
    "eos_services",
    "kafka_bootstrap",
    "native_kafka",
    "native_postgres",
    "native_s3",
    "postgres_conninfo",
    "private_services",
    "register_markers",
    "s3_service",
]

ServiceName = _services.ServiceName
COMPOSE_FILE = _services.REPO_ROOT / "docker" / "docker-compose.yml"
_ENV_VARS: dict[ServiceName, str] = {
    "postgres": _services.ENV_POSTGRES,
    "kafka": _services.ENV_KAFKA,
    "s3": _services.ENV_S3_ENDPOINT,
    "mariadb": _services.ENV_MARIADB_URL,
}
_PROBE_TIMEOUT = 15.0


def register_markers(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "integration: needs real services (PostgreSQL, Kafka, S3, Spark JVM)"
    )


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _unavailable(message: str) -> NoReturn:
    if _in_ci():
        pytest.fail(f"{message} (CI=true: a missing service is a failure)", pytrace=False)
    pytest.skip(message)


def redact(value: str) -> str:
    """A conninfo (URL or ``key=value`` form) without its password, for messages."""
    if "://" not in value:
        return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", value)
    parts = urlsplit(value)
    if parts.password is None:
        return value
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


# ------------------------------------------------------------------------ probes


def _probe_postgres(conninfo: str) -> str | None:
    """None when a connection and ``SELECT 1`` work, else the error."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install 'psycopg[binary]')"
    try:
        with psycopg.connect(conninfo, connect_timeout=5, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"{type(exc).__name__}: {exc}".strip()
    return None


def _probe_kafka(bootstrap: str) -> str | None:
    """None when the first bootstrap broker answers a Metadata request, else the error."""
    first = bootstrap.split(",")[0].strip()
    host, sep, port = first.rpartition(":")
    if not sep or not port.isdigit():
        return f"cannot parse bootstrap address {bootstrap!r} (expected host:port)"
    if _services.kafka_metadata_ok(host.strip("[]"), int(port)):
        return None
    return f"no Kafka broker answers a Metadata request at {first}"


def _probe_s3(endpoint: str) -> str | None:
    """None when an S3 API answers ``GET /`` at the ``http://host:port`` endpoint."""
    parts = urlsplit(endpoint)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        return f"cannot parse S3 endpoint {endpoint!r} (expected http://host:port)"
    if parts.scheme == "https":
        return None  # the services' probe speaks plain HTTP; a TLS endpoint is taken on trust
    if _services.s3_answers(parts.hostname, port):
        return None
    return f"no S3 API answers GET / at {endpoint}"


def _probe_mariadb(url: str) -> str | None:
    """None when ``mariadb://user:password@host:port/db`` takes a login and ``SELECT 1``
    (the ``mariadb`` command line: no Python driver is a dependency yet)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "mariadb" or not parts.hostname or port is None or not parts.username:
        return f"cannot parse {redact(url)!r} (expected mariadb://user:password@host:port/db)"
    return _services.mariadb_answers(parts.hostname, port, parts.username,
                                     parts.password or "", parts.path.lstrip("/"))


_PROBES = {"postgres": _probe_postgres, "kafka": _probe_kafka, "s3": _probe_s3,
           "mariadb": _probe_mariadb}


def _probe(service: ServiceName, value: str, timeout: float) -> str | None:
    """Retry the probe until it succeeds or ``timeout`` passes; None on success."""
    deadline = time.monotonic() + timeout
    while True:
        error = _PROBES[service](value)
        if error is None or time.monotonic() >= deadline:
            return None if error is None else " ".join(error.split())
        time.sleep(1.0)


def _docker_engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        proc = subprocess.run(
            ["docker", "info"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


# ---------------------------------------------------------------------- resolver


class ServiceResolver:
    """Finds each service once per session and remembers what it started."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request
        self._resolved: dict[ServiceName, str] = {}
        self._source: dict[ServiceName, str] = {}
        self._failures: dict[ServiceName, str] = {}
        self._started_natively: list[ServiceName] = []
        self._docker: Any = None
        self._docker_failure: str | None = None
        self._env_file = _services.read_env_file()
        backend = os.environ.get("EOS_SERVICES_BACKEND", "auto").strip().lower() or "auto"
        if backend not in ("auto", "docker", "native"):
            raise pytest.UsageError(
                f"EOS_SERVICES_BACKEND={backend!r}: expected auto, docker or native"
            )
        self._backend = backend

    def source(self, service: ServiceName) -> str | None:
        """Where the service came from: env, env-file, docker, native (None: unresolved)."""
        return self._source.get(service)

    def get(self, service: ServiceName) -> str:
        if service in self._resolved:
            return self._resolved[service]
        if service in self._failures:
            _unavailable(self._failures[service])
        value = self._resolve(service)
        self._resolved[service] = value
        return value

    def _fail(self, service: ServiceName, message: str) -> NoReturn:
        self._failures[service] = message
        _unavailable(message)

    def _resolve(self, service: ServiceName) -> str:
        var = _ENV_VARS[service]
        explicit = os.environ.get(var, "").strip()
        if explicit:
            error = _probe(service, explicit, _PROBE_TIMEOUT)
            if error is not None:
                self._fail(
                    service,
                    f"{var}={redact(explicit)} is set but {service} does not answer ({error}). "
                    f"Fix: start that service, or unset {var} to let the tests start one.",
                )
            self._source[service] = "env"
            return explicit

        from_file = self._env_file.get(var, "").strip()
        if from_file and _probe(service, from_file, 2.0) is None:
            self._source[service] = "env-file"
            return from_file

        if service == "s3":  # not in docker/docker-compose.yml
            return self._from_native(service)
        if self._backend == "docker" or (self._backend == "auto" and _docker_engine_answers()):
            return self._from_docker(service)
        return self._from_native(service)

    def s3(self) -> S3Service:
        """The S3 service: its endpoint resolved like the others, bucket and keys beside it."""
        endpoint = self.get("s3")
        source = self._source.get("s3")
        values: Mapping[str, str] = (
            os.environ if source == "env" else self._env_file if source == "env-file" else {}
        )

        def value(var: str, default: str) -> str:
            return values.get(var, "").strip() or default

        return S3Service(
            endpoint=endpoint,
            bucket=value(_services.ENV_S3_BUCKET, _services.S3_BUCKET),
            access_key=value(_services.ENV_S3_ACCESS_KEY, _services.S3_ACCESS_KEY),
            secret_key=value(_services.ENV_S3_SECRET_KEY, _services.S3_SECRET_KEY),
        )

    def _from_docker(self, service: ServiceName) -> str:
        if self._docker is None and self._docker_failure is None:
            try:
                self._docker = self._request.getfixturevalue("docker_services")
            except pytest.FixtureLookupError:
                self._docker_failure = (
                    "pytest-docker is not installed (pip install pytest-docker), "
                    "so docker/docker-compose.yml cannot be used"
                )
            except Exception as exc:  # pytest-docker raises plain Exception on compose errors
                self._docker_failure = f"`docker compose up` failed: {exc}"
        if self._docker is None:
            if self._backend == "docker":
                self._fail(service, self._docker_failure or "Docker services unavailable")
            return self._from_native(service)
        docker_ip = str(self._request.getfixturevalue("docker_ip"))
        if service == "postgres":
            port = int(self._docker.port_for("postgres", 5432))
            value = f"postgresql://eos:eos@{docker_ip}:{port}/eos"
        elif service == "mariadb":
            port = int(self._docker.port_for("mariadb", 3306))
            value = f"mariadb://eos:eos@{docker_ip}:{port}/eos"
        else:
            port = int(self._docker.port_for("kafka", 9092))
            value = f"{docker_ip}:{port}"
        error = _probe(service, value, _services.service_timeout())
        if error is not None:
            self._fail(
                service, f"{service} from docker/docker-compose.yml does not answer: {error}"
            )
        self._source[service] = "docker"
        return value

    def _from_native(self, service: ServiceName) -> str:
        current = _services.status()
        running = {"postgres": current.postgres, "kafka": current.kafka, "s3": current.s3,
                   "mariadb": current.mariadb}
        was_running = running[service] is not None
        try:
            if service == "postgres":
                value = _services.start_postgres().conninfo
            elif service == "kafka":
                value = _services.start_kafka().bootstrap
            elif service == "mariadb":
                value = _services.start_mariadb().url
            else:
                value = _services.start_s3().endpoint
        except _services.ServiceError as exc:
            self._fail(
                service,
                f"could not start {service} natively: {exc}\n"
                "Fix: run `scripts/services start` and read its output, or point "
                f"{_ENV_VARS[service]} at a running {service}.",
            )
        if not was_running:
            self._started_natively.append(service)
        self._source[service] = "native"
        return value

    def is_native(self, service: ServiceName) -> bool:
        """True when the resolved endpoint is the one managed by integration.services."""
        value = self._resolved.get(service)
        if value is None:
            return False
        current = _services.status()
        if service == "postgres":
            return current.postgres is not None and current.postgres.conninfo == value
        if service == "s3":
            return current.s3 is not None and current.s3.endpoint == value
        if service == "mariadb":
            return current.mariadb is not None and current.mariadb.url == value
        return current.kafka is not None and current.kafka.bootstrap == value

    def close(self) -> None:
        for service in reversed(self._started_natively):
            try:
                if service == "postgres":
                    _services.stop_postgres()
                elif service == "s3":
                    _services.stop_s3()
                elif service == "mariadb":
                    _services.stop_mariadb()
                else:
                    _services.stop_kafka()
            except _services.ServiceError as exc:  # teardown must not hide test results
                print(f"warning: could not stop {service}: {exc}")
        self._started_natively.clear()


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def docker_compose_file() -> str:
    """pytest-docker: the compose file with PostgreSQL and Kafka (S3 is always native)."""
    return str(COMPOSE_FILE)


@pytest.fixture(scope="session")
def eos_services(request: pytest.FixtureRequest) -> Iterator[ServiceResolver]:
    resolver = ServiceResolver(request)
    try:
        yield resolver
    finally:
        resolver.close()


@pytest.fixture(scope="session")
def postgres_conninfo(eos_services: ServiceResolver) -> str:
    """``postgresql://user:password@host:port/db`` of a PostgreSQL with 2PC enabled."""
    return eos_services.get("postgres")


@pytest.fixture(scope="session")
def kafka_bootstrap(eos_services: ServiceResolver) -> str:
    """``host:port`` of a Kafka 4.x broker with transactions (auto topic creation off)."""
    return eos_services.get("kafka")


@dataclass(frozen=True)
class S3Service:
    """An S3 API and a bucket in it, with what Spark (s3a) and delta-rs need to reach it."""

    endpoint: str
    bucket: str
    access_key: str
    secret_key: str
    region: str = _services.S3_REGION

    def prefix(self, name: str) -> str:
        """A fresh, unique ``s3a://<bucket>/<name>-<uuid>`` for one test's objects.

        ``name`` is typically ``request.node.name``; characters that are awkward in an S3
        key (anything but letters, digits, ``.``, ``_`` and ``-``) become ``-``.
        """
        safe = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "test"
        return f"s3a://{self.bucket}/{safe[:100]}-{uuid.uuid4().hex}"

    def hadoop_confs(self) -> dict[str, str]:
        """The Spark confs a user passes for Hadoop's s3a file system to use this server."""
        return {
            "spark.hadoop.fs.s3a.endpoint": self.endpoint,
            "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.access.key": self.access_key,
            "spark.hadoop.fs.s3a.secret.key": self.secret_key,
            "spark.hadoop.fs.s3a.connection.ssl.enabled": str(
                self.endpoint.startswith("https://")
            ).lower(),
            "spark.hadoop.fs.s3a.endpoint.region": self.region,
        }

    def storage_options(self) -> dict[str, str]:
        """delta-rs' ``storage_options`` for this server (plain HTTP, unsafe rename: the
        tests have one writer per table and no locking provider)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_ALLOW_HTTP": "true",
            "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
        }


@dataclass(frozen=True)
class NativePostgres:
    """A PostgreSQL of the test module's own (:class:`ServiceInstance`), to restart, stop
    and start; the conninfo stays valid across restarts."""

    conninfo: str
    instance: ServiceInstance

    def restart(
        self, mode: _services.PgStopMode = "fast", downtime: float = 0.0
    ) -> _services.PostgresInfo:
        with self.instance.active():
            return _services.restart_postgres(mode=mode, downtime=downtime)

    def stop(self, mode: _services.PgStopMode = "fast") -> None:
        with self.instance.active():
            _services.stop_postgres(mode)

    def start(self) -> _services.PostgresInfo:
        """Start it after :meth:`stop`: at the same address (clients keep their conninfo)."""
        with self.instance.active():
            return _services.start_postgres(keep_ports=True)


@dataclass(frozen=True)
class NativeKafka:
    """A Kafka broker of the test module's own, to restart, kill and start; the bootstrap
    address stays valid."""

    bootstrap: str
    instance: ServiceInstance

    def restart(self, kill: bool = False, downtime: float = 0.0) -> _services.KafkaInfo:
        with self.instance.active():
            return _services.restart_kafka(kill=kill, downtime=downtime)

    def stop(self, kill: bool = False) -> None:
        with self.instance.active():
            _services.stop_kafka(kill=kill)

    def start(self) -> _services.KafkaInfo:
        """Start it after :meth:`stop`: at the same address (clients keep their bootstrap)."""
        with self.instance.active():
            return _services.start_kafka(keep_ports=True)


@pytest.fixture(scope="session")
def s3_service(eos_services: ServiceResolver) -> S3Service:
    """An S3 API (moto's server, natively) with a bucket; ``prefix(request.node.name)``
    gives a test its own ``s3a://`` prefix, ``hadoop_confs()`` / ``storage_options()`` the
    settings Spark and delta-rs need."""
    return eos_services.s3()


@dataclass(frozen=True)
class NativeS3:
    """An S3 API (moto) of the test module's own; the endpoint stays valid across restarts,
    the objects do not (moto keeps them in memory: the bucket comes back empty)."""

    service: S3Service
    instance: ServiceInstance

    def restart(self, kill: bool = False, downtime: float = 0.0) -> _services.S3Info:
        with self.instance.active():
            return _services.restart_s3(kill=kill, downtime=downtime)

    def stop(self, kill: bool = False) -> None:
        with self.instance.active():
            _services.stop_s3(kill=kill)

    def start(self) -> _services.S3Info:
        with self.instance.active():
            return _services.start_s3()


@pytest.fixture(scope="module")
def private_services() -> Iterator[ServiceInstance]:
    """The test module's own services, for the tests that restart, stop or kill one (the
    shared ones serve every other test at the same time): each starts on first use
    (``native_postgres``, ``native_kafka``, ``native_s3``), in a directory of its own, and
    all are stopped and removed after the module."""
    instance = ServiceInstance()
    try:
        yield instance
    finally:
        instance.close()


_Info = TypeVar("_Info")


def _private(name: str, start: Callable[[], _Info]) -> _Info:
    """Start one of the module's own services; one that cannot start fails the test under
    ``CI=true`` and skips it elsewhere, with the reason."""
    try:
        return start()
    except _services.ServiceError as exc:
        _unavailable(f"could not start a {name} of the test's own: {exc}")


@pytest.fixture
def native_postgres(private_services: ServiceInstance) -> Iterator[NativePostgres]:
    """A PostgreSQL of this module's own to restart (``native_postgres.conninfo``: put
    the test's tables there). After the test it is started again if the test left it
    stopped."""
    info = _private("PostgreSQL", private_services.postgres)
    yield NativePostgres(info.conninfo, private_services)
    private_services.postgres()  # idempotent: started again only if the test left it stopped


@pytest.fixture
def native_kafka(private_services: ServiceInstance) -> Iterator[NativeKafka]:
    """A Kafka broker of this module's own to restart (``native_kafka.bootstrap``: put the
    test's topics there). After the test it is started again if the test left it stopped."""
    info = _private("Kafka broker", private_services.kafka)
    yield NativeKafka(info.bootstrap, private_services)
    private_services.kafka()  # idempotent: started again only if the test left it stopped


@pytest.fixture
def native_s3(private_services: ServiceInstance) -> Iterator[NativeS3]:
    """An S3 API (moto) of this module's own, with the bucket, to restart. After the test
    it is started again (with its bucket) if the test left it stopped."""
    info = _private("S3 API (moto)", private_services.s3)
    service = S3Service(endpoint=info.endpoint, bucket=info.bucket, access_key=info.access_key,
                        secret_key=info.secret_key, region=info.region)
    yield NativeS3(service, private_services)
    private_services.s3()  # idempotent: started again only if the test left it stopped
