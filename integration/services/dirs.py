"""Directories of a server run by the service user (PostgreSQL, MariaDB): its root, and
the directory of its unix socket.

The root is ``<state_dir>/<service>`` when the service user can reach it; as root with a
state directory under a home the service user cannot search, it is a directory of its own
under the system's temporary directory (:func:`~integration.services.config._fallback_root`,
one per state directory). A socket path has a 107-byte limit: a socket directory whose
longest file (``longest``, e.g. its lock file) would pass 100 bytes moves to a short
directory under the temporary directory, one per root.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from integration.services.config import _fallback_root, state_dir
from integration.services.process import _as_user, _chown, _is_root, _run

__all__ = ["existing_root", "root_for_start", "socket_dir"]

log = logging.getLogger("connectors.services")


def existing_root(service: str, initialised: Callable[[Path], bool]) -> Path | None:
    """The root of ``service`` that ``initialised`` says was set up, if any."""
    for root in (state_dir() / service, _fallback_root(service)):
        if initialised(root):
            return root
    return None


def root_for_start(service: str, user: str, initialised: Callable[[Path], bool],
                   what: str) -> Path:
    """The root to start ``service`` in: the existing one, else one ``user`` can reach
    (``what``: the files' name in the log line of a fallback)."""
    existing = existing_root(service, initialised)
    if existing is not None:
        return existing
    primary = state_dir() / service
    primary.mkdir(parents=True, exist_ok=True)
    _chown(primary, user)
    if not _is_root():
        return primary
    probe = _run(_as_user(user, ["test", "-w", str(primary), "-a", "-x", str(primary)]),
                 timeout=30, check=False)
    if probe.returncode == 0:
        return primary
    fallback = _fallback_root(service)
    log.warning("user %r cannot reach %s (a parent directory is not searchable); keeping "
                "%s in %s instead", user, primary, what, fallback)
    fallback.parent.mkdir(parents=True, exist_ok=True)
    fallback.parent.chmod(0o755)
    fallback.mkdir(exist_ok=True)
    _chown(fallback, user)
    return fallback


def socket_dir(root: Path, user: str, longest: str, tag: str) -> Path:
    """``<root>/run``, or ``<tmp>/eos-<tag>-<uid>-<digest of root>`` when ``longest`` in
    it would pass the unix socket limit; made, searchable, owned by ``user``."""
    directory = root / "run"
    if len(str(directory / longest)) > 100:
        digest = hashlib.sha1(str(root).encode(), usedforsecurity=False).hexdigest()[:10]
        directory = Path(tempfile.gettempdir()) / f"eos-{tag}-{os.getuid()}-{digest}"
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    _chown(directory, user)
    return directory
