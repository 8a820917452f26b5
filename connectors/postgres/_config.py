"""Configuration of the PostgreSQL sink: validated once, secrets kept out of every string."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

import psycopg
from psycopg import sql

from connectors.core.changes import check_change_options
from connectors.core.errors import ConfigurationError
from connectors.postgres._names import check_identifier, format_table_name, split_table_name
from connectors.postgres._redact import (
    MASK,
    is_secret_keyword,
    mask_options,
    options_secrets,
    redact,
)

__all__ = ["Conninfo", "PostgresOptions", "TableName", "redact"]

Mode = Literal["append", "upsert", "changes"]
_DURATION = re.compile(r"\d+(ms|s|min)?")

#: Default lock wait inside a task: a prepared transaction keeps its row locks until the
#: driver commits it, and PostgreSQL cannot see a wait on a prepared transaction as a
#: deadlock; a bounded wait turns that into a retriable error instead of a hang.
DEFAULT_LOCK_TIMEOUT = "30s"
#: Connect timeout (seconds) for tasks and the driver: an unreachable server fails fast.
DEFAULT_CONNECT_TIMEOUT = 10


class Conninfo:
    """A libpq connection string whose secrets never show in ``str``/``repr``.

    Secret: ``password``, ``sslpassword`` and every other keyword libpq hides, and the
    secret-looking settings inside ``options`` (:mod:`connectors.postgres._redact`), in
    whatever form the string gives them (keywords, a URI's userinfo or query).
    :meth:`redact` masks them in any text: every message, log line and error of the
    sink that could quote the string goes through it.

    Example::

        >>> info = Conninfo("postgresql://app:s3cret@db:5432/prod?sslpassword=keypass123")
        >>> info
        Conninfo('user=app password=*** dbname=prod host=db port=5432 sslpassword=***')
        >>> info.redact("could not open key file with keypass123")
        'could not open key file with ***'
    """

    __slots__ = ("_params", "_raw")

    def __init__(self, conninfo: str) -> None:
        if not isinstance(conninfo, str) or not conninfo.strip():
            raise ConfigurationError(
                "conninfo must be a libpq connection string such as "
                "'postgresql://user@host:5432/dbname'"
            )
        try:
            params = psycopg.conninfo.conninfo_to_dict(conninfo)
        except psycopg.ProgrammingError:
            raise ConfigurationError(
                "conninfo is not a valid libpq connection string (its text is not shown: it "
                "may hold a password); use 'postgresql://user@host:5432/dbname' or "
                "'host=... dbname=... user=...'"
            ) from None
        self._raw = conninfo
        self._params = {k: str(v) for k, v in params.items() if v is not None}

    @property
    def secret(self) -> str:
        """The full connection string, secrets included: only for ``psycopg.connect``."""
        return self._raw

    @property
    def secrets(self) -> list[str]:
        """Every secret value the string holds (for :meth:`redact`)."""
        values = [v for k, v in self._params.items() if is_secret_keyword(k) and v]
        return values + options_secrets(self._params.get("options", ""))

    @property
    def password(self) -> str | None:
        return self._params.get("password")

    @property
    def user(self) -> str | None:
        return self._params.get("user")

    def where(self) -> str:
        """``host:port/dbname`` as given (defaults left out), for messages: no secret."""
        host = self._params.get("host") or self._params.get("hostaddr") or "local socket"
        port = self._params.get("port")
        db = self._params.get("dbname")
        return f"{host}{':' + str(port) if port else ''}{'/' + str(db) if db else ''}"

    def param(self, keyword: str) -> str | None:
        """The value the settings give ``keyword`` (never a secret's: ``None`` for those)."""
        return None if is_secret_keyword(keyword) else self._params.get(keyword)

    @property
    def dbname(self) -> str | None:
        return self._params.get("dbname")

    def options_with(self, settings: str) -> str:
        """The connection's libpq ``options``: the conninfo's own (``-c search_path=...``),
        then the sink's ``settings``, which win for a setting both name. (Passed alone,
        the sink's would replace the user's: a keyword argument of ``psycopg.connect``
        overrides the same keyword of the conninfo.)

        Example::

            >>> Conninfo("host=h options='-c search_path=app'").options_with("-c x=1")
            '-c search_path=app -c x=1'
        """
        own = self._params.get("options", "").strip()
        return f"{own} {settings}" if own else settings

    def redacted(self) -> str:
        """The connection parameters with every secret replaced by ``***``."""
        params = {k: MASK if is_secret_keyword(k) else v for k, v in self._params.items()}
        if "options" in params:
            params["options"] = mask_options(params["options"])
        return psycopg.conninfo.make_conninfo(**params)

    def redact(self, text: str) -> str:
        """``text`` with this string's secrets, and any secret keyword's value, masked."""
        return redact(text, self.secrets)

    def __repr__(self) -> str:
        return f"Conninfo({self.redacted()!r})"

    def __str__(self) -> str:
        return self.redacted()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Conninfo) and other._raw == self._raw

    def __hash__(self) -> int:
        return hash(self._raw)


@dataclass(frozen=True)
class TableName:
    """A schema-qualified table name, always quoted when put into SQL."""

    schema: str
    name: str

    @classmethod
    def parse(cls, value: str | tuple[str, str], *, what: str = "table",
              reserve: int = 0) -> TableName:
        """``"events"``, ``"public.events"``, ``'"my.schema"."Events"'`` or
        ``("public", "events")``: the rules and the names refused are
        :mod:`connectors.postgres._names`'. ``reserve``: bytes the sink appends to the name.

        The parts are quoted later with ``psycopg.sql.Identifier``, so
        ``x"; drop table y; --`` is just a (missing) table.
        """
        return cls(*split_table_name(value, what, reserve=reserve))

    def sql(self, suffix: str = "") -> sql.Identifier:
        return sql.Identifier(self.schema, self.name + suffix)

    def __str__(self) -> str:
        return format_table_name(self.schema, self.name)


@dataclass(frozen=True)
class PostgresOptions:
    """Validated options of :class:`~connectors.postgres.PostgresSink`."""

    table: TableName
    mode: Mode = "append"
    key_columns: tuple[str, ...] = ()
    create_table: bool = False
    ledger_table: TableName = field(default_factory=lambda: TableName("public", "eos_ledger"))
    lock_timeout: str = DEFAULT_LOCK_TIMEOUT
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT
    reuse_connections: bool = True

    op_column: str | None = None
    sequence_column: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("append", "upsert", "changes"):
            raise ConfigurationError(
                f"mode must be 'append', 'upsert' or 'changes', not {self.mode!r}")
        if self.mode in ("upsert", "changes") and not self.key_columns:
            raise ConfigurationError(
                f"mode={self.mode!r} needs key_columns: the columns of a unique index or "
                "primary key of the table, e.g. key_columns=['user_id']"
            )
        if self.mode == "append" and self.key_columns:
            raise ConfigurationError(
                "key_columns only apply to mode='upsert' or mode='changes'")
        self._check_changes()
        if not _DURATION.fullmatch(self.lock_timeout):
            raise ConfigurationError(
                f"lock_timeout {self.lock_timeout!r}: use PostgreSQL units such as '30s'"
            )
        if not isinstance(self.connect_timeout, int) or self.connect_timeout < 1:
            raise ConfigurationError("connect_timeout must be an int >= 1 (seconds)")

    def _check_changes(self) -> None:
        """``op_column`` and ``sequence_column``: both with ``mode="changes"``, else none
        (:func:`~connectors.core.changes.check_change_options`)."""
        check_change_options(self.mode, self.key_columns, self.op_column,
                             self.sequence_column, check_identifier)
