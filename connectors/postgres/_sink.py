"""``PostgresSink``: exactly-once into PostgreSQL with prepared transactions (XA style).

The sink is the template's hooks
(:class:`~connectors.core.templates.families.PreparedTransactionSink`) delegating to one
module per role:

- driver, before a batch (:mod:`~connectors.postgres._validation`): the table is read,
  created or refused, and the write planned; ``max_prepared_transactions`` is checked;
- executor, once per Spark task (:mod:`~connectors.postgres._writer`): ``BEGIN``, COPY (or
  upsert), the receipt and ``PREPARE TRANSACTION '<gid>'`` in plain SQL on a connection
  of this Python worker;
- driver, after the template recorded the decision in the ledger
  (:mod:`~connectors.postgres._committer`): ``COMMIT PREPARED`` for exactly the ids Spark
  returned; recovery lists this sink's prepared transactions so the sweeps roll back
  everything else;
- the ledger (:mod:`~connectors.postgres._ledger`), gids (:mod:`~connectors.postgres._gid`)
  and the configuration (:mod:`~connectors.postgres._config`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar, cast

import psycopg
import pyarrow as pa

from connectors.core.batch import BatchInput
from connectors.core.errors import ConfigurationError
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers.ledger import Ledger, TaskCommit
from connectors.core.templates.families import PreparedTransactionSink
from connectors.core.templates.options import Options
from connectors.core.templates.tasks import TaskTransaction
from connectors.postgres._committer import Committer
from connectors.postgres._config import Conninfo, Mode, PostgresOptions, TableName
from connectors.postgres._ledger import DriverConnection, PostgresLedger
from connectors.postgres._ledger_sql import LEDGER_NAME_RESERVE
from connectors.postgres._names import key_column_names
from connectors.postgres._types import WritePlan
from connectors.postgres._validation import OPERATOR_TABLE, check_max_prepared, plan_table
from connectors.postgres._writer import PgTxn, TaskWriter

__all__ = ["PostgresSink"]


class PostgresSink(PreparedTransactionSink[PgTxn]):
    """Exactly-once sink into a PostgreSQL table, for ``foreachBatch`` and batch jobs.

    Args:
        conninfo: libpq connection string (no secret of it, ``password``, ``sslpassword``
            or any other, appears in logs, reprs or errors: :class:`Conninfo`). Tasks
            and the driver connect with it; prepared transactions are committed by the
            driver, so it must be the same role (or a superuser).
        table: ``"schema.table"``, ``"table"`` (schema ``public``) or a tuple
            ``(schema, table)``. Names are taken as written (case kept, always quoted:
            no SQL is ever built from them); a part holding a dot is double-quoted
            (``'"my.schema"."Events"'``) or given as a tuple. Names above 63 bytes are
            refused (PostgreSQL would truncate them); see :mod:`connectors.postgres._names`.
        sink_id: the sink's stable name (1-40 characters of ``A-Za-z0-9_-``).
        mode: ``"append"`` (binary COPY), ``"upsert"`` (``INSERT ... ON CONFLICT (keys)
            DO UPDATE``; rows of one key are routed to one task and deduplicated
            deterministically: the greatest row by value wins) or ``"changes"`` (a change
            stream: each row is an insert, update or delete of its key carrying the full
            row image; per key the last change by ``sequence_column`` is applied, a delete
            as ``DELETE`` of the key, anything else as an upsert; see docs/postgres.md,
            "Change streams").
        key_columns: the upsert or change key (a unique index or primary key of the
            table must cover exactly them; checked before every batch); exact column names
            (one string is one column).
        op_column: ``mode="changes"`` only: the column of each change's operation, a
            string (Debezium's ``"c"``, ``"r"``, ``"u"`` upsert and ``"d"`` delete, or
            ``"insert"``, ``"update"``, ``"upsert"``, ``"delete"``; any case) or a boolean
            (true: deleted). Any other value, ``NULL`` included, fails the batch
            (:class:`~connectors.core.errors.BadInputError`; nothing is committed). Written
            into the table only when the table has a column of that name.
        sequence_column: ``mode="changes"`` only: the column that orders the changes of a
            key (an integer, decimal, timestamp, date, time or string column, never
            ``NULL``; ties are broken by the batch's other columns in their order, then
            by the operation: the greatest row wins, a delete beats an upsert).
            Written only when the table has a column of that name; ``create_table``
            creates it (and not the op column). Across batches, a later batch's change
            wins: the stream must deliver each key's changes in order (as Debezium does).
        create_table: create the table from the batch's schema if it does not exist.
        ledger_table: where the ledger tables live (default ``public.eos_ledger``), named
            like ``table``; the ledger appends up to 15 bytes (``_receipts_batch``) to the
            name, so it may have 48 bytes at most.
        lock_timeout: PostgreSQL ``lock_timeout`` in tasks (default ``"30s"``).
        connect_timeout: seconds.
        reuse_connections: keep a task's connection open after its ``PREPARE`` for the
            next task of the same Spark Python worker (default ``True``; connecting costs
            more than a small batch's write). Only an idle session is reused; idle
            connections are closed after 60 s.
        **options: the template's options (``retry``, ``reset_binding``,
            ``on_replay_mismatch``, ``keep_batches``, ``values_in_errors``: by default
            errors name table, column, constraint and type but quote no row value, not
            even PostgreSQL's ``DETAIL: Failing row contains (...)``).

    Example::

        sink = PostgresSink(conninfo, "public.events", sink_id="events-pg",
                            create_table=True)
        query = (df.writeStream.foreachBatch(sink)
                 .option("checkpointLocation", ckpt).start())

    Example (a change stream: columns ``id``, ``op``, ``seq`` and the row's others)::

        sink = PostgresSink(conninfo, "public.users", sink_id="users-cdc", mode="changes",
                            key_columns=["id"], op_column="op", sequence_column="seq")

    The server needs ``max_prepared_transactions`` at least the number of tasks of a
    batch (the sink checks and says what to set).
    """

    #: Tasks fingerprint the Arrow batches they write: table rows are mostly numbers,
    #: timestamps and short strings, for which that is cheaper than the JVM's extra
    #: row-hash column (6.6 % faster end to end on the benchmark's rows; long text, bytea
    #: or jsonb values favour the JVM, see docs/postgres.md).
    hash_rows_in_tasks: ClassVar[bool] = True
    #: ``df.writeStream.format("connectors.postgres")`` after ``connectors.register(spark)``
    #: (append mode; see :meth:`from_options` and docs/datasource.md).
    data_source_name: ClassVar[str | None] = "connectors.postgres"

    def __init__(
        self,
        conninfo: str,
        table: str | tuple[str, str],
        *,
        sink_id: str,
        mode: Mode = "append",
        key_columns: str | Iterable[str] | None = None,
        create_table: bool = False,
        ledger_table: str | tuple[str, str] = "public.eos_ledger",
        lock_timeout: str = "30s",
        connect_timeout: int = 10,
        reuse_connections: bool = True,
        op_column: str | None = None,
        sequence_column: str | None = None,
        **options: Any,
    ) -> None:
        super().__init__(sink_id=sink_id, **options)
        self.conninfo = Conninfo(conninfo)
        self.options = PostgresOptions(
            table=TableName.parse(table),
            mode=mode,
            key_columns=key_column_names(key_columns),
            create_table=bool(create_table),
            ledger_table=TableName.parse(ledger_table, what="ledger_table",
                                         reserve=LEDGER_NAME_RESERVE),
            lock_timeout=lock_timeout,
            connect_timeout=connect_timeout,
            reuse_connections=bool(reuse_connections),
            op_column=op_column,
            sequence_column=sequence_column,
        )
        self._plan: WritePlan | None = None
        self._db: DriverConnection | None = None
        self._checked_prepared = 0
        #: The task side: settings only, built once (every hook of a task uses it).
        self._tasks = TaskWriter(self.conninfo, self.options, self.sink_id,
                                 self.values_in_errors)

    @classmethod
    def operator(
        cls,
        conninfo: str,
        *,
        sink_id: str,
        ledger_table: str | tuple[str, str] = "public.eos_ledger",
    ) -> PostgresSink:
        """An instance for the operator tools (``connectors recover``): it can settle the
        sink's prepared transactions through its ledger, and refuses to write."""
        return cls(conninfo, OPERATOR_TABLE, sink_id=sink_id, ledger_table=ledger_table)

    @classmethod
    def from_options(cls, options: Options) -> PostgresSink:
        """The DataSource form's sink (``format("connectors.postgres")``): the options are
        this class's keyword arguments as text (``conninfo``, ``table``, ``sink_id``,
        ``mode``, ``key_columns`` as ``"id, region"``, ``create_table``, ...), plus
        ``password``, which keeps the password out of ``conninfo``."""
        conninfo = options.text("conninfo")
        password = options.optional("password")
        if password is not None:
            Conninfo(conninfo)  # refuses a malformed string without quoting it
            conninfo = psycopg.conninfo.make_conninfo(conninfo, password=password)
        return cls(
            conninfo, options.text("table"), sink_id=options.text("sink_id"),
            mode=cast("Mode", options.text("mode", "append")),
            key_columns=options.names("key_columns"),
            create_table=options.flag("create_table"),
            ledger_table=options.text("ledger_table", "public.eos_ledger"),
            lock_timeout=options.text("lock_timeout", "30s"),
            connect_timeout=options.integer("connect_timeout", 10),
            reuse_connections=options.flag("reuse_connections", True),
            op_column=options.optional("op_column"),
            sequence_column=options.optional("sequence_column"),
            **cls.template_options(options),
        )

    def describe_target(self) -> str:
        """``PostgreSQL host:port/dbname`` (no secret), for messages."""
        return f"PostgreSQL {self.conninfo.where()}"

    def __repr__(self) -> str:
        return (
            f"PostgresSink({self.conninfo.redacted()!r}, {str(self.options.table)!r}, "
            f"sink_id={self.sink_id!r}, mode={self.options.mode!r})"
        )

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_db"] = None  # the driver's connection never travels to executors
        return state

    # ---- the roles, built from the sink's settings ----
    def _driver_db(self) -> DriverConnection:
        if self._db is None:
            self._db = DriverConnection(
                self.conninfo, self.options.connect_timeout, self.sink_id,
                self.options.lock_timeout, values_in_errors=self.values_in_errors,
            )
        return self._db

    def _committer(self) -> Committer:
        return Committer(self._driver_db(), self.options.ledger_table, sink_id=self.sink_id)

    # ---- driver: ledger, validation, routing ----
    def create_ledger(self) -> Ledger:
        return PostgresLedger(self._driver_db(), self.options.ledger_table, sink_id=self.sink_id)

    def create_ledger_for(self, sink_id: str) -> Ledger:
        """Driver: a fan-out's decisions in this sink's ledger table, under ``sink_id``."""
        return PostgresLedger(self._driver_db(), self.options.ledger_table, sink_id=sink_id)

    def validate_input(self, schema: pa.Schema) -> None:
        """Driver: the table exists (or is created), every column fits, keys are indexed."""
        self._plan = plan_table(self._driver_db(), self.options, schema, sink_id=self.sink_id)

    def partition_input(self, batch: BatchInput) -> BatchInput:
        """Driver: check ``max_prepared_transactions``; in upsert and changes mode route
        keys (every row of a key to one task)."""
        tasks = batch.estimated_partitions() or 1
        if not (self._checked_prepared and tasks <= self._checked_prepared):
            self._checked_prepared = check_max_prepared(self._driver_db(), tasks,
                                                        sink_id=self.sink_id)
        if self.options.mode in ("upsert", "changes"):
            return batch.slotted(tasks, list(self.options.key_columns))
        return batch

    # ---- executor side ----
    def begin_transaction(self, txn: TaskTransaction) -> PgTxn:
        """Executor: ``BEGIN`` on an idle session of this worker or a new one; start COPY
        (see :meth:`TaskWriter.begin <connectors.postgres._writer.TaskWriter.begin>`)."""
        plan = self._plan
        if plan is None:  # pragma: no cover - validate_input always runs first
            raise ConfigurationError("the sink was not validated on the driver")
        return self._tasks.begin(txn.transaction_id, plan)

    def write(self, handle: PgTxn, batch: pa.RecordBatch) -> None:
        self._tasks.write(handle, batch)

    def pre_commit(self, handle: PgTxn, fingerprint: Fingerprint) -> None:
        """Executor: end the COPY (or upsert), insert the receipt, ``PREPARE TRANSACTION``
        (see :meth:`TaskWriter.pre_commit <connectors.postgres._writer.TaskWriter.pre_commit>`
        for the steps)."""
        self._tasks.pre_commit(handle, fingerprint)

    def abort_transaction(self, handle: PgTxn) -> None:
        TaskWriter.abort(handle)  # an unprepared transaction dies with its session

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
