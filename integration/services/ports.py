"""A service's ports across restarts: the stored one is waited for, never silently moved.

A service stopped a moment ago may still hold its port for a few dozen ms (a SIGKILLed
JVM's last thread still tearing down its memory; the sockets close after), and clients keep
the address they were given. So a (re)start waits for the stored port, up to
:func:`port_release_wait` (60 s, ``$EOS_SERVICES_PORT_WAIT``); when it stays taken by another
process, a restart (``keep=True``) fails loudly naming the holder, a plain start moves to a
new port with a WARNING (``scripts/services start`` writes the new address to
``.services.env``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

from integration.services.config import ServiceError, _env_float
from integration.services.process import _free_ports, _port_free, _wait

__all__ = ["port_holder", "port_release_wait", "stable_port"]

log = logging.getLogger("connectors.services")  # as process.py: the CLI shows it


def port_release_wait() -> float:
    """Seconds a (re)start waits for a stored port's release (``$EOS_SERVICES_PORT_WAIT``)."""
    return _env_float("EOS_SERVICES_PORT_WAIT", 60.0)


def port_holder(port: int) -> str:
    """Who holds HOST:port, as far as /proc tells (``pid 123 (java)``), for messages."""
    inodes: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    holders: set[str] = set()
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):
            for fd in fd_dir.iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        comm = (fd_dir.parent / "comm").read_text().strip()
                        holders.add(f"pid {fd_dir.parent.name} ({comm})")
    if holders:
        return ", ".join(sorted(holders))
    return "a socket of no process this user can see (`ss -tanp` names it)" if inodes else (
        "nothing visible any more")


def stable_port(
    section: dict[str, Any], key: str, running: bool, taken: set[int], *, keep: bool = False
) -> int:
    """The stored port; a new one only when there is none yet or it stays taken (see the
    module docstring; ``keep=True``: a restart, which fails rather than move)."""
    stored = section.get(key)
    patience = port_release_wait()
    if isinstance(stored, int) and 0 < stored < 65536:
        if running:
            return stored
        if stored not in taken:
            if not _port_free(stored):
                log.info("port %d (%s) is still taken (%s); waiting up to %.0fs for its "
                         "release", stored, key, port_holder(stored), patience)
                with contextlib.suppress(ServiceError):
                    _wait(f"port {stored} ({key}) to be released",
                          lambda: _port_free(stored), timeout=patience, interval=0.05)
            if _port_free(stored):
                return stored
        holder = port_holder(stored) if stored not in taken else "another of its ports"
        if keep:
            raise ServiceError(
                f"port {stored} ({key}) is still taken after {patience:.0f}s, by {holder}: a "
                "restart keeps the service's address (its clients hold it), so it does not "
                "move; free the port, or `scripts/services stop` and `start` (which chooses "
                "a new one)")
        log.warning("port %d (%s) is taken by %s; choosing a new one", stored, key, holder)
    while True:
        (port,) = _free_ports(1)
        if port not in taken:
            section[key] = port
            return port
