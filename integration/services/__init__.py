"""Real PostgreSQL, Apache Kafka and an S3 API for the integration tests, without Docker.

Standard library only, so ``scripts/services`` works before any pip install (the S3 part
needs ``moto[server]`` and its ``boto3``, of the ``[dev]`` extra, when it starts).

* PostgreSQL: a private cluster (``initdb``) under ``<state>/postgres``, run by a
  non-root user (``eos``, created with ``useradd`` when running as root), listening
  on 127.0.0.1 on a port chosen once and kept in ``<state>/state.json``;
  ``max_prepared_transactions = 64``. Role/password/database ``eos``/``eos``/``eos``
  (password auth over TCP, trust over the private unix socket). The server answers in
  German (``lc_messages = 'de_DE.UTF-8'``; the locale is generated when missing), so that
  the sinks' error tests prove they classify by SQLSTATE, never by English text. When the
  locale cannot be had, the reason is logged and kept (:func:`postgres_messages`).
* Kafka: the broker jars (``org.apache.kafka:kafka_2.13``) fetched once by Maven into
  ``${EOS_CACHE_DIR:-~/.cache/connectors}/kafka-<version>/libs``; one KRaft node in
  combined mode (broker + controller) under ``<state>/kafka``, run as
  ``java -cp 'libs/*' kafka.Kafka server.properties``. ``auto.create.topics.enable``
  is **false**: tests create their topics explicitly.
* S3: moto's server mode (``python -m moto.server``, the interpreter running this module)
  on 127.0.0.1 on a port chosen once and kept, run from ``<state>/s3`` (its log in
  ``<state>/s3/logs/moto.log``), with one bucket, :data:`S3_BUCKET`, created after it
  answers (idempotently, with boto3, region :data:`S3_REGION`). Any access key is accepted;
  the fixed test ones are :data:`S3_ACCESS_KEY` / :data:`S3_SECRET_KEY`. moto keeps its
  state in memory only, so **a restart (or stop) of s3 empties it**: the start re-creates
  the bucket, empty. (moto's request recorder, ``MOTO_ENABLE_RECORDING``, is no
  persistence: it logs every request, bodies included, and replays them; a replayed
  multipart upload gets a new upload id, so its later parts and its completion fail.)

``<state>`` is ``<repo>/.services`` (``$EOS_SERVICES_DIR`` overrides). When the
service user cannot reach that directory (for example a repository under ``/root``),
the PostgreSQL part falls back to ``/tmp/eos-services-<uid>-<hash>/postgres``.

Command line (``scripts/services`` wraps this)::

    python3 -m integration.services start [--only postgres|kafka|s3]
    python3 -m integration.services stop [--only postgres|kafka|s3]
    python3 -m integration.services restart [--only ...] [--mode fast|immediate] [--kill]
    python3 -m integration.services status [--only ...]

Secured listeners beside the plain ones (:mod:`integration.services.secured`, certificates by
:mod:`integration.services.tls` under ``<state>/tls``): PostgreSQL also over TLS, with the
least-privilege roles ``eos_cert`` (client certificate) and ``eos_tls``
(scram-sha-256), TLS only; Kafka with a ``SASL_SSL`` listener (SCRAM-SHA-512), the
``StandardAuthorizer`` (``User:ANONYMOUS``, the PLAINTEXT listener, is a super user) and
users holding exactly the sink's ACLs.

``start`` writes ``<repo>/.services.env`` (``EOS_POSTGRES_CONNINFO``,
``EOS_KAFKA_BOOTSTRAP``, ``EOS_S3_ENDPOINT``, ``EOS_S3_BUCKET``, ``EOS_S3_ACCESS_KEY``,
``EOS_S3_SECRET_KEY``, and the secured listeners' ``EOS_POSTGRES_TLS_CONNINFO``,
``EOS_POSTGRES_TLS_SCRAM_CONNINFO``, ``EOS_KAFKA_SASL_BOOTSTRAP``,
``EOS_KAFKA_SASL_CONFIG``, ``EOS_KAFKA_SASL_READER_CONFIG``); ``stop`` removes it once
nothing runs any more.

From tests: :func:`start_postgres`, :func:`stop_postgres`, :func:`restart_postgres`,
:func:`start_kafka`, :func:`stop_kafka`, :func:`restart_kafka`, :func:`start_s3`,
:func:`stop_s3`, :func:`restart_s3`, :func:`status`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final, Literal

from integration.services import secured as _secured
from integration.services.tls import TlsFiles, ensure_tls

__all__ = [
    "ENV_KAFKA",
    "ENV_POSTGRES",
    "ENV_S3_ACCESS_KEY",
    "ENV_S3_BUCKET",
    "ENV_S3_ENDPOINT",
    "ENV_S3_SECRET_KEY",
    "REPO_ROOT",
    "S3_ACCESS_KEY",
    "S3_BUCKET",
    "S3_REGION",
    "S3_SECRET_KEY",
    "KafkaInfo",
    "PgStopMode",
    "PostgresInfo",
    "S3Info",
    "ServiceError",
    "Status",
    "cache_dir",
    "env_file",
    "kafka_libs",
    "kafka_metadata_ok",
    "kafka_version",
    "postgres_messages",
    "read_env_file",
    "restart_kafka",
    "restart_postgres",
    "restart_s3",
    "s3_answers",
    "service_timeout",
    "start",
    "start_kafka",
    "start_postgres",
    "start_s3",
    "state_dir",
    "status",
    "stop",
    "stop_kafka",
    "stop_postgres",
    "stop_s3",
]

log = logging.getLogger("connectors.services")

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

ENV_POSTGRES: Final = "EOS_POSTGRES_CONNINFO"
ENV_KAFKA: Final = "EOS_KAFKA_BOOTSTRAP"
ENV_S3_ENDPOINT: Final = "EOS_S3_ENDPOINT"
ENV_S3_BUCKET: Final = "EOS_S3_BUCKET"
ENV_S3_ACCESS_KEY: Final = "EOS_S3_ACCESS_KEY"
ENV_S3_SECRET_KEY: Final = "EOS_S3_SECRET_KEY"

#: The bucket the S3 service creates (a valid S3 name) and the fixed test credentials (moto
#: accepts any).
S3_BUCKET: Final = "eos-test"
S3_ACCESS_KEY: Final = "eos-test-access-key"
S3_SECRET_KEY: Final = "eos-test-secret-key"
S3_REGION: Final = "us-east-1"
#: moto's request log is rotated (one old copy kept) at a start that finds it this large.
S3_LOG_ROTATE_BYTES: Final = 20 * 1024 * 1024

ServiceName = Literal["postgres", "kafka", "s3"]
SERVICES: Final[tuple[ServiceName, ...]] = ("postgres", "kafka", "s3")
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
class Status:
    postgres: PostgresInfo | None
    kafka: KafkaInfo | None
    postgres_dir: Path | None
    kafka_dir: Path
    kafka_pid: int | None
    s3: S3Info | None = None
    s3_dir: Path | None = None
    s3_pid: int | None = None


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


def state_dir() -> Path:
    raw = os.environ.get("EOS_SERVICES_DIR", "").strip()
    return Path(raw).resolve() if raw else REPO_ROOT / ".services"


def env_file() -> Path:
    raw = os.environ.get("EOS_SERVICES_ENV_FILE", "").strip()
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


def _fallback_pg_root() -> Path:
    """Where the cluster goes when the service user cannot reach ``state_dir()``.

    One per state directory, so two checkouts never share a cluster.
    """
    digest = hashlib.sha1(str(state_dir()).encode(), usedforsecurity=False).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"eos-services-{os.getuid()}-{digest}" / "postgres"


# ------------------------------------------------------------------------- helpers


_lock_state = threading.local()
_thread_lock = threading.RLock()


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Serialise start/stop across processes (flock) and threads; re-entrant."""
    with _thread_lock:
        depth: int = getattr(_lock_state, "depth", 0)
        if depth:
            _lock_state.depth = depth + 1
            try:
                yield
            finally:
                _lock_state.depth = depth
            return
        directory = state_dir()
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / ".lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            _lock_state.depth = 1
            try:
                yield
            finally:
                _lock_state.depth = 0
                fcntl.flock(handle, fcntl.LOCK_UN)


