"""PostgreSQL: its German messages, start, stop, restart and status."""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from pathlib import Path

from integration.services.config import (
    HOST,
    PG_DATABASE,
    PG_LC_MESSAGES,
    PgStopMode,
    PostgresInfo,
    ServiceError,
    service_timeout,
)
from integration.services.kafka import _configured_port
from integration.services.pg_cluster import (
    _pg_bindir,
    _pg_ctl,
    _pg_finish_setup,
    _pg_initdb,
    _pg_initialised,
    _pg_root_existing,
    _pg_root_for_start,
    _pg_running,
    _pg_socket_dir,
    _pg_write_conf,
    _psql,
)
from integration.services.ports import stable_port
from integration.services.process import (
    _apt_install,
    _is_root,
    _load_state,
    _locked,
    _log_excerpt,
    _proc_alive,
    _refresh_env_file,
    _run,
    _save_state,
    _section,
    _service_user,
    _wait,
)

log = logging.getLogger("connectors.services")


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


def start_postgres(*, keep_ports: bool = False) -> PostgresInfo:
    """Start (or re-verify) the private PostgreSQL cluster; returns its connection info.

    ``keep_ports=True`` (a restart) fails rather than move to a new port when the stored
    one stays taken (:func:`~integration.services.ports.stable_port`).
    """
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
        port = stable_port(section, "port", running, set(), keep=keep_ports)
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
        postmaster = _pg_postmaster_pid(root)
        _pg_ctl(bindir, user, root, "stop", "-m", mode, "-w", "-t", "60", timeout=90)
        if postmaster is not None:
            # pg_ctl returns once postmaster.pid is gone, which the postmaster removes on
            # its way out, before its sockets are closed: wait for the process itself.
            with contextlib.suppress(ServiceError):
                _wait("the PostgreSQL postmaster to exit", lambda: not _proc_alive(postmaster),
                      timeout=30, interval=0.02)
        _refresh_env_file()
        return True


def _pg_postmaster_pid(root: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int((root / "data" / "postmaster.pid").read_text().splitlines()[0])
    return None


def restart_postgres(mode: PgStopMode = "fast", downtime: float = 0.0) -> PostgresInfo:
    """Stop (``mode="immediate"`` simulates a crash), stay down ``downtime`` s, start again.

    The port, data and prepared transactions are kept.
    """
    with _locked():
        stop_postgres(mode)
        if downtime > 0:
            time.sleep(downtime)
        return start_postgres(keep_ports=True)


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
