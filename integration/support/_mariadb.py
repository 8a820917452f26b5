"""The ``mariadb`` command line as the tests' MariaDB client (no Python driver is a
dependency yet): one-shot statements (:func:`mariadb_sql`) and a connection held open
across statements (:class:`MariaDBSession`). Passwords go by ``MYSQL_PWD``, never on a
command line."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from urllib.parse import unquote, urlsplit

__all__ = ["MariaDBAddress", "MariaDBSession", "mariadb_sql"]

#: Seconds one statement of a test may take (a restart's recovery is waited for apart).
STATEMENT_TIMEOUT = 60.0


@dataclasses.dataclass(frozen=True)
class MariaDBAddress:
    """Where and as whom to log in; ``ssl_ca`` set: TLS with the server's certificate
    verified against it (``--ssl-verify-server-cert``); ``ssl=False``: ``--skip-ssl``."""

    host: str
    port: int
    user: str
    password: str
    database: str
    ssl_ca: Path | None = None
    ssl: bool = True

    @classmethod
    def from_url(cls, url: str) -> MariaDBAddress:
        parts = urlsplit(url)
        if parts.scheme != "mariadb" or not parts.hostname or parts.port is None:
            raise ValueError("expected mariadb://user:password@host:port/db")
        return cls(parts.hostname, parts.port, unquote(parts.username or ""),
                   unquote(parts.password or ""), parts.path.lstrip("/"))

    def as_user(self, user: str, password: str) -> MariaDBAddress:
        return dataclasses.replace(self, user=user, password=password)

    def with_tls(self, ssl_ca: Path | None, ssl: bool = True) -> MariaDBAddress:
        return dataclasses.replace(self, ssl_ca=ssl_ca, ssl=ssl)

    def argv(self, *extra: str) -> list[str]:
        client = shutil.which("mariadb")
        if client is None:
            raise RuntimeError("the `mariadb` command line is missing (mariadb-client-core)")
        argv = [client, "--no-defaults", "--protocol=TCP", f"--host={self.host}",
                f"--port={self.port}", f"--user={self.user}", "--batch",
                "--skip-column-names", "--connect-timeout=10"]
        if self.ssl_ca is not None:
            argv += [f"--ssl-ca={self.ssl_ca}", "--ssl-verify-server-cert"]
        elif not self.ssl:
            argv.append("--skip-ssl")
        return [*argv, *extra, self.database]

    def env(self) -> dict[str, str]:
        return {**os.environ, "MYSQL_PWD": self.password}


def mariadb_sql(address: MariaDBAddress, sql: str, *, check: bool = True,
                options: tuple[str, ...] = (),
                timeout: float = STATEMENT_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run ``sql`` on a connection of its own (``options``: more of the client's);
    ``check``: fail on an error, naming it."""
    proc = subprocess.run(address.argv(*options, "-e", sql), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=address.env(), timeout=timeout,
                          check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{sql!r} as {address.user} failed: {proc.stderr.strip()}")
    return proc


class MariaDBSession:
    """One connection held open across statements: a ``mariadb`` process fed on stdin
    (``--force``: an error does not end it). :meth:`run` returns a statement's output
    and error lines; :meth:`close` disconnects (``COM_QUIT``), :meth:`kill` drops the TCP
    connection as a crashed client does. Both return once the server has ended the
    session: a client's end comes before the server detaches the session's prepared
    branch, and another connection's ``XA COMMIT`` in that gap answers ``XAER_NOTA``."""

    def __init__(self, address: MariaDBAddress) -> None:
        self._address = address
        self._proc = subprocess.Popen(
            address.argv("--force", "--unbuffered"), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=address.env(),
            bufsize=1)
        self._session = int(self.run("SELECT CONNECTION_ID()"))

    def run(self, sql: str, timeout: float = STATEMENT_TIMEOUT) -> str:
        """The output of ``sql`` (one or more statements), errors as ``ERROR ...`` lines."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        marker = f"-- end {uuid.uuid4().hex}"
        self._proc.stdin.write(f"{sql.rstrip().rstrip(';')};\nSELECT '{marker}';\n")
        self._proc.stdin.flush()
        lines: list[str] = []
        while True:  # the marker's row (or the client's end) closes the statement's output
            line = self._proc.stdout.readline()
            if not line or line.rstrip("\n") == marker:
                break
            lines.append(line.rstrip("\n"))
        if not line:
            self._proc.wait(timeout=timeout)
            lines.append(f"(the client exited with code {self._proc.returncode})")
        return "\n".join(lines)

    def close(self) -> None:
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=STATEMENT_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
        self._wait_ended()

    def kill(self) -> None:
        self._proc.kill()
        self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None and not stream.closed:
                stream.close()
        self._wait_ended()

    def _wait_ended(self) -> None:
        """Wait until the server no longer lists the session (a server that is down or
        restarting has ended it too)."""
        deadline = time.monotonic() + STATEMENT_TIMEOUT
        sql = (f"SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {self._session}"
               " AND ID <> CONNECTION_ID()")  # after a restart, ids start again
        while time.monotonic() < deadline:
            proc = mariadb_sql(self._address, sql, check=False)
            if proc.returncode != 0 or proc.stdout.split() == ["0"]:
                return
            time.sleep(0.05)
        raise AssertionError(f"session {self._session} still open after {STATEMENT_TIMEOUT} s")