def _load_state() -> dict[str, Any]:
    path = state_dir() / "state.json"
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ServiceError(f"{path} is unreadable ({exc}); delete it to start afresh") from exc
    return data if isinstance(data, dict) else {}


def _save_state(state: dict[str, Any]) -> None:
    path = state_dir() / "state.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def _section(state: dict[str, Any], name: str) -> dict[str, Any]:
    value = state.get(name)
    if not isinstance(value, dict):
        value = {}
        state[name] = value
    return value


def _is_root() -> bool:
    return os.geteuid() == 0


def _run(
    argv: Sequence[str],
    *,
    timeout: float,
    check: bool = True,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command with a bounded time; output captured (stdout+stderr)."""
    try:
        proc = subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            env=env,
            cwd=cwd,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ServiceError(f"`{shlex.join(argv)}` did not finish within {timeout:.0f}s") from exc
    except FileNotFoundError as exc:
        raise ServiceError(f"`{argv[0]}` not found: {exc}") from exc
    if check and proc.returncode != 0:
        raise ServiceError(
            f"`{shlex.join(argv)}` failed with exit code {proc.returncode}:\n{proc.stdout.strip()}"
        )
    return proc


def _tail(path: Path, lines: int = 50) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 256 * 1024))
            text = handle.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def _log_excerpt(path: Path, lines: int = 50) -> str:
    return f"--- last {lines} lines of {path} ---\n{_tail(path, lines)}\n--- end of {path.name} ---"


def _port_free(port: int) -> bool:
    """True when nothing listens on HOST:port (bind test with SO_REUSEADDR, like the servers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list[int]:
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((HOST, 0))
            socks.append(sock)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def _stable_port(section: dict[str, Any], key: str, running: bool, taken: set[int]) -> int:
    """The stored port, unless something else took it meanwhile (then a new one)."""
    stored = section.get(key)
    if isinstance(stored, int) and 0 < stored < 65536:
        if running or (stored not in taken and _port_free(stored)):
            return stored
        log.warning("port %d (%s) is taken by another process; choosing a new one", stored, key)
    while True:
        (port,) = _free_ports(1)
        if port not in taken:
            section[key] = port
            return port


def _wait(
    what: str,
    check: Any,
    *,
    timeout: float,
    alive: Any = None,
    interval: float = 0.5,
    progress_every: float = 10.0,
) -> float:
    """Poll ``check()`` until true; returns seconds waited. ``alive()`` False aborts early."""
    start = time.monotonic()
    next_progress = start + progress_every
    while True:
        if check():
            return time.monotonic() - start
        now = time.monotonic()
        if alive is not None and not alive():
            raise ServiceError(f"{what}: the process exited while starting")
        if now - start > timeout:
            raise ServiceError(f"{what}: no answer within {timeout:.0f}s")
        if now >= next_progress:
            log.info("  ... still waiting for %s (%.0fs)", what, now - start)
            next_progress = now + progress_every
        time.sleep(interval)


# ------------------------------------------------------------- packages and users

_apt_updated = False


def _apt_install(packages: Sequence[str], why: str) -> None:
    global _apt_updated
    if not _is_root() or shutil.which("apt-get") is None:
        raise ServiceError(
            f"{why}. Install it first, e.g. `sudo apt-get install -y {' '.join(packages)}`."
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if not _apt_updated:
        log.info("apt-get update (to install %s) ...", " ".join(packages))
        _run(["apt-get", "update"], timeout=600, env=env)
        _apt_updated = True
    log.info("apt-get install -y %s ...", " ".join(packages))
    started = time.monotonic()
    _run(["apt-get", "install", "-y", "--no-install-recommends", *packages], timeout=1200, env=env)
    log.info("installed %s in %.1fs", " ".join(packages), time.monotonic() - started)


def _service_user(create: bool) -> str:
    """The user PostgreSQL runs as: ``eos`` (created if needed) when root, else ourselves."""
    if not _is_root():
        return pwd.getpwuid(os.getuid()).pw_name
    name = os.environ.get("EOS_SERVICE_USER", "").strip() or "eos"
    if name == "root":
        raise ServiceError("EOS_SERVICE_USER must not be root: PostgreSQL refuses to run as root")
    try:
        pwd.getpwnam(name)
        return name
    except KeyError:
        if not create:
            raise ServiceError(
                f"system user {name!r} does not exist yet; run `scripts/services start`"
            ) from None
    if shutil.which("useradd") is None:
        raise ServiceError(
            f"cannot create system user {name!r}: useradd is missing (apt-get install passwd)"
        )
    log.info("creating system user %r to run PostgreSQL (it refuses to run as root)", name)
    _run(
        [
            "useradd",
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            name,
        ],
        timeout=60,
    )
    return name


def _as_user(user: str, argv: Sequence[str]) -> list[str]:
    if not _is_root():
        return list(argv)
    if shutil.which("runuser"):
        return ["runuser", "-u", user, "--", *argv]
    return ["su", user, "-s", "/bin/sh", "-c", shlex.join(argv)]


def _chown(path: Path, user: str) -> None:
    if _is_root():
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)


def _write_owned(path: Path, text: str, user: str, mode: int = 0o644) -> None:
    path.write_text(text)
    path.chmod(mode)
    _chown(path, user)


# ----------------------------------------------------------------------- PostgreSQL


def _pg_bindir(install: bool) -> Path:
    raw = os.environ.get("EOS_PG_BINDIR", "").strip()
    if raw:
        bindir = Path(raw)
        if not (bindir / "pg_ctl").exists():
            raise ServiceError(f"EOS_PG_BINDIR={raw}: no pg_ctl there")
        return bindir

    def find() -> Path | None:
        found: list[tuple[int, Path]] = []
        for pg_ctl in Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"):
            major = pg_ctl.parent.parent.name
            if major.isdigit() and (pg_ctl.parent / "initdb").exists():
                found.append((int(major), pg_ctl.parent))
        if found:
            return max(found)[1]
        on_path = shutil.which("pg_ctl")
        if on_path and shutil.which("initdb"):
            return Path(on_path).resolve().parent
        return None

    found = find()
    if found is None and install:
        _apt_install(["postgresql"], "PostgreSQL server binaries (initdb, pg_ctl) were not found")
        found = find()
    if found is None:
        raise ServiceError(
            "PostgreSQL server binaries (initdb, pg_ctl) were not found; "
            "install them (`apt-get install -y postgresql`) or set EOS_PG_BINDIR"
        )
    return found


def _pg_initialised(root: Path) -> bool:
    return (root / "data" / "PG_VERSION").exists()


def _pg_root_existing() -> Path | None:
    for root in (state_dir() / "postgres", _fallback_pg_root()):
        if _pg_initialised(root):
            return root
    return None


def _pg_root_for_start(user: str) -> Path:
    existing = _pg_root_existing()
    if existing is not None:
        return existing
    primary = state_dir() / "postgres"
    primary.mkdir(parents=True, exist_ok=True)
    _chown(primary, user)
    if not _is_root():
        return primary
    probe = _run(
        _as_user(user, ["test", "-w", str(primary), "-a", "-x", str(primary)]),
        timeout=30,
        check=False,
    )
    if probe.returncode == 0:
        return primary
    fallback = _fallback_pg_root()
    log.warning(
        "user %r cannot reach %s (a parent directory is not searchable); "
        "keeping the PostgreSQL cluster in %s instead",
        user,
        primary,
        fallback,
    )
    fallback.parent.mkdir(parents=True, exist_ok=True)
    fallback.parent.chmod(0o755)
    fallback.mkdir(exist_ok=True)
    _chown(fallback, user)
    return fallback


def _pg_socket_dir(root: Path, user: str) -> Path:
    """``<root>/run`` unless the socket path would exceed the 107-byte unix limit."""
    candidate = root / "run"
    if len(str(candidate / ".s.PGSQL.65535.lock")) > 100:
        digest = hashlib.sha1(str(root).encode(), usedforsecurity=False).hexdigest()[:10]
        candidate = Path(tempfile.gettempdir()) / f"eos-pg-{os.getuid()}-{digest}"
    candidate.mkdir(parents=True, exist_ok=True)
    candidate.chmod(0o755)
    _chown(candidate, user)
    return candidate


def _pg_ctl(
    bindir: Path, user: str, root: Path, *args: str, timeout: float, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return _run(
        _as_user(user, [str(bindir / "pg_ctl"), "-D", str(root / "data"), *args]),
        timeout=timeout,
        check=check,
    )


def _pg_running(bindir: Path, user: str, root: Path) -> bool:
    if not _pg_initialised(root):
        return False
    return _pg_ctl(bindir, user, root, "status", timeout=30, check=False).returncode == 0


def _pg_initdb(bindir: Path, user: str, root: Path) -> None:
    data = root / "data"
    if data.exists():  # left over from an interrupted initdb
        shutil.rmtree(data)
    log_dir = root / "log"
    log_dir.mkdir(exist_ok=True)
    _chown(log_dir, user)
    pwfile = root / ".initdb-password"
    _write_owned(pwfile, PG_PASSWORD + "\n", user, 0o600)
    log.info("initdb %s (superuser %r, UTF8, locale C)", data, PG_ROLE)
    started = time.monotonic()
    try:
        _run(
            _as_user(
                user,
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    PG_ROLE,
                    f"--pwfile={pwfile}",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "--no-instructions",
                ],
            ),
            timeout=300,
        )
    finally:
        pwfile.unlink(missing_ok=True)
    conf = data / "postgresql.conf"
    with open(conf, "a") as handle:
        handle.write(
            "\n# Settings of connectors' integration services (rewritten on every start)\n"
        )
        handle.write("include_if_exists = 'eos_services.conf'\n")
    log.info("initdb done in %.1fs", time.monotonic() - started)


def _pg_write_conf(
    root: Path, user: str, port: int, socket_dir: Path, lc_messages: str | None
) -> None:
    messages = [f"lc_messages = '{lc_messages}'"] if lc_messages else []
    text = "\n".join(
        [
            "# Written by integration/services/ on every start; do not edit.",
            f"listen_addresses = '{HOST}'",
            f"port = {port}",
            f"unix_socket_directories = '{socket_dir}'",
            f"max_connections = {PG_MAX_CONNECTIONS}",
            f"max_prepared_transactions = {PG_MAX_PREPARED_TRANSACTIONS}",
            "shared_buffers = 128MB",
            "fsync = on",
            "timezone = 'UTC'",
            "log_timezone = 'UTC'",
            "log_line_prefix = '%m [%p] %q%u@%d '",
            *_secured.pg_conf_lines(),
            *messages,
            "",
        ]
    )
    _write_owned(root / "data" / "eos_services.conf", text, user, 0o600)
    _pg_write_tls(root, user)


def _pg_write_tls(root: Path, user: str) -> None:
    """The TLS files in the data directory (owned by the server's user) and pg_hba.conf."""
    data = root / "data"
    for source, target, mode in _secured.pg_install_files(tls_files(), data):
        _write_owned(target, source.read_text(), user, mode)
    _write_owned(data / "pg_hba.conf", _secured.pg_hba(), user, 0o600)


def _psql(bindir: Path, port: int, dbname: str, sql: str) -> str:
    env = {**os.environ, "PGPASSWORD": PG_PASSWORD, "PGCONNECT_TIMEOUT": "10"}
    proc = _run(
        [
            str(bindir / "psql"),
            "-X",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            HOST,
            "-p",
            str(port),
            "-U",
            PG_ROLE,
            "-d",
            dbname,
            "-c",
            sql,
        ],
        timeout=60,
        env=env,
    )
    return proc.stdout.strip()


def _pg_finish_setup(bindir: Path, port: int) -> None:
    """Create the database if needed and verify password login and settings over TCP."""
    exists = _psql(
        bindir, port, "postgres", f"SELECT 1 FROM pg_database WHERE datname = '{PG_DATABASE}'"
    )
    if exists != "1":
        _psql(bindir, port, "postgres", f"CREATE DATABASE {PG_DATABASE}")
    value = _psql(bindir, port, PG_DATABASE, "SHOW max_prepared_transactions")
    if int(value) < PG_MAX_PREPARED_TRANSACTIONS:
        raise ServiceError(
            f"max_prepared_transactions is {value}, expected >= {PG_MAX_PREPARED_TRANSACTIONS}"
        )
    for statement in _secured.pg_setup_sql(PG_DATABASE):
        _psql(bindir, port, PG_DATABASE, statement)
    if _psql(bindir, port, PG_DATABASE, "SHOW ssl") != "on":
        raise ServiceError("ssl is not on after the configuration was reloaded")


def _german_locale(bindir: Path) -> str | None:
    """Make :data:`PG_LC_MESSAGES` usable by the server: None when it is, else why not.

    The locale is generated as a directory (``localedef --no-archive``), which a running
    postmaster finds too; one added to ``locale-archive`` after the postmaster had looked
    there stays invisible to it until a restart.
    """
    major = bindir.parent.name
    catalog = Path("/usr/share/locale/de/LC_MESSAGES") / f"postgres-{major}.mo"
    if not catalog.exists():
        return f"PostgreSQL's German translation {catalog} is missing"
    directory = Path("/usr/lib/locale/de_DE.utf8")
    if (directory / "LC_MESSAGES").exists():
        return None
    if not _is_root():
        return (f"the {PG_LC_MESSAGES} locale is not in {directory.parent} and generating it "
                "needs root (`localedef --no-archive -i de_DE -f UTF-8 de_DE.UTF-8`)")
    if not Path("/usr/share/i18n/locales/de_DE").exists():
        try:
            _apt_install(["locales"], "the de_DE locale source is missing")
        except ServiceError as exc:
            return f"cannot install the `locales` package: {exc}"
    localedef = shutil.which("localedef")
    if localedef is None:
        return "localedef is not installed (Debian package `libc-bin`)"
    log.info("generating the %s locale (localedef --no-archive)", PG_LC_MESSAGES)
    try:  # exit code 1 is localedef's "warnings"; the directory tells
        proc = _run([localedef, "--no-archive", "-i", "de_DE", "-f", "UTF-8", PG_LC_MESSAGES],
                    timeout=300, check=False)
    except ServiceError as exc:
        return f"localedef failed: {exc}"
    if not (directory / "LC_MESSAGES").exists():
        return f"localedef did not create {directory}: {proc.stdout.strip()[-500:]}"
    return None


def _pg_set_messages(bindir: Path, port: int, unavailable: str | None) -> str | None:
    """Have the running server answer in German (``ALTER SYSTEM`` + reload: no restart);
    None on success, else the reason it answers in its default language."""
    if unavailable is not None:
        return unavailable
    if _psql(bindir, port, PG_DATABASE, "SHOW lc_messages") != PG_LC_MESSAGES:
        try:
            _psql(bindir, port, PG_DATABASE, f"ALTER SYSTEM SET lc_messages = '{PG_LC_MESSAGES}'")
            _psql(bindir, port, PG_DATABASE, "SELECT pg_reload_conf()")
        except ServiceError as exc:
            return f"the server refused lc_messages = '{PG_LC_MESSAGES}': {exc}"
        deadline = time.monotonic() + 10
        while _psql(bindir, port, PG_DATABASE, "SHOW lc_messages") != PG_LC_MESSAGES:
            if time.monotonic() > deadline:
                return f"lc_messages is still not {PG_LC_MESSAGES} 10 s after pg_reload_conf()"
            time.sleep(0.2)
    return None


def postgres_messages() -> tuple[str | None, str | None]:
    """``(lc_messages, fallback reason)`` the last ``start_postgres`` recorded: the German
    locale and None, or None and why the server answers in its default language."""
    section = _load_state().get("postgres", {})
    return section.get("lc_messages"), section.get("lc_messages_fallback")


def start_postgres() -> PostgresInfo:
    """Start (or re-verify) the private PostgreSQL cluster; returns its connection info."""
    with _locked():
        bindir = _pg_bindir(install=True)
        user = _service_user(create=True)
        root = _pg_root_for_start(user)
        state = _load_state()
        section = _section(state, "postgres")
        running = _pg_running(bindir, user, root)
        if running and not isinstance(section.get("port"), int):
            section["port"] = _configured_port(
                root / "data" / "eos_services.conf", r"^port = (\d+)"
            )
        port = _stable_port(section, "port", running, set())
        info = PostgresInfo(HOST, port)
        logfile = root / "log" / "postgres.log"
        started = time.monotonic()
        unavailable = _german_locale(bindir)
        if running:
            log.info("PostgreSQL already running (%s); verifying", root / "data")
            if "ssl = on" not in (root / "data" / "eos_services.conf").read_text():
                # Started before TLS was configured: ssl and pg_hba.conf take a reload.
                _pg_write_conf(root, user, port, _pg_socket_dir(root, user),
                               PG_LC_MESSAGES if unavailable is None else None)
                _psql(bindir, port, PG_DATABASE, "SELECT pg_reload_conf()")
                time.sleep(1.0)
        else:
            if not _pg_initialised(root):
                _pg_initdb(bindir, user, root)
            socket_dir = _pg_socket_dir(root, user)
            _pg_write_conf(root, user, port, socket_dir,
                           PG_LC_MESSAGES if unavailable is None else None)
            section["root"] = str(root)
            _save_state(state)
            timeout = service_timeout()
            log.info(
                "starting PostgreSQL (%s, user %r, port %d, up to %.0fs)",
                bindir.parent.name,
                user,
                port,
                timeout,
            )
            try:
                _pg_ctl(
                    bindir,
                    user,
                    root,
                    "start",
                    "-w",
                    "-t",
                    str(int(timeout)),
                    "-l",
                    str(logfile),
                    timeout=timeout + 30,
                )
            except ServiceError as exc:
                raise ServiceError(
                    f"PostgreSQL did not start: {exc}\n{_log_excerpt(logfile)}"
                ) from exc
        try:
            _pg_finish_setup(bindir, port)
        except (ServiceError, ValueError) as exc:
            raise ServiceError(f"PostgreSQL is not usable: {exc}\n{_log_excerpt(logfile)}") from exc
        fallback = _pg_set_messages(bindir, port, unavailable)
        if fallback is None:
            section["lc_messages"], section["lc_messages_fallback"] = PG_LC_MESSAGES, None
        else:
            section["lc_messages"], section["lc_messages_fallback"] = None, fallback
            log.warning("PostgreSQL answers in its default language, not %s: %s (the error "
                        "tests then prove SQLSTATE-only)", PG_LC_MESSAGES, fallback)
        _save_state(state)
        log.info("PostgreSQL ready in %.1fs: %s", time.monotonic() - started, info.redacted)
        _refresh_env_file()
        return info


def stop_postgres(mode: PgStopMode = "fast") -> bool:
    """Stop the cluster (``pg_ctl stop -m mode``); False if it was not running."""
    if mode not in ("smart", "fast", "immediate"):
        raise ValueError(f"mode must be smart, fast or immediate, not {mode!r}")
    with _locked():
        root = _pg_root_existing()
        if root is None:
            return False
        bindir = _pg_bindir(install=False)
        user = _service_user(create=False)
        if not _pg_running(bindir, user, root):
            return False
        log.info("stopping PostgreSQL (-m %s)", mode)
        _pg_ctl(bindir, user, root, "stop", "-m", mode, "-w", "-t", "60", timeout=90)
        _refresh_env_file()
        return True


def restart_postgres(mode: PgStopMode = "fast", downtime: float = 0.0) -> PostgresInfo:
    """Stop (``mode="immediate"`` simulates a crash), stay down ``downtime`` s, start again.

    The port, data and prepared transactions are kept.
    """
    with _locked():
        stop_postgres(mode)
        if downtime > 0:
            time.sleep(downtime)
        return start_postgres()


def _postgres_status() -> tuple[PostgresInfo | None, Path | None]:
    root = _pg_root_existing()
    if root is None:
        return None, None
    port = _load_state().get("postgres", {}).get("port")
    try:
        bindir = _pg_bindir(install=False)
        user = _service_user(create=False)
    except ServiceError:
        return None, root
    if isinstance(port, int) and _pg_running(bindir, user, root):
        return PostgresInfo(HOST, port), root
    return None, root


# ---------------------------------------------------------------------------- Kafka

_children: dict[int, subprocess.Popen[bytes]] = {}


def _java() -> str:
    def find() -> str | None:
        home = os.environ.get("JAVA_HOME", "").strip()
        if home and (Path(home) / "bin" / "java").exists():
            return str(Path(home) / "bin" / "java")
        return shutil.which("java")

    java = find()
    if java is None:
        _apt_install(
            ["openjdk-17-jre-headless"], "Java (17 or newer) is needed for Kafka and was not found"
        )
        java = find()
    if java is None:
        raise ServiceError(
            "Java 17+ not found: install a JRE (apt-get install -y openjdk-17-jre-headless)"
            " or set JAVA_HOME"
        )
    out = _run([java, "-version"], timeout=60).stdout
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):
        major = int(match.group(2))
    if major < 17:
        raise ServiceError(
            f"Kafka 4 needs Java 17 or newer; {java} is {out.splitlines()[0] if out else '?'}"
        )
    return java


def _mvn() -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        _apt_install(["maven"], "Maven is needed once to fetch the Kafka jars and was not found")
        mvn = shutil.which("mvn")
    if mvn is None:
        raise ServiceError("Maven (mvn) not found; install it (apt-get install -y maven)")
    return mvn


def _kafka_pom(version: str) -> str:
    deps = [
        ("org.apache.kafka", "kafka_2.13", version),
        ("org.slf4j", "slf4j-api", SLF4J_VERSION),
        ("org.apache.logging.log4j", "log4j-api", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-slf4j2-impl", LOG4J_VERSION),
    ]
    body = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in deps
    )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
        "  <modelVersion>4.0.0</modelVersion>\n"
        "  <groupId>connectors.integration</groupId>\n"
        f"  <artifactId>kafka-broker-{version}</artifactId>\n"
        "  <version>1</version>\n"
        "  <packaging>pom</packaging>\n"
        f"  <dependencies>\n{body}\n  </dependencies>\n"
        "</project>\n"
    )


