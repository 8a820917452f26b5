"""The Python drivers ``benchmarks/mariadb_load.py`` compares, behind one small interface.

Each connects with autocommit on (XA statements run as plain SQL; ``XA START`` refuses to
start inside an open local transaction), ``LOAD DATA LOCAL`` allowed, utf8mb4, and, with
``tls``, TLS verified against the CA (and the host name where the driver offers it).

``memfd``: the LOAD DATA file lives in memory, an anonymous file of ``memfd_create`` named
by ``/proc/self/fd/N``: every driver opens the path the server asks for, none reads from a
stream. mysql-connector-python refuses a symbolic link (``/proc/self/fd/N`` is one): it gets
a file in ``/dev/shm`` (tmpfs, also memory).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["DRIVERS", "Server", "connect", "in_memory_file", "version_of"]

#: Contender name -> the module it imports.
DRIVERS = {"pymysql": "pymysql", "mysql-connector": "mysql.connector", "mariadb": "mariadb",
           "mysqlclient": "MySQLdb"}


@dataclass(frozen=True)
class Server:
    """Where the benchmark's MariaDB listens, and who it logs in as."""

    host: str
    port: int
    user: str
    password: str
    database: str
    ssl_ca: str | None = None
    tls_user: str | None = None
    tls_password: str | None = None


def version_of(driver: str) -> str:
    """``name version`` of the installed driver (mariadb 1.1 and 2.0 differ a lot)."""
    from importlib import metadata

    dist = {"pymysql": "PyMySQL", "mysql-connector": "mysql-connector-python",
            "mariadb": "mariadb", "mysqlclient": "mysqlclient"}[driver]
    return f"{driver} {metadata.version(dist)}"


def connect(driver: str, server: Server, *, tls: bool = False) -> Any:
    """A new connection of ``driver`` to ``server`` (autocommit, LOCAL INFILE allowed)."""
    module = importlib.import_module(DRIVERS[driver])
    user, password = server.user, server.password
    if tls and server.tls_user:
        user, password = server.tls_user, server.tls_password or ""
    common = {"host": server.host, "port": server.port, "user": user, "password": password}
    if tls and not server.ssl_ca:
        raise ValueError("--ssl-ca (EOS_MARIADB_SSL_CA) is needed for the TLS figures")
    ca = server.ssl_ca
    if driver == "pymysql":
        # ssl_disabled: PyMySQL >= 1.2 otherwise tries TLS unverified, loading the system's
        # CA store on every connect (~25 ms)
        extra: dict[str, Any] = {"ssl_ca": ca, "ssl_verify_cert": True,
                                 "ssl_verify_identity": True} if tls else {"ssl_disabled": True}
        return module.connect(**common, database=server.database, local_infile=True,
                              autocommit=True, charset="utf8mb4", **extra)
    if driver == "mysql-connector":
        extra = {"ssl_ca": ca, "ssl_verify_cert": True, "ssl_verify_identity": True} \
            if tls else {"ssl_disabled": True}
        return module.connect(**common, database=server.database, allow_local_infile=True,
                              autocommit=True, charset="utf8mb4",
                              collation="utf8mb4_general_ci", **extra)
    if driver == "mariadb":
        # ssl=True: without it, 2.0.0rc2 connects in plain text despite ssl_ca
        extra = {"ssl": True, "ssl_ca": ca, "ssl_verify_cert": True} if tls else {}
        return module.connect(**common, database=server.database, local_infile=True,
                              autocommit=True, **extra)
    if driver == "mysqlclient":
        extra = {"ssl": {"ca": ca}, "ssl_mode": "VERIFY_IDENTITY"} if tls else \
            {"ssl_mode": "DISABLED"}
        return module.connect(**common, database=server.database, local_infile=1,
                              autocommit=True, charset="utf8mb4", **extra)
    raise ValueError(f"unknown driver {driver!r}; known: {', '.join(DRIVERS)}")


@contextlib.contextmanager
def in_memory_file(data: Any, driver: str) -> Iterator[str]:
    """A path the driver can open that holds ``data`` (bytes-like), in memory."""
    if driver == "mysql-connector":
        with tempfile.NamedTemporaryFile(dir="/dev/shm", prefix="eos-load-") as f:
            f.write(data)
            f.flush()
            yield f.name
        return
    fd = os.memfd_create("eos-load")
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)
