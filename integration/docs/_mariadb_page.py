"""MariaDB for the docs' pages: a database of the page's own, its rows, its branches.

A page whose blocks read ``EOS_MARIADB_URL`` gets the address of a database made for it
(``eos_docs_<tag>``: the sink's user may create and drop databases of that pattern,
``integration/services/mariadb_cluster.DOCS_DATABASES``), so that two pages running at once
(the README's quick-start, docs/mariadb.md) never share a table or a ledger. After the page,
the branches its sinks left prepared (none, when every block finished) are rolled back and
the database is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from connectors.core.naming import TransactionId
from connectors.mariadb._client import connect
from connectors.mariadb._config import Address
from connectors.mariadb._xid import transaction_id_of_row, xid_sql

__all__ = [
    "DOCS_SINKS",
    "ENV_URL",
    "mariadb_database",
    "mariadb_prepared",
    "mariadb_rows",
    "password_of",
]

ENV_URL = "EOS_MARIADB_URL"
#: The sink ids of the docs' MariaDB blocks (each used by one page only).
DOCS_SINKS = ("events-mariadb", "users-mariadb", "accounts-mariadb-cdc")


def password_of(url: str) -> str:
    return urlsplit(url).password or ""


def _execute(url: str, statement: str) -> list[tuple[Any, ...]]:
    conn = connect(Address(url), connect_timeout=10, lock_wait_timeout=10)
    try:
        with conn.cursor() as cur:
            cur.execute(statement)
            return [tuple(row) for row in cur.fetchall()]
    finally:
        conn.close()


def mariadb_rows(url: str, query: str) -> list[tuple[Any, ...]]:
    """The rows of ``query``, read as a downstream user reads the table."""
    return _execute(url, query)


def mariadb_prepared(url: str, sink_ids: Sequence[str] = DOCS_SINKS) -> list[TransactionId]:
    """The branches of ``sink_ids`` that ``XA RECOVER`` lists (the whole server's)."""
    return [t for t in _prepared(url) if t.sink_id in sink_ids]


def _prepared(url: str) -> list[TransactionId]:
    found = [transaction_id_of_row(row) for row in _execute(url, "XA RECOVER")]
    return [t for t in found if t is not None]


@contextmanager
def mariadb_database(server: str, name: str,
                     owns: Callable[[str], bool] = DOCS_SINKS.__contains__,
                     ) -> Iterator[str]:
    """Create database ``name`` on ``server`` (a ``mariadb://`` URL) and yield the URL of
    it; afterwards roll back the prepared branches of the sinks ``owns`` names (else
    ``DROP DATABASE`` would wait on their metadata locks), drop it, and fail if there were
    any."""
    _execute(server, f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    parts = urlsplit(server)
    url = urlunsplit(parts._replace(path=f"/{name}"))
    try:
        yield url
    finally:
        left = [t for t in _prepared(server) if owns(t.sink_id)]
        for tid in left:
            _execute(server, f"XA ROLLBACK {xid_sql(tid)}")
        _execute(server, f"DROP DATABASE IF EXISTS `{name}`")
    if left:
        raise AssertionError(f"prepared branches left in {name}: {[str(t) for t in left]}")
