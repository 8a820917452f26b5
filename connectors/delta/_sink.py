"""``DeltaSink``: exactly-once appends, overwrites and MERGEs into a Delta table.

Family COMMIT_ON_DRIVER: the driver commits the whole batch as one Delta commit tagged with
``userMetadata`` ``{"connectors": {sink, app, batch, ...}}`` (:mod:`connectors.delta._meta`),
on one of two paths (**tag**, the default; **txn**, Delta's txn id:
:mod:`connectors.delta._table_commits`). The hooks delegate by role: options, the table's
place, its commits (``_table_commits``, ``_history``), what the table holds
(``_table_replay``, ``_replay_fingerprint``), the write (``_writer``, ``_changes``), the checks a
fan-out runs before its decision (``_constraints``), the ledger.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from connectors.core.batch import BatchContext, BatchInput
from connectors.core.errors import ConfigurationError
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers.ledger import Ledger
from connectors.core.metrics import BatchMetrics
from connectors.core.templates.families import DriverCommitSink
from connectors.delta._changes import MergeFunction, validate_changes
from connectors.delta._constraints import ValueChecks
from connectors.delta._meta import CommitTag
from connectors.delta._options import Mode, check_batch, check_changes, check_options
from connectors.delta._table import local_path, read_schema, resolve_table, snapshot_schema
from connectors.delta._table_commits import DeltaPath, TableCommits
from connectors.delta._table_replay import TableReplay
from connectors.delta._txn_seed import seed_txn_lookup
from connectors.delta._writer import DeltaWriter
from connectors.lake.object_ledger import open_ledger
from connectors.lake.store import spark_conf
from connectors.spark.inputs import spark_frame
from connectors.spark.toolkit import observe, spark_fingerprint

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["DeltaSink"]

logger = logging.getLogger(__name__)


class DeltaSink(DriverCommitSink):
    """Exactly-once sink into a Delta table, for ``foreachBatch`` and batch jobs.

    Args:
        path: the table's path (any URI Spark can write); or give ``table``.
        table: a catalog table name (``"db.events"``); its location is resolved once per
            driver run and written by path.
        sink_id: the sink's stable name (1-40 characters of ``A-Za-z0-9_-``). Delta's
            ``txnAppId`` derives from it (``<sink_id>``, then ``<sink_id>.g<n>`` after the
            n-th ``reset_binding``): two sinks writing one table need distinct sink ids.
        merge_on: key columns: MERGE (upsert) each batch on them instead of appending.
            Source rows are deduplicated per key deterministically (the greatest
            ``sequence_column`` wins, then the greatest row by value); keys match
            NULL-safely (``<=>``).
        sequence_column: with ``merge_on``: the column ordering a key's changes (a CDC
            sequence number, LSN, timestamp): per key the batch's change with the
            greatest value wins (NULL lowest; ties: the greatest row by value).
        delete_when, update_when, insert_when: with ``merge_on``: SQL conditions over the
            source row ``s`` (the key's winning change) and the target row ``t``. A
            matched row is deleted where ``delete_when`` holds, else updated where
            ``update_when`` holds (default: always); a key the table lacks is inserted
            unless ``delete_when`` holds (a delete of an unknown key inserts nothing) and
            where ``insert_when`` holds. ``delete_when`` and ``insert_when`` see ``s`` only,
            ``update_when`` ``s`` and ``t`` (e.g. ``"s.seq > t.seq"``). NULL counts as false.
        exclude_columns: with a MERGE: batch columns the table does not store (control
            columns such as ``op``): the conditions see them, the update and insert write
            every other column by name, and ``create_table`` leaves them out.
        merge: a function ``(target DeltaTable, source DataFrame) -> DeltaMergeBuilder``
            (``target.alias("t").merge(source.alias("s"), ...).when...()``, not executed):
            the sink executes it inside its idempotent commit. ``source`` is the batch,
            deduplicated per ``merge_on`` key when given; use it unchanged as the MERGE's
            source (its row count is a replay's check). Classic PySpark only.
        mode: ``"append"`` (default) or ``"overwrite"`` (each batch replaces the table);
            not with a MERGE.
        replace_where: with ``mode="overwrite"``: replace only the rows matching this SQL
            predicate (Delta's ``replaceWhere``); a batch row outside it fails the batch
            with :class:`~connectors.core.errors.BadInputError` and commits nothing.
        partition_overwrite_mode: with ``mode="overwrite"``: ``"dynamic"`` replaces only
            the partitions the batch holds (Delta's ``partitionOverwriteMode``; needs
            ``partition_by``), ``"static"`` the whole table (or ``replace_where``).
        merge_schema: let a batch add columns to the table (Delta's ``mergeSchema`` /
            MERGE schema evolution). Without it, a batch whose columns do not fit raises
            :class:`~connectors.core.errors.BadInputError` naming them.
        create_table: create the table from the first batch's schema if it is missing;
            without it a missing table is an error.
        partition_by: partition columns used when the sink creates the table.
        ledger_path: a POSIX directory for the sink's ledger. Default: beside the table,
            ``<table location>/_connectors/<sink_id>``, as files on a local file system or
            as objects written with conditional writes on S3, GCS and Azure (nothing else
            to provide: ``docs/delta.md``, "Object stores"); required elsewhere (``hdfs:``).
        storage_options: for a table on an object store: the ledger client's settings by
            delta-rs's names (``AWS_ENDPOINT_URL``, ``AZURE_STORAGE_ACCOUNT_KEY``, ...), over
            the session's ``spark.hadoop.fs.s3a.*`` confs and the store's environment
            variables. Never logged nor shown in the repr.
        verify_replay: compare a replayed batch with what its commit wrote (default true):
            an append's replay with the rows of the files its commit added (read back only
            on a replay, so nothing is hashed while writing), a MERGE's with the fingerprint
            observed while it ran. See ``docs/delta.md``.
        delta_txn_id: also write Delta's own txn id (``txnAppId``/``txnVersion``) with
            every commit (default false). Delta then skips a replayed version itself and
            fails a concurrent commit of the same app id, at a price: Delta 4.4 looks the
            version up with a state reconstruction on every commit (~2x a plain append),
            unless ``txn_seed`` applies. Without it (the "tag" path) the commit carries only
            the sink's ``userMetadata`` tag; the ledger's intent records, the table's
            history and the ledger's lease make it exactly-once (``docs/delta.md``).
        txn_seed: with ``delta_txn_id``: answer Delta's txn lookup from the commit's
            checksum through Delta's private classes (:mod:`connectors.delta._txn_seed`).
            ``None`` (default): wherever the classes are byte-for-byte the verified Delta
            4.4.0 ones; ``False``: never. ``CONNECTORS_ACCELERATORS=off`` turns it off
            whatever this says. Without it the sink logs one WARNING naming the cost.
        **options: the template's options (``retry``, ``reset_binding``,
            ``on_replay_mismatch``, ``keep_batches``, ``values_in_errors``: without it an
            error never quotes Delta's message about a row, only its condition, table,
            column and constraint).

    Example::

        from connectors.delta import DeltaSink

        sink = DeltaSink(f"{path}/events", sink_id="events-delta", create_table=True)
        query = df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()
        upsert = DeltaSink(table="lake.users", sink_id="users", merge_on=["user_id"])

    A transaction id Delta forgot (``delta.setTransactionRetentionDuration``) is detected
    when a run starts: a batch the sink can no longer prove uncommitted is refused.
    """

    #: No separate fingerprint job before a write: a MERGE's fingerprint is observed inside
    #: its own job (``DataFrame.observe``); an append's is recomputed from its commit's files
    #: only when the batch is replayed (:meth:`committed_fingerprint`).
    fingerprint_in_commit: ClassVar[bool] = True
    def __init__(
        self,
        path: str | None = None,
        *,
        sink_id: str,
        table: str | None = None,
        merge_on: Iterable[str] | None = None,
        mode: Mode = "append",
        sequence_column: str | None = None,
        delete_when: str | None = None,
        update_when: str | None = None,
        insert_when: str | None = None,
        exclude_columns: Iterable[str] | None = None,
        merge: MergeFunction | None = None,
        replace_where: str | None = None,
        partition_overwrite_mode: str | None = None,
        merge_schema: bool = False,
        create_table: bool = False,
        partition_by: Iterable[str] | None = None,
        ledger_path: str | None = None,
        storage_options: dict[str, str] | None = None,
        verify_replay: bool = True,
        delta_txn_id: bool = False,
        txn_seed: bool | None = None,
        **options: Any,
    ) -> None:
        super().__init__(sink_id=sink_id, **options)
        keys = check_options(
            self.sink_id, path=path, table=table, merge_on=merge_on, mode=mode,
            ledger_path=ledger_path, delta_txn_id=delta_txn_id, txn_seed=txn_seed,
        )
        self.path = path
        self.table = table
        self.merge_on = keys
        self.mode: Mode = mode
        self.merge_schema = bool(merge_schema)
        self.create_table = bool(create_table)
        self.partition_by = tuple(partition_by or ())
        self.changes = check_changes(
            self.sink_id, merge_on=keys, mode=mode, merge=merge,
            sequence_column=sequence_column, delete_when=delete_when,
            update_when=update_when, insert_when=insert_when,
            exclude_columns=exclude_columns, replace_where=replace_where,
            partition_overwrite_mode=partition_overwrite_mode, partition_by=self.partition_by)
        self.replace_where = replace_where
        self.partition_overwrite_mode = partition_overwrite_mode
        self.ledger_path = ledger_path
        self.storage_options = dict(storage_options or {})
        self.verify_replay = bool(verify_replay)
        self.delta_txn_id = bool(delta_txn_id)
        self.txn_seed = txn_seed
        self._reset_driver_side()

    def _reset_driver_side(self) -> None:  # driver-only state, never pickled
        self._spark: SparkSession | None = None  # the run's session (begin_run)
        self._write_ms: float | None = None  # the last batch's Delta write, for its metrics
        self._location: str | None = None
        self._schema: StructType | None = None
        self._values = ValueChecks()  # a fan-out's checks of the batch's values
        self._batch_path: DeltaPath | None = None  # the path the last commit took
        self._commits = TableCommits(self.sink_id, delta_txn_id=self.delta_txn_id,
                                         txn_seed=self.txn_seed)
        self._commits.storage_options = self.storage_options  # Spark Connect reads

    def describe_target(self) -> str:  # for messages
        return f"the Delta table {self.table or self.path}"

    def __repr__(self) -> str:
        target = f"{self.path!r}" if self.path is not None else f"table={self.table!r}"
        merge = f", merge_on={list(self.merge_on)!r}" if self.merge_on else ""
        merge += ", merge=<function>" if self.changes.merge is not None else ""
        return f"DeltaSink({target}, sink_id={self.sink_id!r}{merge})"

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_spark": None, "_schema": None, "_batch_path": None}

    # ---- a run's start: the session and the table's location, from its first batch ----
    def begin_run(self, ctx: BatchContext) -> None:
        """Driver, a run's start, before its ledger opens: the run's Spark session and the
        table's location (a catalog table resolved, or created); what an earlier run
        believed of the table is dropped (a failed commit's outcome is the log's)."""
        df = self._frame(ctx.batch)
        self._spark = df.sparkSession
        if self.table is not None and self._location is None:
            self._location = resolve_table(df, self.table, create_table=self.create_table,
                                           partition_by=self.partition_by,
                                           sink_id=self.sink_id)
        self._schema = None
        self._commits.forget()

    def _frame(self, batch: BatchInput | None) -> DataFrame:
        df: DataFrame | None = spark_frame(batch) if batch is not None else None
        if df is None:
            raise ConfigurationError("DeltaSink writes Spark DataFrames: call it from "
                                     "foreachBatch or as sink(df, batch_id)", sink_id=self.sink_id)
        return df

    def record_intent(self, ctx: BatchContext) -> None:  # the tag path's intent
        self._commits.record_intent(self._session, ctx)

    def report_metrics(self, metrics: BatchMetrics) -> None:
        """Delta's own write time, the commit path, the ledger's object-store requests."""
        if self._write_ms is not None:  # Delta's own write (the rest is the sink's)
            metrics.extra["write_ms"] = round(self._write_ms, 1)
        if self._batch_path is not None:
            metrics.extra[f"delta_path_{self._batch_path}"], metrics.path = 1, self._batch_path
        self._commits.report(metrics)
        self._write_ms = self._batch_path = None  # the next batch may be a replay

    def close(self) -> None:
        super().close()
        self._schema = self._location = None
        self._commits.close()

    @property
    def _session(self) -> SparkSession:  # driver hooks run after begin_run only
        if self._spark is None:  # pragma: no cover
            raise ConfigurationError("no run in progress", sink_id=self.sink_id)
        return self._spark

    # ---- where the table is ----
    def location(self) -> str:
        """The table's location (resolved once; for a catalog table, through the catalog
        when a run starts)."""
        if self._location is None:
            if self.path is None:
                raise ConfigurationError(f"table {self.table}: its location is known once "
                                         "the sink has run a batch", sink_id=self.sink_id)
            local = local_path(self.path)
            self._location = str(local) if local is not None else self.path
        return self._location

    # ---- the ledger ----
    def create_ledger(self) -> Ledger:
        """Driver, once per driver run: the ledger (in ``ledger_path``, else beside the
        table; :func:`~connectors.lake.object_ledger.open_ledger`)."""
        ledger = open_ledger(self.ledger_path, self.location, self.sink_id,
                             conf=spark_conf(self._session), options=self.storage_options,
                             probe=self._probe)
        self._commits.ledger = ledger
        return ledger

    def create_ledger_for(self, sink_id: str) -> Ledger:
        """Driver: a fan-out's decisions beside this sink's ledger, as ``<sink_id>`` in the
        same directory (``connectors status`` lists both); no table to probe."""
        path = self.ledger_path and f"{self.ledger_path.rstrip('/').rpartition('/')[0]}/{sink_id}"
        return open_ledger(path, self.location, sink_id, conf=spark_conf(self._session),
                           options=self.storage_options, probe=lambda _app_id: None)

    def _probe(self, app_id: str) -> int | None:
        """The ledger is empty: the table's last batch of ``app_id`` (TableCommits.probe)."""
        return self._commits.probe(self._session, self.location(), app_id)

    # ---- what the table holds (TableReplay answers) ----
    def _table_replay(self, ctx: BatchContext) -> TableReplay:
        df = spark_frame(ctx.batch) if ctx.batch is not None else None
        return TableReplay(self.sink_id, self.changes, self.verify_replay,
                           self.on_replay_mismatch, self._commits, self._session,
                           self.location(), df)

    def is_committed(self, ctx: BatchContext) -> bool:
        """Driver: does the table hold the batch's commit (:class:`TableReplay`)?"""
        return self._table_replay(ctx).is_committed(ctx)

    def committed_fingerprint(self, ctx: BatchContext) -> Fingerprint | None:
        """Driver: the fingerprint of the rows a recorded batch's commit added, or
        ``None`` where only counts compare (:class:`TableReplay`)."""
        return self._table_replay(ctx).committed_fingerprint(ctx)

    # ---- hooks ----
    def plan_input(self, batch: BatchInput, ctx: BatchContext) -> BatchInput:
        """Driver, before a fresh write: the table exists (or will be created) and the
        batch's columns fit it (names, types, NOT NULL columns, merge keys)."""
        df = self._frame(batch)
        check_batch(
            self.changes.table_df(df).schema, self._table_schema(),
            refresh=lambda: self._table_schema(refresh=True), location=self.location,
            merge_schema=self.merge_schema, merge_on=self.merge_on, sink_id=self.sink_id,
        )
        if self.changes.merges:  # the options' columns, the conditions (no Spark job)
            validate_changes(self.changes, df, self._schema, sink_id=self.sink_id)
        return super().plan_input(batch, ctx)

    def check_input(self, batch: BatchInput, ctx: BatchContext) -> None:
        """Driver, a fan-out before its decision: what Delta's writer would refuse in its
        commit (:class:`~connectors.delta._constraints.ValueChecks`); not for MERGEs."""
        if not self.changes.merges and self._schema is not None:
            self._values.run(self._session, self.changes.table_df(self._frame(batch)),
                             self._schema, self.location(), sink_id=self.sink_id,
                             batch_id=ctx.batch_id)

    def _table_schema(self, *, refresh: bool = False) -> StructType | None:
        if self._schema is not None and not refresh:
            return self._schema
        schema = read_schema(self._session, self.location,
                             create_table=self.create_table, sink_id=self.sink_id)
        if schema is not None:
            self._schema = schema
        return schema

    def fingerprint_input(self, batch: BatchInput) -> Fingerprint | None:
        """Driver, on a replay of a recorded batch only: the fingerprint computed as one
        Spark job, to compare (a fresh write observes it inside its own job instead:
        :attr:`fingerprint_in_commit`)."""
        df = spark_frame(batch) if self.verify_replay else None
        return None if df is None else spark_fingerprint(df)

    def commit_batch(self, batch: BatchInput, ctx: BatchContext) -> Fingerprint | None:
        """Driver: the batch as one Delta commit tagged ``(ctx.app_id, ctx.batch_id)``.

        Steps (after the coordinator's ``RecordIntent``): 1. tag path: a retry in this
        process first asks the history whether the failed attempt landed; 2. a MERGE
        observes its fingerprint in its own job; 3. the write (:class:`~connectors.delta.
        _writer.DeltaWriter`); 4. the committed version kept locally, the txn lookup seeded
        (:func:`~connectors.delta._txn_seed.seed_txn_lookup`), the fingerprint returned.
        Calling it again is harmless: the tag path settles an earlier attempt from the
        history first; on the txn path Delta skips a version it holds."""
        df = spark_frame(batch)
        assert df is not None and self._commits.ledger is not None
        session = df.sparkSession
        path = self._commits.choose_path(session)
        tag = CommitTag(self.sink_id, ctx.app_id, ctx.batch_id, ctx.query_id, ctx.run_id)
        if path == "tag" and self._commits.landed_before(session, self.location(), ctx):  # Step 1
            self._batch_path = path
            return None
        writer = DeltaWriter(
            self.location(), self.sink_id, mode=self.mode, changes=self.changes,
            merge_schema=self.merge_schema, partition_by=self.partition_by,
            delta_txn_id=self.delta_txn_id, values_in_errors=self.values_in_errors,
            replace_where=self.replace_where,
            partition_overwrite_mode=self.partition_overwrite_mode,
        )
        if self.changes.merges and self._schema is None:
            writer.create_empty(df)
        # Step 2: only a MERGE is fingerprinted while it runs (its commit holds merged rows,
        # not the batch's); an append's replay is compared with its commit's files instead.
        observed = (
            observe(df, f"connectors_{self.sink_id}_{ctx.batch_id}_{uuid.uuid4().hex[:8]}")
            if self.verify_replay and self.changes.merges else None
        )
        source = observed.df if observed is not None else df
        # Step 3 (an object-store ledger's lease may have lapsed: never commit without it)
        self._commits.ledger.check_lease()
        self._write_ms = writer.write(source, ctx, tag, new_table=self._schema is None)
        self._commits.committed(ctx)  # Step 4; the history is read again for a replay
        self._batch_path = path
        # txn_seed: spare the next batch's write Delta's state reconstruction (_txn_seed).
        if path == "txn_seed" and not seed_txn_lookup(session, self.location(), ctx.app_id,
                                                      ctx.batch_id):
            self._batch_path = "txn"
        if self.merge_schema or self._schema is None:
            # The table may have new columns (or was just created): its schema as of this
            # commit, from Delta's cached snapshot (a read of the table costs a job, ~0.3 s).
            self._schema = snapshot_schema(session, self.location())
        if observed is None:
            return None
        fp = observed.result()
        if fp is None:
            logger.warning("sink %s batch %d: no fingerprint observed (the write was "
                           "skipped?); a replay of it is not checked",
                           self.sink_id, ctx.batch_id)
        return fp
