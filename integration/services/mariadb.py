"""MariaDB: one ``mariadbd`` (Debian 12's 10.11), start, stop, restart and status.

Its files are under ``<state>/mariadb`` (``my.cnf``, ``data``, ``log/mariadb.log``, the
socket in ``run``), owned by the service user, which ``mariadbd --user`` runs as (it
refuses root). Plain and TLS clients share one port on 127.0.0.1, chosen once and kept.
Users and options: :mod:`integration.services.mariadb_cluster`.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

from integration.services.config import (
    HOST,
    SERVICES,
    MariaDBInfo,
    PgStopMode,
    ServiceError,
    service_timeout,
)
from integration.services.mariadb_cluster import (
    _binaries,
    _initialised,
    _install_db,
    _root_existing,
    _root_for_start,
    _socket,
    _write_options,
    admin_sql,
    answers,
    setup_sql,
)
from integration.services.ports import stable_port
from integration.services.process import (
    _children,
    _is_root,
    _load_state,
    _locked,
    _log_excerpt,
    _proc_alive,
    _refresh_env_file,
    _save_state,
    _section,
    _service_user,
    _terminate,
    _wait,
)

log = logging.getLogger("connectors.services")

#: Seconds a graceful stop (SIGTERM) may take before SIGKILL: InnoDB's shutdown flushes
#: the buffer pool (128 MB at most here; a second or two measured).
STOP_TIMEOUT = 60.0


def _pid_file(root: Path) -> Path:
    return root / "run" / "eos-mariadbd.pid"


def _mariadb_pid(root: Path) -> int | None:
    """The pid of this directory's ``mariadbd`` (its option file on the command line)."""
    try:
        pid = int(_pid_file(root).read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    if b"mariadbd" not in cmdline or str(root / "my.cnf").encode() not in cmdline:
        return None  # pid reused by something else
    return pid if _proc_alive(pid) else None


def mariadb_answers(host: str, port: int, user: str, password: str, database: str,
                    timeout: float = 10.0) -> str | None:
    """None when ``user`` can log in over TCP and ``SELECT 1`` works (the ``mariadb``
    command line; the password goes by ``MYSQL_PWD``, never on a command line), else
    the error."""
    client = shutil.which("mariadb")
    if client is None:
        return "the `mariadb` command line is missing (Debian package mariadb-client-core)"
    env = {**os.environ, "MYSQL_PWD": password}
    try:
        proc = subprocess.run(
            [client, "--no-defaults", "--protocol=TCP", f"--host={host}", f"--port={port}",
             f"--user={user}", "--batch", "--skip-column-names", "--connect-timeout=5",
             database, "-e", "SELECT 1"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env,
            timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    if proc.returncode == 0 and proc.stdout.strip() == "1":
        return None
    return (proc.stderr or proc.stdout).strip() or f"exit code {proc.returncode}"


def start_mariadb(*, keep_ports: bool = False) -> MariaDBInfo:
    """Start (or re-verify) the private MariaDB server; returns its address.

    ``keep_ports=True`` (a restart) fails rather than move to a new port when the stored
    one stays taken (:func:`~integration.services.ports.stable_port`).
    """
    with _locked():
        server, install_db, client = _binaries(install=True)
        user = _service_user(create=True)
        root = _root_for_start(user)
        state = _load_state()
        section = _section(state, "mariadb")
        pid = _mariadb_pid(root)
        others = {  # the other services' kept ports, even while they are stopped
            value
            for name in SERVICES
            if name != "mariadb" and isinstance(state.get(name), dict)
            for key, value in state[name].items()
            if key.endswith("port") and isinstance(value, int)
        }
        if pid is not None and not isinstance(section.get("port"), int):
            raise ServiceError(f"MariaDB runs (pid {pid}) but its port is unknown; run "
                               "`scripts/services stop --only mariadb`")
        port = stable_port(section, "port", pid is not None, others, keep=keep_ports)
        socket = _socket(root, user)
        logfile = root / "log" / "mariadb.log"
        timeout = service_timeout()
        started = time.monotonic()
        new = pid is None
        if pid is not None:
            log.info("MariaDB already running (pid %d, port %d); verifying", pid, port)
        else:
            options = _write_options(root, user, port)
            if not _initialised(root):
                _install_db(install_db, options, user, root)
            section["root"] = str(root)
            _save_state(state)
            log.info("starting MariaDB (user %r, port %d, up to %.0fs)", user, port, timeout)
            argv = [str(server), f"--defaults-file={options}"]
            if _is_root():
                argv.append(f"--user={user}")
            with open(root / "log" / "mariadbd.out", "ab") as out:
                child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, cwd=root,
                                         start_new_session=True)
            _children[child.pid] = child
            _pid_file(root).write_text(f"{child.pid}\n")
            pid = child.pid
        server_pid = pid
        try:
            _wait("MariaDB", lambda: answers(client, socket), timeout=timeout,
                  alive=lambda: _proc_alive(server_pid), interval=0.1)
            for statement in setup_sql():
                admin_sql(client, socket, statement)
            version = admin_sql(client, socket, "SELECT VERSION()").split("-")[0]
            if admin_sql(client, socket, "SELECT @@have_ssl") != "YES":
                raise ServiceError("the server does not offer TLS (@@have_ssl is not YES)")
        except ServiceError as exc:
            if new:
                _terminate(server_pid, 20.0, name="MariaDB")
                _pid_file(root).unlink(missing_ok=True)
            raise ServiceError(f"MariaDB is not usable: {exc}\n{_log_excerpt(logfile)}") from exc
        section["version"] = version
        _save_state(state)
        info = MariaDBInfo(HOST, port, version)
        log.info("MariaDB %s ready in %.1fs: %s", version, time.monotonic() - started,
                 info.redacted)
        _refresh_env_file()
        return info


def stop_mariadb(mode: PgStopMode = "fast") -> bool:
    """Stop the server: ``smart``/``fast`` SIGTERM (a clean InnoDB shutdown; SIGKILL after
    :data:`STOP_TIMEOUT`), ``immediate`` SIGKILL (a crash). False if it was not running."""
    if mode not in ("smart", "fast", "immediate"):
        raise ValueError(f"mode must be smart, fast or immediate, not {mode!r}")
    with _locked():
        root = _root_existing()
        pid = None if root is None else _mariadb_pid(root)
        if root is None or pid is None:
            return False
        kill = mode == "immediate"
        log.info("stopping MariaDB (pid %d, %s)", pid, "SIGKILL" if kill else "SIGTERM")
        started = time.monotonic()
        _terminate(pid, STOP_TIMEOUT, kill=kill, name="MariaDB")
        _pid_file(root).unlink(missing_ok=True)
        log.info("MariaDB stopped in %.1fs", time.monotonic() - started)
        _refresh_env_file()
        return True


def restart_mariadb(mode: PgStopMode = "fast", downtime: float = 0.0) -> MariaDBInfo:
    """Stop (``mode="immediate"``: SIGKILL, a crash), stay down ``downtime`` s, start
    again. The port, the data and the prepared XA branches are kept."""
    with _locked():
        stop_mariadb(mode)
        if downtime > 0:
            time.sleep(downtime)
        return start_mariadb(keep_ports=True)


def _mariadb_status() -> tuple[MariaDBInfo | None, Path | None, int | None]:
    root = _root_existing()
    if root is None:
        return None, None, None
    pid = _mariadb_pid(root)
    section = _load_state().get("mariadb", {})
    if pid is None or not isinstance(section.get("port"), int):
        return None, root, pid
    return MariaDBInfo(HOST, int(section["port"]), str(section.get("version", "?"))), root, pid

