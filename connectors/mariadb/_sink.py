"""``MariaDBSink``: exactly-once into MariaDB (and MySQL) with XA branches.

The sink is the template's hooks
(:class:`~connectors.core.templates.families.PreparedTransactionSink`) delegating to one
module per role (``docs/design/mariadb.md``):

- driver, before a batch (:mod:`~connectors.mariadb._tables`): the table is read, created
  or refused;
- executor, once per Spark task (:mod:`~connectors.mariadb._writer`): ``XA START``, the
  rows by ``LOAD DATA LOCAL INFILE``, the strictness check, the receipt, ``XA PREPARE``
  on a connection of the task's own;
- driver, after the template recorded the decision in the ledger
  (:mod:`~connectors.mariadb._committer`): ``XA COMMIT`` for exactly the xids Spark
  returned; recovery lists this sink's branches (``XA RECOVER``) so the sweeps roll back
  everything else;
- the ledger (:mod:`~connectors.mariadb._ledger`), xids (:mod:`~connectors.mariadb._xid`)
  and the configuration (:mod:`~connectors.mariadb._config`).

Operating guide: ``docs/mariadb.md``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from connectors.core.batch import BatchInput
from connectors.core.errors import ConfigurationError
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers.ledger import Ledger, TaskCommit
from connectors.core.templates.families import PreparedTransactionSink
from connectors.core.templates.tasks import TaskTransaction
from connectors.mariadb._committer import Committer
from connectors.mariadb._config import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_LOCK_WAIT_TIMEOUT,
    Address,
    MariaDBOptions,
    Mode,
    TableName,
)
from connectors.mariadb._ledger import DriverConnection, MariaDBLedger
from connectors.mariadb._ledger_sql import LEDGER_NAME_RESERVE
from connectors.mariadb._tables import TablePlan, plan_table
from connectors.mariadb._writer import MariaTxn, TaskWriter

__all__ = ["OPERATOR_TABLE", "MariaDBSink"]

#: The table of :meth:`MariaDBSink.operator`'s instances (never read nor written).
OPERATOR_TABLE = "connectors_operator_no_table"


def _key_columns(keys: str | Iterable[str] | None) -> tuple[str, ...]:
    """One string is one column; each name as in the table, none twice."""
    names = () if keys is None else (keys,) if isinstance(keys, str) else tuple(keys)
    if any(not isinstance(n, str) or not n for n in names) or len(set(names)) != len(names):
        raise ConfigurationError(f"key_columns must be distinct column names, got {keys!r}")
    return names


class MariaDBSink(PreparedTransactionSink[MariaTxn]):
    """Exactly-once sink into a MariaDB (or MySQL) table, for ``foreachBatch`` and batch
    jobs.

    Args:
        address: ``"mariadb://user:password@host:3306/database"`` (TLS files as query
            options: ``?ssl_ca=/path/ca.pem``); the password appears in no log, repr or
            error. Tasks and the driver connect with it; the driver commits the tasks'
            prepared branches, so it must be the same user.
        table: ``"table"`` (in the address's database) or ``"database.table"``.
        sink_id: the sink's stable name (1-40 characters of ``A-Za-z0-9_-``).
        mode: ``"append"`` (``LOAD DATA LOCAL INFILE``) or ``"upsert"`` (one row per key:
            the greatest row by value; loaded into a temporary table in the task's branch,
            then ``INSERT ... SELECT ... ON DUPLICATE KEY UPDATE``; the user needs the
            ``CREATE TEMPORARY TABLES`` privilege) or ``"changes"``: a change stream
            (inserts, updates, deletes), each row one change with the full row image; per
            key the last change by ``sequence_column`` is applied, ties broken by the other
            columns (the greatest row wins) and a delete beats an upsert on a tie: an upsert
            as in ``"upsert"``, a delete by the key alone (``DELETE ... JOIN`` a temporary
            table of the deleted keys; the delete's other columns may be NULL, even for
            ``NOT NULL`` columns). Every row of a key goes to one task.
        key_columns: the upsert's (or change's) key: a primary key or unique index of the
            table must cover exactly these columns (checked before every batch; one string
            is one column).
        op_column: ``mode="changes"`` only: the column of each change's operation, a
            string (Debezium's ``c``/``r``/``u``/``d``, or ``insert``/``update``/
            ``upsert``/``delete``, any case) or a boolean deleted flag (true: delete).
            NULL or any other value fails the batch with a ``BadInputError``, nothing
            committed. Written into the table only if it has a column of this name.
        sequence_column: ``mode="changes"`` only: the column ordering the changes of a key
            (integer, decimal, timestamp, date, time or string; never NULL). Written into
            the table only if it has a column of this name (``create_table`` creates it, not
            the op column).
        create_table: create the table from the batch's schema if it does not exist.
        ledger_table: where the ledger tables live (default ``eos_ledger`` in the
            address's database); the ledger appends up to 9 characters to the name.
        lock_wait_timeout: seconds a task waits on a row lock (default 30).
        connect_timeout: seconds.
        **options: the template's options (``retry``, ``reset_binding``,
            ``on_replay_mismatch``, ``keep_batches``, ``values_in_errors``).

    Example (``mariadb_url``: ``"mariadb://user:password@host:3306/database"``)::

        sink = MariaDBSink(mariadb_url, "users", sink_id=sink_id, mode="upsert",
                           key_columns=["user_id"], create_table=True)
        query = df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()
    """

    def __init__(
        self,
        address: str,
        table: str,
        *,
        sink_id: str,
        mode: Mode = "append",
        key_columns: str | Iterable[str] | None = None,
        op_column: str | None = None,
        sequence_column: str | None = None,
        create_table: bool = False,
        ledger_table: str = "eos_ledger",
        lock_wait_timeout: int = DEFAULT_LOCK_WAIT_TIMEOUT,
        connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
        **options: Any,
    ) -> None:
        super().__init__(sink_id=sink_id, **options)
        self.address = Address(address)
        self.options = MariaDBOptions(
            table=TableName.parse(table, self.address.database),
            ledger_table=TableName.parse(ledger_table, self.address.database,
                                         what="ledger_table", reserve=LEDGER_NAME_RESERVE),
            mode=mode, key_columns=_key_columns(key_columns), create_table=bool(create_table),
            lock_wait_timeout=lock_wait_timeout,
            connect_timeout=connect_timeout, op_column=op_column,
            sequence_column=sequence_column)
        self._plan: TablePlan | None = None
        self._operator_only = False
        self._db: DriverConnection | None = None
        #: The task side: settings only (every hook of a task uses it).
        self._tasks = TaskWriter(self.address, self.options, self.sink_id,
                                 self.values_in_errors)

    @classmethod
    def operator(cls, address: str, *, sink_id: str, ledger_table: str) -> MariaDBSink:
        """An instance for the operator tools (``connectors recover``): it settles the
        sink's prepared branches through its ledger, and refuses to write."""
        sink = cls(address, OPERATOR_TABLE, sink_id=sink_id, ledger_table=ledger_table)
        sink._operator_only = True
        return sink

    def describe_target(self) -> str:
        """``MariaDB host:port/database`` (no secret), for messages."""
        return f"MariaDB {self.address.where()}"

    def __repr__(self) -> str:
        return (f"MariaDBSink({self.address!r}, {str(self.options.table)!r}, "
                f"sink_id={self.sink_id!r}, mode={self.options.mode!r})")

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_db"] = None  # the driver's connection never travels to executors
        return state

    # ---- the roles, built from the sink's settings ----
    def _driver_db(self) -> DriverConnection:
        if self._db is None:
            self._db = DriverConnection(
                self.address, connect_timeout=self.options.connect_timeout,
                lock_wait_timeout=self.options.lock_wait_timeout, sink_id=self.sink_id,
                values_in_errors=self.values_in_errors)
        return self._db

    def _committer(self) -> Committer:
        return Committer(self._driver_db(), self.options.ledger_table, sink_id=self.sink_id)

    # ---- driver: ledger, validation ----
    def create_ledger(self) -> Ledger:
        return MariaDBLedger(self._driver_db(), self.options.ledger_table, sink_id=self.sink_id)

    def create_ledger_for(self, sink_id: str) -> Ledger:
        """Driver: a fan-out's decisions in this sink's ledger tables, under ``sink_id``."""
        return MariaDBLedger(self._driver_db(), self.options.ledger_table, sink_id=sink_id)

    def validate_input(self, schema: pa.Schema) -> None:
        """Driver: the table exists (or is created) and every column fits."""
        if self._operator_only:
            raise ConfigurationError("an operator's instance of the sink (MariaDBSink."
                                     "operator) settles branches and writes nothing",
                                     sink_id=self.sink_id)
        self._plan = plan_table(self._driver_db(), self.options, schema, sink_id=self.sink_id)

    def partition_input(self, batch: BatchInput) -> BatchInput:
        """Driver: in upsert and changes mode, every row of a key to one task (two branches
        holding the same key would wait on each other's locks until one is committed, and
        a key's last change must be chosen among all of its changes)."""
        if self.options.mode in ("upsert", "changes"):
            return batch.slotted(batch.estimated_partitions() or 1,
                                 list(self.options.key_columns))
        return batch

    # ---- executor side ----
    def begin_transaction(self, txn: TaskTransaction) -> MariaTxn:
        """Executor: connect, ``XA START`` (see :meth:`TaskWriter.begin
        <connectors.mariadb._writer.TaskWriter.begin>`)."""
        if self._plan is None:  # pragma: no cover - validate_input always runs first
            raise ConfigurationError("the sink was not validated on the driver",
                                     sink_id=self.sink_id)
        return self._tasks.begin(txn.transaction_id, self._plan)

    def write(self, handle: MariaTxn, batch: pa.RecordBatch) -> None:
        self._tasks.write(handle, batch)

    def pre_commit(self, handle: MariaTxn, fingerprint: Fingerprint) -> None:
        """Executor: load, check, receipt, ``XA PREPARE`` (see :meth:`TaskWriter.pre_commit
        <connectors.mariadb._writer.TaskWriter.pre_commit>`)."""
        self._tasks.pre_commit(handle, fingerprint)

    def abort_transaction(self, handle: MariaTxn) -> None:
        self._tasks.abort(handle)  # an unprepared branch dies with its session

    # ---- driver side ----
    def commit(self, commit: TaskCommit) -> None:
        self._committer().commit(commit)

    def abort(self, transaction_id: str) -> None:
        self._committer().abort(transaction_id)

    def list_prepared(self) -> Iterable[str]:
        return self._committer().list_prepared()

    def close(self) -> None:
        super().close()
        if self._db is not None:
            self._db.close()
            self._db = None
