"""The private MariaDB server's files: binaries, data directory, ``mariadb-install-db``,
the option file, the TLS files, the ``mariadb`` command line and the users.

Administration is over the unix socket only, as the OS user running ``scripts/services``
(``unix_socket`` authentication, no password anywhere): ``mariadb-install-db
--auth-root-socket-user=<that user>`` creates ``root@localhost`` (and, when not root, that
user ``@localhost``) identified via ``unix_socket`` (a password login is impossible: the
stored hash is ``invalid``). ``skip-name-resolve`` keeps ``localhost`` accounts to the
socket: a TCP client from 127.0.0.1 is host ``127.0.0.1``.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import time
from pathlib import Path
from typing import Final

from integration.services.config import (
    HOST,
    MARIADB_DATABASE,
    MARIADB_MAX_CONNECTIONS,
    MARIADB_PASSWORD,
    MARIADB_TLS_PASSWORD,
    MARIADB_TLS_USER,
    MARIADB_USER,
    ServiceError,
    tls_files,
)
from integration.services.dirs import existing_root, root_for_start, socket_dir
from integration.services.process import (
    _apt_install,
    _chown,
    _run,
    _write_owned,
)

log = logging.getLogger("connectors.services")

#: Debian 12's packages: ``mariadbd`` and ``mariadb-install-db``; the ``mariadb`` client.
SERVER_PACKAGE: Final = "mariadb-server-core"
CLIENT_PACKAGE: Final = "mariadb-client-core"

#: What the sink's users hold on ``eos.*``: the rows and the tables (its ledger tables
#: too), nothing for XA. Found by trying on MariaDB 10.11.19 (and pinned by
#: integration/mariadb/test_mariadb_service.py): ``XA RECOVER`` needs no privilege and
#: lists the prepared branches of *every* user (MySQL 8 wants XA_RECOVER_ADMIN for
#: others'); ``XA COMMIT`` / ``XA ROLLBACK`` of a branch a disconnected connection
#: prepared needs none either, not even a privilege on its tables: a ``USAGE``-only user
#: committed and rolled back ``eos``'s branches. So any account may finish any prepared
#: branch: the sink must recognise its own by its xids, never by who can see them.
#: CREATE TEMPORARY TABLES: the upsert's staging table inside each task's branch.
SINK_GRANTS: Final = ("SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, ALTER, INDEX, "
                      "CREATE TEMPORARY TABLES")
#: The databases the docs' tests create for a page each, and drop after
#: (``integration/docs/_mariadb_page.py``): ``eos`` holds the same grants there, its
#: ``CREATE`` and ``DROP`` on the pattern letting it create and drop them (a pattern of
#: ``GRANT``, ``_`` escaped: a literal underscore).
DOCS_DATABASES: Final = "eos\\_docs\\_%"


# --------------------------------------------------------------------------- binaries


def _binaries(install: bool) -> tuple[Path, Path, Path]:
    """``(mariadbd, mariadb-install-db, mariadb)``, the Debian packages installed when
    missing (as root)."""

    def find() -> tuple[Path, Path, Path] | None:
        server = Path("/usr/sbin/mariadbd")
        if not server.exists():
            on_path = shutil.which("mariadbd")
            if on_path is None:
                return None
            server = Path(on_path)
        install_db = shutil.which("mariadb-install-db")
        client = shutil.which("mariadb")
        if install_db is None or client is None:
            return None
        return server, Path(install_db), Path(client)

    found = find()
    if found is None and install:
        _apt_install([SERVER_PACKAGE, CLIENT_PACKAGE],
                     "MariaDB (mariadbd, mariadb-install-db, mariadb) was not found")
        found = find()
    if found is None:
        raise ServiceError(
            "MariaDB (mariadbd, mariadb-install-db, mariadb) was not found; install it: "
            f"`apt-get install -y {SERVER_PACKAGE} {CLIENT_PACKAGE}`"
        )
    return found


def admin_user() -> str:
    """The MariaDB account of the OS user running this code (``unix_socket``)."""
    return pwd.getpwuid(os.getuid()).pw_name


# ------------------------------------------------------------------------- directories


def _initialised(root: Path) -> bool:
    """True once ``mariadb-install-db`` finished there (it writes the marker last)."""
    return (root / "installed").exists() and (root / "data" / "mysql").is_dir()


def _root_existing() -> Path | None:
    return existing_root("mariadb", _initialised)


def _root_for_start(user: str) -> Path:
    """The server's directory, reachable by the service user (as PostgreSQL's)."""
    return root_for_start("mariadb", user, _initialised, "MariaDB's files")


def _socket(root: Path, user: str) -> Path:
    """``<root>/run/mariadb.sock`` unless that passes the 107-byte unix socket limit."""
    return socket_dir(root, user, "mariadb.sock.lock", "mariadb") / "mariadb.sock"


# ------------------------------------------------------------------------ configuration


def _write_options(root: Path, user: str, port: int) -> Path:
    """``<root>/my.cnf`` (rewritten on every start) and the TLS files it names."""
    tls = tls_files()
    tls_dir = root / "tls"
    tls_dir.mkdir(exist_ok=True)
    _chown(tls_dir, user)
    for source, name, mode in ((tls.server_cert, "server.pem", 0o644),
                               (tls.server_key, "server.key", 0o600), (tls.ca, "ca.pem", 0o644)):
        _write_owned(tls_dir / name, source.read_text(), user, mode)
    log_dir = root / "log"
    for directory in (log_dir, root / "run"):
        directory.mkdir(exist_ok=True)
        _chown(directory, user)
    lines = [
        "# Written by integration/services/ on every start; do not edit.",
        "[mariadbd]",
        f"datadir = {root / 'data'}",
        f"socket = {_socket(root, user)}",
        f"pid-file = {root / 'run' / 'mariadbd.pid'}",
        f"log-error = {log_dir / 'mariadb.log'}",
        f"bind-address = {HOST}",
        f"port = {port}",
        "skip-name-resolve",
        # The TLS-only user needs TLS; it is offered on the same port (STARTTLS-like).
        f"ssl-cert = {tls_dir / 'server.pem'}",
        f"ssl-key = {tls_dir / 'server.key'}",
        f"ssl-ca = {tls_dir / 'ca.pem'}",
        "tls-version = TLSv1.2,TLSv1.3",
        "default-storage-engine = InnoDB",
        f"max-connections = {MARIADB_MAX_CONNECTIONS}",
        "local-infile = ON",  # the sink loads with LOAD DATA LOCAL INFILE
        "character-set-server = utf8mb4",
        "collation-server = utf8mb4_general_ci",
        "default-time-zone = '+00:00'",
        # Prepared XA branches: since 10.5.2 (MDEV-742) a prepared branch outlives its
        # connection and a restart. What keeps it across a crash is InnoDB's redo log, made
        # durable at XA PREPARE only with innodb_flush_log_at_trx_commit = 1 (the default,
        # set here so no option file changes it; 2 would survive a SIGKILL of the server but
        # not of the machine). No binary log: without one InnoDB alone keeps the prepared
        # state, and the test restarts (SIGKILL and graceful) find it; with one, XA PREPARE
        # is binlogged too and recovery also consults the binlog (sync_binlog = 1 then).
        "innodb-flush-log-at-trx-commit = 1",
        "skip-log-bin",
        "innodb-buffer-pool-size = 128M",
        "innodb-log-file-size = 48M",
        "performance-schema = OFF",
        "",
    ]
    path = root / "my.cnf"
    _write_owned(path, "\n".join(lines), user, 0o644)
    return path


def _install_db(install_db: Path, options: Path, user: str, root: Path) -> None:
    data = root / "data"
    if data.exists():  # left over from an interrupted install
        shutil.rmtree(data)
    data.mkdir()
    _chown(data, user)
    log.info("mariadb-install-db %s (admin %r over the socket only)", data, admin_user())
    started = time.monotonic()
    _run([str(install_db), f"--defaults-file={options}", f"--user={user}",
          "--auth-root-authentication-method=socket",
          f"--auth-root-socket-user={admin_user()}", "--skip-test-db"], timeout=300)
    (root / "installed").write_text("mariadb-install-db finished\n")
    log.info("mariadb-install-db done in %.1fs", time.monotonic() - started)


# ----------------------------------------------------------------------------- clients


def admin_sql(client: Path, socket: Path, sql: str, *, timeout: float = 60.0,
              check: bool = True) -> str:
    """Run ``sql`` over the socket as the admin; the output (``--batch``, no headers)."""
    proc = _run([str(client), "--no-defaults", f"--socket={socket}", "--protocol=SOCKET",
                 f"--user={admin_user()}", "--batch", "--skip-column-names",
                 "--connect-timeout=5", "-e", sql], timeout=timeout, check=check)
    return proc.stdout.strip()


def answers(client: Path, socket: Path) -> bool:
    """True when the server accepts the admin's ``SELECT 1`` over the socket."""
    try:
        proc = _run([str(client), "--no-defaults", f"--socket={socket}", "--protocol=SOCKET",
                     f"--user={admin_user()}", "--batch", "--skip-column-names",
                     "--connect-timeout=2", "-e", "SELECT 1"], timeout=10, check=False)
    except ServiceError:
        return False
    return proc.returncode == 0 and proc.stdout.strip() == "1"


def setup_sql() -> list[str]:
    """Idempotent SQL (as the admin): the database and the sink's two users."""
    statements = [
        f"CREATE DATABASE IF NOT EXISTS {MARIADB_DATABASE} CHARACTER SET utf8mb4",
        # Anonymous accounts would shadow the named ones over the socket.
        "DROP USER IF EXISTS ''@'localhost'",
    ]
    for user, password, require in ((MARIADB_USER, MARIADB_PASSWORD, "NONE"),
                                    (MARIADB_TLS_USER, MARIADB_TLS_PASSWORD, "SSL")):
        statements += [
            f"CREATE USER IF NOT EXISTS '{user}'@'%' IDENTIFIED BY '{password}'",
            f"ALTER USER '{user}'@'%' IDENTIFIED BY '{password}' REQUIRE {require}",
            f"GRANT {SINK_GRANTS} ON {MARIADB_DATABASE}.* TO '{user}'@'%'",
        ]
    statements.append(f"GRANT {SINK_GRANTS} ON `{DOCS_DATABASES}`.* TO '{MARIADB_USER}'@'%'")
    return statements
