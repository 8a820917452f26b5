"""``IcebergSink``: exactly-once appends, overwrites and MERGEs into an Apache Iceberg table.

Family COMMIT_ON_DRIVER: the driver commits the whole batch as one Iceberg snapshot tagged
with ``connectors.{sink, app, batch, ...}`` summary properties (:mod:`connectors.iceberg.
_tag`). Before the commit the sink's ledger (beside the table: :mod:`connectors.lake`)
records an intent; a batch with an intent and no decision is settled from the table's
snapshots (:mod:`connectors.iceberg._snapshots`), so a crash, a concurrent writer, a
compaction or a snapshot expiry never writes a batch twice nor loses one
(``docs/design/iceberg.md``). The hooks delegate by role: the table (``_table``), its
snapshots (``_snapshots``), the write (``_writer``; a MERGE's statement: ``connectors.lake.
changes``), the ledger (``connectors.lake``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from connectors.core.batch import BatchContext, BatchInput
from connectors.core.errors import BadInputError, ConfigurationError
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers.ledger import BATCH_JOB_QUERY_ID, Ledger
from connectors.core.metrics import BatchMetrics
from connectors.core.templates.families import DriverCommitSink
from connectors.iceberg._snapshots import TableSnapshots
from connectors.iceberg._table import (
    TableSchema,
    check_columns,
    check_required_values,
    check_spark,
    resolve_table,
)
from connectors.iceberg._tag import SnapshotTag
from connectors.iceberg._writer import IcebergWriter, Mode
from connectors.lake.changes import change_spec, merge_keys
from connectors.lake.ledger import TableLedger
from connectors.lake.object_ledger import TableObjectLedger, open_ledger
from connectors.lake.store import spark_conf
from connectors.spark.inputs import spark_frame
from connectors.spark.toolkit import observe, quoted, require_spark, spark_fingerprint

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["IcebergSink"]

logger = logging.getLogger(__name__)


class IcebergSink(DriverCommitSink):
    """Exactly-once sink into an Apache Iceberg table, for ``foreachBatch`` and batch jobs.

    Args:
        table: the catalog table's name, ``"<catalog>.<namespace>.<table>"``, in an Iceberg
            catalog the session configures (``spark.sql.catalog.<catalog>``; Hadoop, JDBC,
            REST, Hive, Glue: ``docs/iceberg.md``).
        sink_id: the sink's stable name (1-40 characters of ``A-Za-z0-9_-``). Each commit's
            snapshot summary carries it and the batch id (``connectors.sink``,
            ``connectors.app``, ``connectors.batch``): two sinks writing one table need
            distinct sink ids.
        mode: ``"append"`` (default) or ``"overwrite"``: each batch replaces the table, or
            with ``partition_overwrite_mode="dynamic"`` the partitions the batch holds, or
            with ``replace_where`` the rows matching that SQL condition (Iceberg's
            overwrite by filter, which refuses a batch row outside it).
        merge_on: key columns: apply each batch as changes by SQL ``MERGE INTO`` on them
            (NULL-safe equality) instead of appending; one row per key, deterministically
            (the greatest ``sequence_column`` wins, then the greatest row by value).
        sequence_column, delete_when, update_when, insert_when, exclude_columns: with
            ``merge_on``, as DeltaSink's (``docs/delta.md``, "Change streams"): the column
            ordering a key's changes; SQL conditions over the source ``s`` (and for
            ``update_when`` the target ``t``) choosing delete, update or insert; batch
            columns the table does not store (control columns such as ``op``).
        partition_overwrite_mode: with ``mode="overwrite"``: ``"dynamic"`` (see ``mode``)
            or ``"static"`` (default).
        replace_where: with ``mode="overwrite"``: the rows to replace (a SQL condition).
        create_table: create the table from the first batch's schema if it is missing;
            without it a missing table is an error.
        partition_by: partition columns used when the sink creates the table.
        ledger_path: a POSIX directory for the sink's ledger. Default: beside the table,
            ``<table location>/_connectors/<sink_id>``, as files on a local file system or
            as objects (conditional writes) on S3, GCS and Azure. Iceberg reads only the
            files its metadata lists, and its orphan-file removal skips ``_`` directories.
        storage_options: for a table on an object store: the ledger client's settings
            (``AWS_ENDPOINT_URL``, ...) over the session's ``spark.hadoop.fs.s3a.*`` confs.
            Never logged nor shown in the repr.
        verify_replay: compare a replayed batch with what its commit wrote (default true):
            an append's replay with the rows its snapshot added, an overwrite's with the
            fingerprint observed while it ran.
        **options: the template's options (``retry``, ``reset_binding``,
            ``on_replay_mismatch``, ``keep_batches``, ``values_in_errors``).

    .. example-skip: CI's docstring examples run on Spark 4.2, which has no Iceberg runtime;
       integration/iceberg runs the same calls on Spark 4.1 (examples/stream_to_iceberg.py)

    Example::

        from connectors.iceberg import IcebergSink

        sink = IcebergSink("lake.db.events", sink_id="events-iceberg", create_table=True)
        query = df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()

    Runs where Iceberg publishes a Spark runtime (Spark 3.5, 4.0, 4.1); on another Spark the
    constructor raises :class:`~connectors.core.errors.ConfigurationError` naming them.
    """

    #: An append's fingerprint is recomputed from the rows its snapshot added, on a replay
    #: only; an overwrite's is observed inside its own write job: no separate job.
    fingerprint_in_commit: ClassVar[bool] = True

    def __init__(
        self,
        table: str,
        *,
        sink_id: str,
        mode: Mode = "append",
        merge_on: Iterable[str] | None = None,
        sequence_column: str | None = None,
        delete_when: str | None = None,
        update_when: str | None = None,
        insert_when: str | None = None,
        exclude_columns: Iterable[str] | None = None,
        partition_overwrite_mode: str | None = None,
        replace_where: str | None = None,
        create_table: bool = False,
        partition_by: Iterable[str] | None = None,
        ledger_path: str | None = None,
        storage_options: dict[str, str] | None = None,
        verify_replay: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(sink_id=sink_id, **options)
        require_spark("IcebergSink")
        if not isinstance(table, str) or not table.strip():
            raise ConfigurationError("table must be a catalog table name, e.g. "
                                     "'lake.db.events'", sink_id=self.sink_id)
        if mode not in ("append", "overwrite"):
            raise ConfigurationError(f"mode must be 'append' or 'overwrite', not {mode!r}",
                                     sink_id=self.sink_id)
        if partition_overwrite_mode not in (None, "static", "dynamic"):
            raise ConfigurationError("partition_overwrite_mode must be 'static' or "
                                     f"'dynamic', not {partition_overwrite_mode!r}",
                                     sink_id=self.sink_id)
        if mode != "overwrite" and (partition_overwrite_mode or replace_where):
            raise ConfigurationError("partition_overwrite_mode and replace_where go with "
                                     "mode='overwrite'", sink_id=self.sink_id)
        if partition_overwrite_mode == "dynamic" and replace_where:
            raise ConfigurationError("give partition_overwrite_mode='dynamic' or "
                                     "replace_where, not both", sink_id=self.sink_id)
        keys = merge_keys(self.sink_id, merge_on)
        self.changes = change_spec(self.sink_id, merge_on=keys, sequence_column=sequence_column,
                                   delete_when=delete_when, update_when=update_when,
                                   insert_when=insert_when, exclude_columns=exclude_columns)
        if keys and mode != "append":
            raise ConfigurationError("merge_on applies each batch as changes; it cannot be "
                                     "combined with mode='overwrite'", sink_id=self.sink_id)
        check_spark(self.sink_id)  # after the options: they are checked on every Spark
        self.table = table.strip()
        self.mode: Mode = mode
        self.partition_overwrite_mode = partition_overwrite_mode
        self.replace_where = replace_where
        self.create_table = bool(create_table)
        self.partition_by = tuple(partition_by or ())
        self.ledger_path = ledger_path
        self.storage_options = dict(storage_options or {})
        self.verify_replay = bool(verify_replay)
        self._reset_driver_side()

    def _reset_driver_side(self) -> None:  # driver-only state, never pickled
        self._spark: SparkSession | None = None
        self._schema: TableSchema | None = None  # the table's, as this run last read it
        self._location: str | None = None
        self._ledger: TableLedger | TableObjectLedger | None = None
        self._committed: set[tuple[str, int]] = set()  # this driver run's commits
        self._attempted: set[tuple[str, int]] = set()  # commits this process tried
        self._write_ms: float | None = None

    def describe_target(self) -> str:  # for messages
        return f"the Iceberg table {self.table}"

    def __repr__(self) -> str:
        merge = f", merge_on={list(self.changes.merge_on)!r}" if self.changes.merges else ""
        return f"IcebergSink({self.table!r}, sink_id={self.sink_id!r}, mode={self.mode!r}{merge})"

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_spark": None, "_ledger": None}

    # ---- a run's start ----
    def begin_run(self, ctx: BatchContext) -> None:
        """Driver, a run's start, before its ledger opens: the run's session and the
        table's location (created if missing and ``create_table``)."""
        df = self._frame(ctx.batch)
        self._spark = df.sparkSession
        self._schema = TableSchema(self._spark, self.table)
        if self._location is None:
            self._location = resolve_table(self.changes.table_df(df), self.table,
                                           create_table=self.create_table,
                                           partition_by=self.partition_by,
                                           sink_id=self.sink_id)
        self._committed.clear()

    def _frame(self, batch: BatchInput | None) -> DataFrame:
        df: DataFrame | None = spark_frame(batch) if batch is not None else None
        if df is None:
            raise ConfigurationError("IcebergSink writes Spark DataFrames: call it from "
                                     "foreachBatch or as sink(df, batch_id)", sink_id=self.sink_id)
        return df

    @property
    def _session(self) -> SparkSession:
        if self._spark is None:  # pragma: no cover - driver hooks run after begin_run
            raise ConfigurationError("no run in progress", sink_id=self.sink_id)
        return self._spark

    @property
    def _table_schema(self) -> TableSchema:
        if self._schema is None:  # pragma: no cover - driver hooks run after begin_run
            raise ConfigurationError("no run in progress", sink_id=self.sink_id)
        return self._schema

    def location(self) -> str:
        """The table's location, as the catalog gives it (known once a run started)."""
        if self._location is None:
            raise ConfigurationError(f"table {self.table}: its location is known once the "
                                     "sink has run a batch", sink_id=self.sink_id)
        return self._location

    # ---- the ledger ----
    def create_ledger(self) -> Ledger:
        """Driver, once per driver run: the ledger in ``ledger_path``, else beside the
        table (:func:`connectors.lake.object_ledger.open_ledger`)."""
        self._ledger = open_ledger(self.ledger_path, self.location, self.sink_id,
                                   conf=spark_conf(self._session),
                                   options=self.storage_options, probe=self._probe)
        return self._ledger

    def create_ledger_for(self, sink_id: str) -> Ledger:
        """Driver: a fan-out's decisions beside this sink's ledger, as ``<sink_id>``."""
        path = self.ledger_path and f"{self.ledger_path.rstrip('/').rpartition('/')[0]}/{sink_id}"
        return open_ledger(path, self.location, sink_id, conf=spark_conf(self._session),
                           options=self.storage_options, probe=lambda _app_id: None)

    def _probe(self, app_id: str) -> int | None:
        """The ledger is empty: the table's newest batch of ``app_id``, if it has one."""
        return TableSnapshots.read(self._session, self.table).last_batch(app_id)

    # ---- what the table holds ----
    def record_intent(self, ctx: BatchContext) -> None:
        """Before the batch's first attempt: the ledger's intent (durable), so that a crash
        after it is settled from the table's snapshots."""
        assert self._ledger is not None
        self._ledger.intend(ctx.batch_id, ctx.app_id, ctx.run_id)

    def is_committed(self, ctx: BatchContext) -> bool:
        """Driver: does the table hold ``(ctx.app_id, ctx.batch_id)``? Committed by this
        run (kept locally); else no intent: never attempted; else the table's snapshots
        settle it (:meth:`TableSnapshots.settle`)."""
        key = (ctx.app_id, ctx.batch_id)
        if key in self._committed:
            return True
        assert self._ledger is not None
        if self._ledger.intent(ctx.batch_id, ctx.app_id) is None:
            return False
        return self._settle(ctx)

    def _settle(self, ctx: BatchContext) -> bool:
        assert self._ledger is not None
        snapshots = TableSnapshots.read(self._session, self.table)
        found = snapshots.settle(ctx.app_id, ctx.batch_id, sink_id=self.sink_id,
                                 intent=self._ledger.intent_where(ctx.batch_id))
        logger.info("sink %s batch %d: the table's snapshots say %s", self.sink_id,
                    ctx.batch_id, "committed" if found else "not committed")
        if found:
            self._committed.add((ctx.app_id, ctx.batch_id))
        return found

    def committed_fingerprint(self, ctx: BatchContext) -> Fingerprint | None:
        """On the replay of an append the ledger recorded: the fingerprint of the rows its
        snapshot added (an incremental read from its parent), or ``None`` where the
        snapshot was expired or is not an append (logged: only the ledger's record stands)."""
        if not self.verify_replay or ctx.batch is None:
            return None
        df = self._frame(ctx.batch)
        snap = TableSnapshots.read(self._session, self.table).find(ctx.app_id, ctx.batch_id)
        if snap is None or snap.operation != "append":
            logger.warning("sink %s batch %d: its snapshot is %s: the replay is not compared "
                           "with it", self.sink_id, ctx.batch_id,
                           "expired" if snap is None else f"a {snap.operation}")
            return None
        from pyspark.sql import functions as F  # noqa: N812

        reader = self._session.read.format("iceberg")
        if snap.parent_id is None:
            reader = reader.option("versionAsOf", str(snap.snapshot_id))
        else:
            reader = reader.option("start-snapshot-id", str(snap.parent_id)) \
                           .option("end-snapshot-id", str(snap.snapshot_id))
        added = reader.load(self.table)
        return spark_fingerprint(added.select(*[
            F.col(quoted(f.name)).cast(f.dataType).alias(f.name) for f in df.schema.fields]))

    # ---- hooks ----
    def plan_input(self, batch: BatchInput, ctx: BatchContext) -> BatchInput:
        """Driver, before a fresh write (before the intent): the batch's columns fit the
        table (names; its required columns present); a MERGE's keys are in both and its
        conditions resolve (a Spark analysis, no job). Checked against the schema this run
        last read, and a fresh read before any refusal (:class:`TableSchema`)."""
        df = self._frame(batch)
        columns = self.changes.table_df(df).schema

        def check(schema: StructType) -> None:
            check_columns(columns, schema, self.table, merge_on=self.changes.merge_on,
                          sink_id=self.sink_id)
            if self.changes.merges:
                self.changes.validate(df, schema, sink_id=self.sink_id)

        self._table_schema.check(check)
        return super().plan_input(batch, ctx)

    def check_input(self, batch: BatchInput, ctx: BatchContext) -> None:
        """Driver, a fan-out before its decision: no row the commit writes holds a NULL in a
        column the table requires (a MERGE's rows: its source's, but those it deletes), by
        a fresh read of the table's schema."""
        df = self._frame(batch)
        if self.changes.merges:
            df = self.changes.source(df)
            if self.changes.delete_when:
                from pyspark.sql import functions as F  # noqa: N812

                df = df.alias("s").where(
                    F.expr(f"NOT coalesce(({self.changes.delete_when}), false)"))
        check_required_values(self.changes.table_df(df), self._table_schema.read(),
                              self.table, sink_id=self.sink_id, batch_id=ctx.batch_id)

    def fingerprint_input(self, batch: BatchInput) -> Fingerprint | None:
        """Driver, on a replay of a recorded batch only: the batch's fingerprint, one job."""
        df = spark_frame(batch) if self.verify_replay else None
        return None if df is None else spark_fingerprint(df)

    def commit_batch(self, batch: BatchInput, ctx: BatchContext) -> Fingerprint | None:
        """Driver: the batch as one snapshot tagged ``(ctx.app_id, ctx.batch_id)``.

        A retry in this process first asks the table whether the failed attempt landed
        (Iceberg may report a commit whose outcome it does not know); the lease is checked
        right before the write. An overwrite or a MERGE (whose snapshot holds merged rows,
        not the batch's) observes its fingerprint in its own job."""
        df = self._frame(batch)
        key = (ctx.app_id, ctx.batch_id)
        if key in self._attempted and self._settle(ctx):
            logger.warning("sink %s batch %d: an earlier attempt that reported a failure did "
                           "commit (the table's snapshots have it); it is not written again",
                           self.sink_id, ctx.batch_id)
            return None
        self._attempted.add(key)
        tag = SnapshotTag(self.sink_id, ctx.app_id, ctx.batch_id, ctx.query_id or "",
                          ctx.run_id)
        observed = (observe(df, f"connectors_{self.sink_id}_{ctx.batch_id}_"
                                f"{uuid.uuid4().hex[:8]}")
                    if self.verify_replay and (self.mode == "overwrite" or self.changes.merges)
                    else None)
        writer = IcebergWriter(self.table, self.sink_id, mode=self.mode,
                               partition_overwrite_mode=self.partition_overwrite_mode,
                               replace_where=self.replace_where, changes=self.changes)
        assert self._ledger is not None
        self._ledger.check_lease()
        try:
            self._write_ms = writer.write(observed.df if observed is not None else df, tag,
                                          streaming=ctx.query_id not in (None,
                                                                         BATCH_JOB_QUERY_ID))
        except BadInputError:
            self._table_schema.forget()  # the table refused the batch: read it again next
            raise
        self._committed.add(key)
        return observed.result() if observed is not None else None

    def report_metrics(self, metrics: BatchMetrics) -> None:
        """Iceberg's own write time (the rest is the sink's)."""
        if self._write_ms is not None:
            metrics.extra["write_ms"] = round(self._write_ms, 1)
        self._write_ms = None

    def close(self) -> None:
        super().close()
        self._ledger = None
        self._location = None
