"""Configuration of the MariaDB sink: the server's address, its table names, its options.

The address is a URL, ``mariadb://user:password@host:3306/database`` (``mysql://`` too),
whose query may name TLS files (``ssl_ca``, ``ssl_cert``, ``ssl_key``) and
``ssl_verify_identity=false``. With ``ssl_ca`` the connection is TLS, the server's
certificate verified against it; without any, it is plain TCP. The password never appears
in a ``str``/``repr`` of the address nor in any message the sink builds from it
(:meth:`Address.redact`).

Example::

    >>> address = Address("mariadb://app:s3cret@db.example:3306/shop?ssl_ca=/etc/ca.pem")
    >>> address
    Address('mariadb://app:***@db.example:3306/shop?ssl_ca=/etc/ca.pem')
    >>> address.where()
    'db.example:3306/shop'
    >>> address.redact("Access denied (using password s3cret)")
    'Access denied (using password ***)'
    >>> str(TableName.parse("shop.events")), TableName.parse("events", "shop").sql()
    ('shop.events', '`shop`.`events`')
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from connectors.core.changes import check_change_options
from connectors.core.errors import ConfigurationError

__all__ = ["DEFAULT_CONNECT_TIMEOUT", "DEFAULT_LOCK_WAIT_TIMEOUT", "Address", "MariaDBOptions",
           "Mode", "TableName", "quote"]

Mode = Literal["append", "upsert", "changes"]

MASK = "***"
#: Seconds a task waits on a row lock (``innodb_lock_wait_timeout``): a prepared branch
#: keeps its locks until the driver commits it, so a bounded wait turns a wait on one into
#: a retriable error instead of a hang.
DEFAULT_LOCK_WAIT_TIMEOUT = 30
#: Connect timeout (seconds) for tasks and the driver.
DEFAULT_CONNECT_TIMEOUT = 10
#: MariaDB's limit on a database or table name (characters).
MAX_NAME = 64
_TLS_KEYS = ("ssl_ca", "ssl_cert", "ssl_key", "ssl_verify_identity", "ssl_verify_cert")


def quote(name: str) -> str:
    """``name`` as a MariaDB identifier: in backticks, a backtick doubled (the one quoting
    of the package: statements, the LOAD DATA file's columns).

    >>> quote("we`ird")
    '`we``ird`'
    """
    if not name or "\x00" in name:
        raise ValueError("a MariaDB identifier is not empty and holds no NUL")
    return "`" + name.replace("`", "``") + "`"


class Address:
    """Where the server is and how to log in; its password shows in no string."""

    __slots__ = ("database", "host", "password", "port", "scheme", "tls", "user")

    def __init__(self, url: str) -> None:
        if not isinstance(url, str) or not url.strip():
            raise ConfigurationError("the address must be a URL such as "
                                     "'mariadb://user:password@host:3306/database'")
        try:
            parts = urlsplit(url.strip())
            port = parts.port
        except ValueError:
            raise ConfigurationError(
                "the address is not a valid URL (its text is not shown: it may hold a "
                "password); use 'mariadb://user:password@host:3306/database'") from None
        if parts.scheme not in ("mariadb", "mysql"):
            raise ConfigurationError(
                f"the address's scheme must be mariadb:// or mysql://, not {parts.scheme!r}")
        database = unquote(parts.path.lstrip("/"))
        if not parts.hostname or not parts.username or not database:
            raise ConfigurationError(
                "the address must name a user, a host and a database: "
                "'mariadb://user:password@host:3306/database'")
        query = dict(parse_qsl(parts.query))
        unknown = sorted(set(query) - set(_TLS_KEYS))
        if unknown:
            raise ConfigurationError(
                f"unknown address option(s) {', '.join(unknown)}: the known ones are "
                f"{', '.join(_TLS_KEYS)}")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = port or 3306
        self.user = unquote(parts.username)
        self.password = unquote(parts.password) if parts.password is not None else None
        self.database = database
        self.tls = query

    def where(self) -> str:
        """``host:port/database``: for messages (no secret)."""
        return f"{self.host}:{self.port}/{self.database}"

    def redact(self, text: str) -> str:
        """``text`` with the password masked (every message quoting the server goes
        through it)."""
        return text.replace(self.password, MASK) if self.password else text

    def connect_kwargs(self) -> dict[str, Any]:
        """PyMySQL's ``connect`` arguments (the password included: only for connecting)."""
        kwargs: dict[str, Any] = {"host": self.host, "port": self.port, "user": self.user,
                                  "password": self.password or "", "database": self.database}
        if not self.tls:
            # No TLS asked for: none (PyMySQL would otherwise try unverified TLS, loading the
            # system's CA store on every connect: ~25 ms a task, and no protection)
            kwargs["ssl_disabled"] = True
        else:
            ssl: dict[str, Any] = {k: v for k, v in self.tls.items()
                                   if k in ("ssl_ca", "ssl_cert", "ssl_key")}
            kwargs.update(ssl)
            verify = self.tls.get("ssl_verify_identity", "true").lower() not in ("0", "false")
            kwargs["ssl_verify_identity"] = verify
            kwargs["ssl_verify_cert"] = (
                self.tls.get("ssl_verify_cert", "true").lower() not in ("0", "false"))
        return kwargs

    def redacted(self) -> str:
        """The URL with its password masked."""
        user = self.user + (f":{MASK}" if self.password is not None else "")
        query = "&".join(f"{k}={v}" for k, v in self.tls.items())
        return (f"{self.scheme}://{user}@{self.host}:{self.port}/{self.database}"
                f"{'?' + query if query else ''}")

    def __repr__(self) -> str:
        return f"Address('{self.redacted()}')"

    __str__ = __repr__

    def __reduce__(self) -> tuple[Any, ...]:  # tasks get the address through pickling
        return (_rebuild, (self.scheme, self.host, self.port, self.user, self.password,
                           self.database, dict(self.tls)))


def _rebuild(scheme: str, host: str, port: int, user: str, password: str | None,
             database: str, tls: dict[str, str]) -> Address:
    address = Address.__new__(Address)
    address.scheme, address.host, address.port, address.user = scheme, host, port, user
    address.password, address.database, address.tls = password, database, tls
    return address


_NAME = re.compile(r"`((?:[^`]|``)+)`|([^.`]+)")


@dataclass(frozen=True)
class TableName:
    """A table of a database, always quoted when put into SQL."""

    database: str
    name: str

    @classmethod
    def parse(cls, value: str, default_database: str | None = None, *,
              what: str = "table", reserve: int = 0) -> TableName:
        """``"events"`` (in ``default_database``), ``"shop.events"`` or
        ``"`my.db`.`Events`"``; names longer than 64 characters (less ``reserve``, what
        the sink appends) are refused."""
        parts: list[str] = []
        rest = value.strip() if isinstance(value, str) else ""
        while rest:
            found = _NAME.match(rest)
            if found is None:
                break
            parts.append(found.group(1).replace("``", "`") if found.group(1) is not None
                         else found.group(2).strip())
            rest = rest[found.end():]
            if rest.startswith("."):
                rest = rest[1:]
                if not rest:
                    parts = []
            elif rest:
                parts = []
                break
        if len(parts) == 1 and default_database:
            parts.insert(0, default_database)
        if len(parts) != 2 or not all(parts):
            raise ConfigurationError(
                f"{what} must be 'database.table' or 'table' (in the address's database), "
                f"got {value!r}")
        limit = MAX_NAME - reserve
        if len(parts[1]) > limit or len(parts[0]) > MAX_NAME:
            raise ConfigurationError(
                f"{what} {value!r}: MariaDB names have at most {MAX_NAME} characters"
                + (f" (and the sink appends up to {reserve} to this one)" if reserve else ""))
        return cls(parts[0], parts[1])

    def sql(self, suffix: str = "") -> str:
        return f"{quote(self.database)}.{quote(self.name + suffix)}"

    def __str__(self) -> str:
        def show(part: str) -> str:
            return part if re.fullmatch(r"[A-Za-z0-9_$]+", part) else quote(part)

        return f"{show(self.database)}.{show(self.name)}"


@dataclass(frozen=True)
class MariaDBOptions:
    """Validated options of the MariaDB sink."""

    table: TableName
    ledger_table: TableName
    mode: Mode = "append"
    key_columns: tuple[str, ...] = ()
    create_table: bool = False
    lock_wait_timeout: int = DEFAULT_LOCK_WAIT_TIMEOUT
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT

    op_column: str | None = None
    sequence_column: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("append", "upsert", "changes"):
            raise ConfigurationError(
                f"mode must be 'append', 'upsert' or 'changes', got {self.mode!r}")
        if self.mode in ("upsert", "changes") and not self.key_columns:
            raise ConfigurationError(f"mode={self.mode!r} needs key_columns (the columns of "
                                     "a primary key or unique index of the table)")
        if self.mode == "append" and self.key_columns:
            raise ConfigurationError("key_columns are for mode='upsert' or mode='changes'")
        check_change_options(self.mode, self.key_columns, self.op_column,
                             self.sequence_column, _column_name)
        for name in ("lock_wait_timeout", "connect_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigurationError(f"{name} must be a positive number of seconds, "
                                         f"got {value!r}")


def _column_name(name: object, what: str) -> str:
    """``name`` if MariaDB can name a column so (:func:`quote`), else
    :class:`ConfigurationError`."""
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"{what} must be a non-empty string, not {name!r}")
    if "\x00" in name or len(name) > MAX_NAME:
        raise ConfigurationError(f"{what} {name!r}: a MariaDB column name has 1 to "
                                 f"{MAX_NAME} characters and no NUL")
    return name
