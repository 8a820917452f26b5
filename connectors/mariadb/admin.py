"""Operating MariaDBSinks from outside their queries: what they left, their ledgers, settling.

The operator tools (``connectors status``, ``recover``, ``doctor``) read and settle a
MariaDB database through this module, and so can a script. :class:`MariaDBAdmin` is one
database and one ledger table (default ``eos_ledger`` in the address's database), on one
connection of its own (:class:`~connectors.core.driver.operator.PreparedAdmin`):

- :meth:`~MariaDBAdmin.sink_ids`: every sink with a ledger binding there or an XA branch
  prepared there;
- :meth:`~MariaDBAdmin.ledger`: a sink's ledger (decisions, binding), to read;
- :meth:`~MariaDBAdmin.prepared`: the branches the sinks left prepared (``XA RECOVER``,
  its rows decoded into this library's transaction ids by their format id and xid; another
  application's branches are not listed). Their age is ``None``: ``XA RECOVER`` gives
  none, and ``information_schema.INNODB_TRX``, which lists a detached prepared branch
  (``trx_mysql_thread_id`` 0), names no xid, gives when its first write ran (not its
  prepare) and needs the ``PROCESS`` privilege (measured on MariaDB 10.11.19);
- :meth:`~PreparedAdmin.settle <connectors.core.driver.operator.PreparedAdmin.settle>`:
  commit what a ledger decided and roll back the rest through an operator's instance of
  the sink (:meth:`MariaDBSink.operator <connectors.mariadb._sink.MariaDBSink.operator>`),
  with the steps of a driver's start and its ledger's serialization (the sink's row of
  ``<ledger>_bindings``, locked ``FOR UPDATE``): a roll-back first records "this run may
  never decide this batch" under that lock, and a live driver's decision then fails that
  batch (and retries it) instead of committing half of it.

Nothing here shows the password: :meth:`MariaDBAdmin.describe`, ``repr`` and every error
name the server with it masked.

.. example-skip: needs a MariaDB server with prepared branches;
   integration/mariadb/test_mariadb_operator.py runs these calls through the CLI

Example (``url``: ``mariadb://user:password@host:3306/database``)::

    from connectors.mariadb.admin import MariaDBAdmin

    with MariaDBAdmin(url) as db:
        left = [str(p.transaction_id) for p in db.prepared(sink_id)]
        done = db.settle(sink_id, left, commit_decided=True, abort_undecided=True)
        assert not db.prepared(sink_id) and not done.left
"""

from __future__ import annotations

from connectors.core.driver.operator import PreparedAdmin, PreparedTransaction
from connectors.core.ledgers.ledger import Ledger
from connectors.mariadb._config import DEFAULT_CONNECT_TIMEOUT, Address, TableName
from connectors.mariadb._ledger import DriverConnection, MariaDBLedger
from connectors.mariadb._ledger_sql import LEDGER_NAME_RESERVE
from connectors.mariadb._sink import MariaDBSink
from connectors.mariadb._xid import transaction_id_of_row

__all__ = ["DEFAULT_LEDGER_TABLE", "MariaDBAdmin", "PreparedTransaction", "address_has_secret"]

#: The default ledger table of ``MariaDBSink`` (in the address's database).
DEFAULT_LEDGER_TABLE = "eos_ledger"
#: Seconds the operator's statements wait on a row lock (a live driver's holds are short).
LOCK_WAIT_TIMEOUT = 10


class MariaDBAdmin(PreparedAdmin):
    """One database and one ledger table, read and settled on one connection.

    ``url``: the sinks' address, ``mariadb://user:password@host:3306/database`` (never
    shown: see :meth:`describe`); ``ledger_table``: the sinks' ``ledger_table``; ``what``:
    how an error names the ledger table's setting (a command line names its flag)."""

    def __init__(self, url: str, ledger_table: str = DEFAULT_LEDGER_TABLE, *,
                 what: str = "ledger_table") -> None:
        self.address = Address(url)
        self._url = url
        self.table = TableName.parse(ledger_table, self.address.database, what=what,
                                     reserve=LEDGER_NAME_RESERVE)
        self._db = self._connection("operator")

    def _connection(self, sink_id: str) -> DriverConnection:
        return DriverConnection(self.address, connect_timeout=DEFAULT_CONNECT_TIMEOUT,
                                lock_wait_timeout=LOCK_WAIT_TIMEOUT, sink_id=sink_id)

    def describe(self) -> str:
        """The database and the ledger table for humans, the password masked."""
        return f"mariadb {self.address.redacted()} ledger {self.table}"

    def prepared(self, sink_id: str | None = None) -> list[PreparedTransaction]:
        """The branches prepared in this server by the sinks (``sink_id``: by that sink
        only); another application's are left out. Their age is ``None`` (see the module
        docstring)."""
        found = []
        for row in self._db.fetch("listing prepared XA branches", "XA RECOVER"):
            tid = transaction_id_of_row(row)  # None for another application's branch
            if tid is not None and (sink_id is None or tid.sink_id == sink_id):
                found.append(PreparedTransaction(tid, None))
        return found

    def sink_ids(self) -> list[str]:
        """Every sink id with a binding in the ledger table or a branch prepared here."""
        names = {p.transaction_id.sink_id for p in self.prepared()}
        doing = "reading the sinks' bindings"
        if self._db.fetch(doing, "SELECT 1 FROM information_schema.tables WHERE "
                          "table_schema = %s AND table_name = %s",
                          (self.table.database, self.table.name + "_bindings")):
            names |= {str(r[0]) for r in self._db.fetch(
                doing, f"SELECT sink_id FROM {self.table.sql('_bindings')}")}
        return sorted(names)

    def ledger(self, sink_id: str) -> Ledger:
        """The sink's ledger, on a connection of its own; the caller closes it."""
        return MariaDBLedger(self._connection(sink_id), self.table, sink_id=sink_id)

    def operator_sink(self, sink_id: str) -> MariaDBSink:
        """The sink for settling only (it refuses to write)."""
        return MariaDBSink.operator(self._url, sink_id=sink_id, ledger_table=self.table.sql())

    def close(self) -> None:
        """Release the connection."""
        self._db.close()

    def __repr__(self) -> str:
        return f"MariaDBAdmin({self.address.redacted()!r}, {str(self.table)!r})"


def address_has_secret(url: str) -> bool:
    """Whether a sink's address (``mariadb://user:password@...``) holds a password."""
    return bool(Address(url).password)