def kafka_libs(version: str | None = None) -> Path:
    """The broker's classpath directory, fetched with Maven on first use."""
    version = version or kafka_version()
    home = cache_dir() / f"kafka-{version}"
    libs = home / "libs"
    marker = home / "libs.complete"

    def ready() -> bool:
        return marker.exists() and any(libs.glob(f"kafka_2.13-{version}.jar"))

    if ready():
        return libs
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        if ready():
            return libs
        mvn = _mvn()
        (home / "pom.xml").write_text(_kafka_pom(version))
        staging = home / "libs.partial"
        shutil.rmtree(staging, ignore_errors=True)
        mvn_log = home / "maven.log"
        argv = [
            mvn,
            "-B",
            "-ntp",
            "-f",
            str(home / "pom.xml"),
            f"-Dmaven.repo.local={cache_dir() / 'maven-repo'}",
            f"{DEPENDENCY_PLUGIN}:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={staging}",
        ]
        log.info("fetching Kafka %s jars with Maven into %s (one-time) ...", version, libs)
        started = time.monotonic()
        proc = _run(argv, timeout=900, check=False)
        mvn_log.write_text(proc.stdout)
        if proc.returncode != 0:
            missing = re.findall(r"Could not (?:find|resolve) artifact ([^\s]+)", proc.stdout)
            hint = (
                f" (missing on the repository: {', '.join(sorted(set(missing)))})"
                if missing
                else ""
            )
            raise ServiceError(
                f"Maven could not fetch Kafka {version}{hint}. Check the network to Maven Central, "
                "or pick another release with EOS_KAFKA_VERSION "
                f"(default {DEFAULT_KAFKA_VERSION}).\n"
                f"{_log_excerpt(mvn_log, 30)}"
            )
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
        marker.write_text(f"{time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
        count = len(list(libs.glob("*.jar")))
        log.info("fetched %d jars in %.1fs", count, time.monotonic() - started)
        return libs


def _kafka_server_properties(kdir: Path, port: int, controller_port: int,
                             sasl_port: int) -> str:
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(kdir / "data"),
        "num.partitions": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "transaction.max.timeout.ms": "900000",
        "group.initial.rebalance.delay.ms": "0",
        # Topics with a size limit (the benchmarks' output topics) are trimmed every 10 s,
        # not every 5 minutes: one benchmark run writes tens of GB at 1 KB per record.
        "log.retention.check.interval.ms": "10000",
        # Tests create their topics explicitly (AdminClient); typos fail loudly.
        "auto.create.topics.enable": "false",
    }
    for key, value in _secured.kafka_properties(tls_files(), sasl_port, HOST).items():
        if key.endswith("+"):
            settings[key[:-1]] += f",{value}"
        else:
            settings[key] = value
    lines = ["# Written by integration/services/ on every start; do not edit."]
    lines += [f"{key}={value}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


_LOG4J2 = """\
# Kafka broker logging (log4j2): INFO to a size-capped file, nothing to the console.
status = warn
name = eos-kafka
appender.file.type = RollingFile
appender.file.name = FILE
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.filePattern = ${sys:kafka.logs.dir}/server.log.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 20MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = WARN
"""


def _proc_alive(pid: int) -> bool:
    """Alive and not a zombie (reaps our own exited children)."""
    child = _children.get(pid)
    if child is not None and child.poll() is not None:
        _children.pop(pid, None)
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    if state in ("Z", "X"):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True


def _kafka_pid() -> int | None:
    kdir = _kafka_dir()
    try:
        pid = int((kdir / "kafka.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    if b"kafka.Kafka" not in cmdline or str(kdir / "config").encode() not in cmdline:
        return None  # pid reused by something else
    return pid if _proc_alive(pid) else None


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        buf += chunk
    return bytes(buf)


def _kafka_call(
    sock: socket.socket, api_key: int, api_version: int, corr: int, body: bytes
) -> bytes:
    client_id = b"eos-services"
    header = struct.pack(">hhih", api_key, api_version, corr, len(client_id)) + client_id
    message = header + body
    sock.sendall(struct.pack(">i", len(message)) + message)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    response = _recv_exact(sock, size)
    (got,) = struct.unpack_from(">i", response, 0)
    if got != corr:
        raise ConnectionError(f"correlation id {got} != {corr}")
    return response[4:]


def kafka_metadata_ok(host: str, port: int, timeout: float = 3.0) -> bool:
    """True when the broker answers ApiVersions and a Metadata request listing itself.

    Raw Kafka protocol (no client library): a broker that only accepts TCP
    connections, or that is not yet registered/unfenced, gives False.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            body = _kafka_call(sock, 18, 0, 1, b"")  # ApiVersions v0
            (error,) = struct.unpack_from(">h", body, 0)
            if error != 0:
                return False
            (count,) = struct.unpack_from(">i", body, 2)
            versions: dict[int, tuple[int, int]] = {}
            for index in range(count):
                key, low, high = struct.unpack_from(">hhh", body, 6 + 6 * index)
                versions[key] = (low, high)
            if 3 not in versions:
                return False
            low, high = versions[3]
            version = max(low, 4)
            if version > min(high, 8):
                return True  # only flexible Metadata versions left: ApiVersions must do
            request = struct.pack(">ib", 0, 0)  # topics: [] (brokers only), no auto-create
            if version >= 8:
                request += struct.pack(">bb", 0, 0)
            body = _kafka_call(sock, 3, version, 2, request)
            (brokers,) = struct.unpack_from(">i", body, 4)  # after throttle_time_ms
            offset = 8
            ports = []
            for _ in range(brokers):
                _node, host_len = struct.unpack_from(">ih", body, offset)
                offset += 6 + host_len
                (broker_port,) = struct.unpack_from(">i", body, offset)
                ports.append(broker_port)
                offset += 4
                (rack_len,) = struct.unpack_from(">h", body, offset)
                offset += 2 + max(rack_len, 0)
            return len(ports) > 0
    except (OSError, ConnectionError, struct.error):
        return False


def _meta_cluster_id(data_dir: Path) -> str | None:
    """The cluster id of already formatted storage (so a lost state.json is harmless)."""
    with contextlib.suppress(OSError):
        for line in (data_dir / "meta.properties").read_text().splitlines():
            if line.startswith("cluster.id="):
                return line.split("=", 1)[1].strip()
    return None


#: A KRaft cluster id as ``kafka-storage random-uuid`` prints it: 16 random bytes in
#: URL-safe base64 without padding (22 characters), never beginning with ``-``.
_CLUSTER_ID: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{21}")


def _new_cluster_id() -> str:
    """A new KRaft cluster id that no command line can take for an option.

    One random UUID in 64 encodes to a string beginning with ``-``, which
    ``kafka-storage format --cluster-id <id>`` (argparse4j) reads as an option; Kafka's own
    ``Uuid.randomUuid()`` draws again in that case, and so does this.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if _CLUSTER_ID.fullmatch(cluster_id):
            return cluster_id


def _cluster_id_for_start(section: dict[str, Any], data_dir: Path) -> str:
    """The cluster id to format the storage with: the kept one (``state.json``, else the
    formatted storage's), or a new one kept in ``section``.

    A kept id beginning with ``-`` (made before ids were drawn again, it failed the format
    and so every later start of that checkout) is replaced while the storage is not yet
    formatted; formatted storage keeps its own id (the format reads no id then).
    """
    cluster_id = section.get("cluster_id") or _meta_cluster_id(data_dir)
    if isinstance(cluster_id, str) and _CLUSTER_ID.fullmatch(cluster_id):
        return cluster_id
    if isinstance(cluster_id, str) and (data_dir / "meta.properties").exists():
        return cluster_id
    if cluster_id:
        log.warning("replacing the kept Kafka cluster id %r (not a valid id to format with)",
                    cluster_id)
    cluster_id = _new_cluster_id()
    section["cluster_id"] = cluster_id
    return cluster_id


def _configured_port(path: Path, pattern: str) -> int | None:
    with contextlib.suppress(OSError):
        match = re.search(pattern, path.read_text(), re.MULTILINE)
        if match:
            return int(match.group(1))
    return None


def start_kafka() -> KafkaInfo:
    """Start (or re-verify) the single-node KRaft broker; returns its bootstrap address."""
    with _locked():
        version = kafka_version()
        kdir = _kafka_dir()
        state = _load_state()
        section = _section(state, "kafka")
        pid = _kafka_pid()
        timeout = service_timeout()
        started = time.monotonic()
        properties = kdir / "config" / "server.properties"
        if pid is not None and properties.exists() and "SASL_SSL://" not in properties.read_text():
            log.info("Kafka runs without the SASL_SSL listener (started by an older "
                     "scripts/services): restarting it")
            stop_kafka()
            pid = None
        if pid is not None:
            port = section.get("port") or _configured_port(
                kdir / "config" / "server.properties",
                r"^advertised\.listeners=PLAINTEXT://[^:]+:(\d+)",
            )
            if not isinstance(port, int):
                raise ServiceError(
                    f"Kafka runs (pid {pid}) but its port is unknown; run `scripts/services stop`"
                )
            running_version = str(section.get("version", version))
            log.info("Kafka already running (pid %d, port %d); verifying", pid, port)
            info = KafkaInfo(HOST, port, running_version, section.get("sasl_port"))
            server_log = kdir / "logs" / "server.log"
            try:
                _wait(
                    "Kafka",
                    lambda: kafka_metadata_ok(HOST, port),
                    timeout=timeout,
                    alive=lambda: _proc_alive(pid),
                )
            except ServiceError as exc:
                raise ServiceError(f"{exc}\n{_log_excerpt(server_log)}") from exc
            _kafka_secure_setup(info, server_log)
            log.info("Kafka ready in %.1fs: %s", time.monotonic() - started, info.bootstrap)
            _refresh_env_file()
            return info

        java = _java()
        libs = kafka_libs(version)
        config_dir = kdir / "config"
        logs_dir = kdir / "logs"
        data_dir = kdir / "data"
        for directory in (config_dir, logs_dir, data_dir):
            directory.mkdir(parents=True, exist_ok=True)
        port = _stable_port(section, "port", False, set())
        controller_port = _stable_port(section, "controller_port", False, {port})
        sasl_port = _stable_port(section, "sasl_port", False, {port, controller_port})
        cluster_id = _cluster_id_for_start(section, data_dir)
        section["version"] = version
        _save_state(state)

        properties = config_dir / "server.properties"
        properties.write_text(_kafka_server_properties(kdir, port, controller_port, sasl_port))
        log4j = config_dir / "log4j2.properties"
        log4j.write_text(_LOG4J2)
        heap = os.environ.get("EOS_KAFKA_HEAP_OPTS", "-Xms256m -Xmx512m").split()
        jvm = [
            java,
            *heap,
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dkafka.logs.dir={logs_dir}",
            f"-Dlog4j2.configurationFile={log4j}",
            "-cp",
            f"{libs}/*",
        ]
        server_log = logs_dir / "server.log"
        if not (data_dir / "meta.properties").exists():
            log.info("formatting Kafka storage (cluster id %s)", cluster_id)
            format_log = logs_dir / "storage-format.log"
            proc = _run(
                [
                    *jvm,
                    "kafka.tools.StorageTool",
                    "format",
                    f"--cluster-id={cluster_id}",  # one argument, whatever the id looks like
                    "--config",
                    str(properties),
                    *_secured.kafka_format_args(),
                ],
                timeout=180,
                check=False,
            )
            format_log.write_text(proc.stdout)
            if proc.returncode != 0:
                raise ServiceError(
                    f"Kafka storage format failed (exit {proc.returncode}).\n"
                    f"{_log_excerpt(format_log)}"
                )

        out_file = logs_dir / "kafka.out"
        log.info(
            "starting Kafka %s (ports %d/%d, up to %.0fs)", version, port, controller_port, timeout
        )
        with open(out_file, "ab") as out:
            child = subprocess.Popen(
                [*jvm, "kafka.Kafka", str(properties)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=kdir,
                start_new_session=True,
            )
        _children[child.pid] = child
        (kdir / "kafka.pid").write_text(f"{child.pid}\n")
        info = KafkaInfo(HOST, port, version, sasl_port)
        try:
            waited = _wait(
                "Kafka",
                lambda: kafka_metadata_ok(HOST, port),
                timeout=timeout,
                alive=lambda: _proc_alive(child.pid),
            )
        except ServiceError as exc:
            _terminate(child.pid, 20.0)
            raise ServiceError(
                f"{exc}\n{_log_excerpt(server_log)}\n{_log_excerpt(out_file, 20)}"
            ) from exc
        _kafka_secure_setup(info, server_log)
        log.info(
            "Kafka ready in %.1fs (broker start %.1fs): %s",
            time.monotonic() - started,
            waited,
            info.bootstrap,
        )
        _refresh_env_file()
        return info


def _kafka_secure_setup(info: KafkaInfo, server_log: Path) -> None:
    """The SCRAM users and their ACLs (:mod:`integration.services.secured`), idempotently."""
    try:
        _secured.kafka_secure_setup(info.bootstrap)
    except ImportError as exc:
        raise ServiceError(f"the Kafka ACLs need confluent-kafka (pip install -e .[dev]): "
                           f"{exc}") from exc
    except Exception as exc:
        raise ServiceError(f"creating Kafka's SCRAM users and ACLs failed: {exc}\n"
                           f"{_log_excerpt(server_log)}") from exc


def _terminate(pid: int, timeout: float, kill: bool = False, name: str = "Kafka") -> None:
    """SIGTERM (or SIGKILL) one process, escalating to SIGKILL after ``timeout`` s."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _proc_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _proc_alive(pid):
        log.warning("%s (pid %d) still alive after %.0fs; sending SIGKILL", name, pid, timeout)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while _proc_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
    child = _children.pop(pid, None)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=1)


def stop_kafka(kill: bool = False, timeout: float = 60.0) -> bool:
    """Stop the broker (SIGTERM, SIGKILL after ``timeout``; ``kill=True`` = crash now)."""
    with _locked():
        pid = _kafka_pid()
        if pid is None:
            (_kafka_dir() / "kafka.pid").unlink(missing_ok=True)
            return False
        log.info("stopping Kafka (pid %d, %s)", pid, "SIGKILL" if kill else "SIGTERM")
        started = time.monotonic()
        _terminate(pid, timeout, kill=kill)
        (_kafka_dir() / "kafka.pid").unlink(missing_ok=True)
        log.info("Kafka stopped in %.1fs", time.monotonic() - started)
        _refresh_env_file()
        return True


def restart_kafka(kill: bool = False, downtime: float = 0.0) -> KafkaInfo:
    """Stop the broker (``kill=True`` simulates a crash), wait ``downtime`` s, start it again.

    The ports, cluster id and data are kept.
    """
    with _locked():
        stop_kafka(kill=kill)
        if downtime > 0:
            time.sleep(downtime)
        return start_kafka()


def _kafka_status() -> tuple[KafkaInfo | None, int | None]:
    pid = _kafka_pid()
    section = _load_state().get("kafka", {})
    if pid is None or not isinstance(section.get("port"), int):
        return None, pid
    sasl_port = section.get("sasl_port")
    return KafkaInfo(HOST, int(section["port"]), str(section.get("version", "?")),
                     sasl_port if isinstance(sasl_port, int) else None), pid

# ------------------------------------------------------------------------------- S3


def s3_answers(host: str, port: int, timeout: float = 3.0) -> bool:
    """True when an S3 API answers ``GET /`` (ListBuckets) at ``http://host:port``.

    Plain HTTP, no signature: moto lists its buckets; a server that wants signed requests
    answers with an S3 ``<Error>`` document, which counts as answering too.
    """
    url = f"http://{host}:{port}/"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy
    try:
        with opener.open(url, timeout=timeout) as response:
            body = response.read(64 * 1024)
    except urllib.error.HTTPError as exc:
        body = exc.read(64 * 1024)
    except (OSError, ValueError):
        return False
    return b"<ListAllMyBucketsResult" in body or b"<Error>" in body


def _s3_pid() -> int | None:
    """The pid of this state directory's moto server (its working directory), else None."""
    sdir = _s3_dir()
    try:
        pid = int((sdir / "s3.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None
    if b"moto.server" not in cmdline or Path(cwd) != sdir:
        return None  # pid reused by something else
    return pid if _proc_alive(pid) else None


def _s3_bucket(info: S3Info) -> bool:
    """Create the test bucket unless it exists (boto3); True when it was created."""
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError as exc:
        raise ServiceError(
            f"boto3 is missing ({exc}); it comes with moto: run scripts/bootstrap, or "
            "`pip install 'moto[server]'` into the interpreter that runs scripts/services"
        ) from exc
    client = boto3.client(
        "s3",
        endpoint_url=info.endpoint,
        region_name=info.region,
        aws_access_key_id=info.access_key,
        aws_secret_access_key=info.secret_key,
        config=Config(retries={"max_attempts": 3}, connect_timeout=5, read_timeout=30),
    )
    try:
        names = {bucket["Name"] for bucket in client.list_buckets().get("Buckets", [])}
        if info.bucket in names:
            return False
        try:
            client.create_bucket(Bucket=info.bucket)
        except ClientError as exc:  # created meanwhile by another client
            if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
                raise
            return False
    except (BotoCoreError, ClientError) as exc:
        raise ServiceError(f"cannot create the S3 bucket {info.bucket!r}: {exc}") from exc
    return True


def _rotate(path: Path, limit: int) -> None:
    """Keep ``path`` below ``limit`` bytes across starts: move a larger one to ``.1``."""
    with contextlib.suppress(OSError):
        if path.stat().st_size > limit:
            path.replace(path.with_name(path.name + ".1"))


def start_s3() -> S3Info:
    """Start (or re-verify) moto's S3 server and create the test bucket; returns its address.

    moto keeps everything in memory: after a stop or restart the bucket is created again,
    empty.
    """
    with _locked():
        sdir = _s3_dir()
        state = _load_state()
        section = _section(state, "s3")
        pid = _s3_pid()
        timeout = service_timeout()
        started = time.monotonic()
        logs_dir = sdir / "logs"
        out_file = logs_dir / "moto.log"
        if pid is not None:
            port = section.get("port")
            if not isinstance(port, int):
                raise ServiceError(
                    f"moto runs (pid {pid}) but its port is unknown; run `scripts/services stop`"
                )
            log.info("S3 (moto) already running (pid %d, port %d); verifying", pid, port)
            server_pid, new = pid, False
        else:
            if importlib.util.find_spec("moto") is None:
                raise ServiceError(
                    f"moto is not installed in {sys.executable}; run scripts/bootstrap (the "
                    "[dev] extra), or `pip install 'moto[server]'`"
                )
            logs_dir.mkdir(parents=True, exist_ok=True)
            others = {  # the other services' kept ports, even while they are stopped
                value
                for name in SERVICES
                if name != "s3" and isinstance(state.get(name), dict)
                for key, value in state[name].items()
                if key.endswith("port") and isinstance(value, int)
            }
            port = _stable_port(section, "port", False, others)
            _save_state(state)
            _rotate(out_file, S3_LOG_ROTATE_BYTES)
            log.info("starting S3 (moto, port %d, up to %.0fs)", port, timeout)
            with open(out_file, "ab") as out:
                child = subprocess.Popen(
                    [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=sdir,
                    start_new_session=True,
                )
            _children[child.pid] = child
            (sdir / "s3.pid").write_text(f"{child.pid}\n")
            server_pid, new = child.pid, True
        info = S3Info(HOST, port)
        try:
            _wait(
                "S3 (moto)",
                lambda: s3_answers(HOST, port),
                timeout=timeout,
                alive=lambda: _proc_alive(server_pid),
                interval=0.1,
            )
            created = _s3_bucket(info)
        except ServiceError as exc:
            if new:
                _terminate(server_pid, 10.0, name="moto")
                (sdir / "s3.pid").unlink(missing_ok=True)
            raise ServiceError(f"{exc}\n{_log_excerpt(out_file, 20)}") from exc
        log.info(
            "S3 (moto) ready in %.1fs: %s, bucket %s (%s)",
            time.monotonic() - started,
            info.endpoint,
            info.bucket,
            "created" if created else "kept",
        )
        _refresh_env_file()
        return info


def stop_s3(kill: bool = False, timeout: float = 30.0) -> bool:
    """Stop moto (SIGTERM, SIGKILL after ``timeout``); its objects and buckets are lost."""
    with _locked():
        pid = _s3_pid()
        if pid is None:
            (_s3_dir() / "s3.pid").unlink(missing_ok=True)
            return False
        log.info("stopping S3 (moto, pid %d, %s)", pid, "SIGKILL" if kill else "SIGTERM")
        started = time.monotonic()
        _terminate(pid, timeout, kill=kill, name="moto")
        (_s3_dir() / "s3.pid").unlink(missing_ok=True)
        log.info("S3 (moto) stopped in %.1fs", time.monotonic() - started)
        _refresh_env_file()
        return True


def restart_s3(kill: bool = False, downtime: float = 0.0) -> S3Info:
    """Stop moto, wait ``downtime`` s, start it again.

    The port (so the endpoint) and the bucket's name are kept; the objects are not (moto
    keeps them in memory): the bucket comes back empty.
    """
    with _locked():
        stop_s3(kill=kill)
        if downtime > 0:
            time.sleep(downtime)
        return start_s3()


def _s3_status() -> tuple[S3Info | None, int | None]:
    pid = _s3_pid()
    section = _load_state().get("s3", {})
    if pid is None or not isinstance(section.get("port"), int):
        return None, pid
    return S3Info(HOST, int(section["port"])), pid


# ---------------------------------------------------------------------- whole set-up


def status() -> Status:
    postgres, pg_root = _postgres_status()
    kafka, pid = _kafka_status()
    s3, s3_pid = _s3_status()
    return Status(
        postgres=postgres,
        kafka=kafka,
        postgres_dir=pg_root,
        kafka_dir=_kafka_dir(),
        kafka_pid=pid,
        s3=s3,
        s3_dir=_s3_dir(),
        s3_pid=s3_pid,
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
    path = env_file()
    if not lines:
        path.unlink(missing_ok=True)
        return
    header = "# Written by scripts/services; shell-sourceable KEY=VALUE lines.\n"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(header + "\n".join(lines) + "\n")
    tmp.replace(path)


def _selected(only: Sequence[str] | None) -> tuple[ServiceName, ...]:
    if not only:
        return SERVICES
    return tuple(name for name in SERVICES if name in only)


def start(
    only: Sequence[str] | None = None,
) -> tuple[PostgresInfo | None, KafkaInfo | None, S3Info | None]:
    """Start the selected services (default all); idempotent."""
    names = _selected(only)
    postgres = start_postgres() if "postgres" in names else None
    kafka = start_kafka() if "kafka" in names else None
    s3 = start_s3() if "s3" in names else None
    return postgres, kafka, s3


def stop(only: Sequence[str] | None = None) -> None:
    """Stop the selected services (default all)."""
    names = _selected(only)
    if "s3" in names and not stop_s3():
        log.info("S3 (moto) was not running")
    if "kafka" in names and not stop_kafka():
        log.info("Kafka was not running")
    if "postgres" in names and not stop_postgres():
        log.info("PostgreSQL was not running")
    with _locked():
        _refresh_env_file()


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
    path = env_file()
    print(f"env file: {path if path.exists() else '(none)'}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/services",
        description="Real PostgreSQL, Kafka and S3 (moto) for the integration tests, "
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
                help="pg_ctl stop mode",
            )
            cmd.add_argument(
                "--kill",
                action="store_true",
                help="SIGKILL the Kafka broker and moto instead of SIGTERM",
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
            _print_status(status())
        else:
            current = status()
            _print_status(current)
            wanted = _selected(only)
            up = {
                "postgres": current.postgres is not None,
                "kafka": current.kafka is not None,
                "s3": current.s3 is not None,
            }
            return 0 if all(up[name] for name in wanted) else 3
    except ServiceError as exc:
        log.error("error: %s", exc)
        return 1
    except KeyboardInterrupt:
        log.error("interrupted")
        return 130
    return 0

