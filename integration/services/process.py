"""The machinery the services share: the state file and its lock, commands, ports,
waiting, packages, the service user, and child processes."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from integration.services.config import HOST, ServiceError, state_dir

log = logging.getLogger("connectors.services")


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
    """The user PostgreSQL and MariaDB run as: ``eos`` (created if needed) when root, else
    ourselves."""
    if not _is_root():
        return pwd.getpwuid(os.getuid()).pw_name
    name = os.environ.get("EOS_SERVICE_USER", "").strip() or "eos"
    if name == "root":
        raise ServiceError("EOS_SERVICE_USER must not be root: PostgreSQL and MariaDB refuse "
                           "to run as root")
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
    log.info("creating system user %r to run PostgreSQL and MariaDB (they refuse to run as "
             "root)", name)
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


_children: dict[int, subprocess.Popen[bytes]] = {}


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
        if _threads_alive(pid):
            return True  # the leader died first; its other threads still hold the sockets
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True


def _threads_alive(pid: int) -> bool:
    """True while a thread of ``pid`` other than a zombie remains.

    After a SIGKILL a JVM's thread-group leader shows ``Z`` within a millisecond, while one
    last thread still unmaps the heap for a few dozen ms (37-57 ms measured with the broker's
    512 MB heap): its file descriptors, the listening sockets among them, close only after.
    Taking the leader's ``Z`` for "gone" made a restart find the port still bound and move
    the broker to a new one.
    """
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X"):
            return True
    return False


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


def _rotate(path: Path, limit: int) -> None:
    """Keep ``path`` below ``limit`` bytes across starts: move a larger one to ``.1``."""
    with contextlib.suppress(OSError):
        if path.stat().st_size > limit:
            path.replace(path.with_name(path.name + ".1"))


def _refresh_env_file() -> None:
    """Rewrite ``.services.env`` with what runs now (:mod:`integration.services.control`).

    Imported when called: the env file names every service, so ``control`` imports them all.
    """
    from integration.services import control

    control._refresh_env_file()
