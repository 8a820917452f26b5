"""The private PostgreSQL cluster: binaries, data directory, ``initdb``, configuration, TLS
files and ``psql``."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

from integration.services import secured as _secured
from integration.services.config import (
    HOST,
    PG_DATABASE,
    PG_MAX_CONNECTIONS,
    PG_MAX_PREPARED_TRANSACTIONS,
    PG_PASSWORD,
    PG_ROLE,
    ServiceError,
    tls_files,
)
from integration.services.dirs import existing_root, root_for_start, socket_dir
from integration.services.process import (
    _apt_install,
    _as_user,
    _chown,
    _run,
    _write_owned,
)

log = logging.getLogger("connectors.services")


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
    return existing_root("postgres", _pg_initialised)


def _pg_root_for_start(user: str) -> Path:
    return root_for_start("postgres", user, _pg_initialised, "the PostgreSQL cluster")


def _pg_socket_dir(root: Path, user: str) -> Path:
    """``<root>/run`` unless the socket path would exceed the 107-byte unix limit."""
    return socket_dir(root, user, ".s.PGSQL.65535.lock", "pg")


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
