"""Operating PostgresSinks from outside their queries: what they left, their ledgers, settling.

The operator tools (``connectors status``, ``recover``, ``doctor``) read and settle a
database through this module, and so can a script. :class:`PostgresAdmin` is one database
and one ledger table (default ``public.eos_ledger``), on one connection of its own:

- :meth:`~PostgresAdmin.sink_ids`: every sink with a ledger binding there or a
  transaction prepared there;
- :meth:`~PostgresAdmin.ledger`: a sink's ledger (decisions, binding), to read;
- :meth:`~PostgresAdmin.prepared`: the transactions the sinks left prepared
  (``pg_prepared_xacts``, their gids decoded into this library's transaction ids; another
  application's prepared transactions are not listed), with their ages;
- :meth:`~PostgresAdmin.settle`: commit what a ledger decided and roll back the rest,
  with the steps and the ledger serialization a driver's start uses (the per-sink lock and
  epoch), so it can never race a live driver: a roll-back first records "this run may
  never decide this batch", and a live driver then fails that batch (and retries it)
  instead of committing half of it.

Two helpers for reading the settings of a command line or a downstream check:
:func:`conninfo_has_secret` and :func:`column_values`.

Nothing here shows a secret: :meth:`PostgresAdmin.describe` and every error name the
database with its password redacted.

Example (``conninfo``: a libpq connection string)::

    from connectors.postgres.admin import PostgresAdmin

    with PostgresAdmin(conninfo) as db:
        left = [str(p.transaction_id) for p in db.prepared(sink_id)]
        done = db.settle(sink_id, left, commit_decided=True, abort_undecided=True)
        assert not db.prepared(sink_id) and not done.left
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from connectors.core.driver.operator import PreparedAdmin, PreparedTransaction
from connectors.core.ledgers.ledger import Ledger
from connectors.postgres._config import Conninfo, TableName
from connectors.postgres._gid import transaction_id_of
from connectors.postgres._ledger import DriverConnection, PostgresLedger
from connectors.postgres._ledger_sql import LEDGER_NAME_RESERVE
from connectors.postgres._sink import PostgresSink

__all__ = ["DEFAULT_LEDGER_TABLE", "PostgresAdmin", "PreparedTransaction", "column_values",
           "conninfo_has_secret"]

#: The default ledger table of :class:`~connectors.postgres.PostgresSink`.
DEFAULT_LEDGER_TABLE = "public.eos_ledger"


class PostgresAdmin(PreparedAdmin):
    """One database and one ledger table, read and settled on one connection
    (:class:`~connectors.core.driver.operator.PreparedAdmin`: ``settle``; a
    :class:`~connectors.core.driver.operator.PreparedTransaction`'s age is seconds since
    ``PREPARE TRANSACTION``, by the server's clock).

    ``conninfo``: a libpq connection string (never shown: see :meth:`describe`);
    ``ledger_table``: the sinks' ``ledger_table``; ``what``: how an error names the ledger
    table's setting (a command line names its flag)."""

    def __init__(self, conninfo: str, ledger_table: str = DEFAULT_LEDGER_TABLE, *,
                 what: str = "ledger_table") -> None:
        self.conninfo = Conninfo(conninfo)
        self.table = TableName.parse(ledger_table, what=what, reserve=LEDGER_NAME_RESERVE)
        self._db = DriverConnection(self.conninfo, 10, "operator")

    def describe(self) -> str:
        """The database and the ledger table for humans, secrets redacted."""
        return f"postgres {self.conninfo.redacted()} ledger {self.table}"

    def _rows(self, query: Any, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._db.lock:
            try:
                return list(self._db.get().execute(query, params).fetchall())
            except psycopg.Error as exc:
                raise self._db.error(exc, "reading the sinks' state") from None

    def prepared(self, sink_id: str | None = None) -> list[PreparedTransaction]:
        """The transactions prepared in this database by the sinks (``sink_id``: by that
        sink only); another application's are left out."""
        found = []
        for gid, age in self._rows(
            "SELECT gid, extract(epoch FROM now() - prepared) FROM pg_prepared_xacts "
            "WHERE database = current_database()"
        ):
            tid = transaction_id_of(gid)  # None for another application's gid
            if tid is not None and (sink_id is None or tid.sink_id == sink_id):
                found.append(PreparedTransaction(tid, float(age)))
        return found

    def sink_ids(self) -> list[str]:
        """Every sink id with a binding in the ledger table or a prepared transaction here."""
        names = {p.transaction_id.sink_id for p in self.prepared()}
        exists = self._rows(
            "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s",
            (self.table.schema, self.table.name + "_bindings"),
        )
        if exists:
            names |= {r[0] for r in self._rows(
                sql.SQL("SELECT sink_id FROM {}").format(self.table.sql("_bindings")))}
        return sorted(names)

    def ledger(self, sink_id: str) -> Ledger:
        """The sink's ledger, on a connection of its own; the caller closes it."""
        return PostgresLedger(DriverConnection(self.conninfo, 10, sink_id), self.table,
                              sink_id=sink_id)

    def operator_sink(self, sink_id: str) -> PostgresSink:
        """The sink for settling only (its table is one it refuses to write)."""
        return PostgresSink.operator(self.conninfo.secret, sink_id=sink_id,
                                     ledger_table=(self.table.schema, self.table.name))

    def close(self) -> None:
        """Release the connection."""
        self._db.close()

    def __repr__(self) -> str:
        return f"PostgresAdmin({self.conninfo.redacted()!r}, {str(self.table)!r})"


def conninfo_has_secret(conninfo: str) -> bool:
    """Whether a libpq connection string holds a secret (a password, ``sslpassword``, a
    secret-looking setting in ``options``), in any of its forms (keywords or a URI)."""
    return bool(Conninfo(conninfo).secrets)


def column_values(conninfo: str, table: str, column: str) -> list[Any]:
    """Every value of ``column`` in ``table`` (``"schema.name"`` or ``"name"``), read as a
    downstream reader does: the committed rows, duplicates included."""
    name = TableName.parse(table)
    query = sql.SQL("SELECT {} FROM {}").format(sql.Identifier(column), name.sql())
    with psycopg.connect(conninfo) as conn:
        return [r[0] for r in conn.execute(query).fetchall()]
