"""``DeltaSink``: exactly-once appends, overwrites and MERGEs into a Delta table.

Family COMMIT_ON_DRIVER: the driver commits the whole batch as one Delta commit keyed by
Delta's own transaction identifier, ``(txnAppId, txnVersion) = (app id, batch id)``.
Delta records that pair in the commit (a ``txn`` action) and skips any later write whose
version is at or below the recorded one, so a replayed batch can never be written twice.

Driver side, per batch (the template's ``run_driver_batch`` calls the hooks in this order):
  1. the ledger already records the batch (crash after the commit was recorded): a replay;
     its fingerprint is recomputed (one Spark job, replays only) and compared with the
     recorded one (MERGE) or with that of the rows its commit added, read back from the
     commit's files (append/overwrite: :meth:`committed_fingerprint`);
  2. :meth:`validate_input`: the table exists (or is created), the batch's columns fit;
  3. :meth:`is_committed`: the Delta log (read once per driver run, then kept up to date
     locally) already holds ``(app id, batch id)``: crash between the Delta commit and the
     ledger record; the batch is compared with that commit in the same way (a MERGE by
     its row count, from the commit's ``operationMetrics``) and recorded, not rewritten;
  4. :meth:`commit_batch`: one Delta commit tagged with the txn id and a ``userMetadata``
     tag; a MERGE's fingerprint is observed inside its job (no extra job); an append
     hashes nothing;
  5. the template records the batch in the ledger (with that fingerprint, if any).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal
from urllib.parse import urlparse

from connectors.core.batch import BatchContext, BatchInput
from connectors.core.errors import (
    BadInputError,
    ConfigurationError,
    NonDeterministicReplayError,
)
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledger import BATCH_JOB_QUERY_ID, Ledger
from connectors.core.metrics import BatchMetrics
from connectors.core.spark_batch import has_map
from connectors.core.template import DriverCommitSink
from connectors.delta._errors import translate
from connectors.delta._fingerprint import fingerprint_now, observe
from connectors.delta._ledger import DeltaLedger
from connectors.delta._log import LocalDeltaLog, LogState, jvm_log_state
from connectors.delta._meta import CommitTag, parse_user_metadata
from connectors.delta._replay import Unreadable, committed_fingerprint

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["DeltaSink", "DeltaSinks"]

logger = logging.getLogger("connectors.delta")

Mode = Literal["append", "overwrite"]

#: Session confs through which Delta makes MERGE/UPDATE/DELETE idempotent (delta-io/delta
#: #3934: they are session-wide, so only the query's own session may carry them).
CONF_TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
CONF_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
CONF_TXN_AUTO_RESET = "spark.databricks.delta.write.txnVersion.autoReset.enabled"
CONF_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
_MERGE_CONFS = (CONF_TXN_APP_ID, CONF_TXN_VERSION, CONF_TXN_AUTO_RESET, CONF_USER_METADATA)

#: Serializes MERGEs that run on a session that is not a streaming query's own clone (a
#: batch job's ``sink(df, run_id)``): the txn confs are session-wide there.
_SHARED_SESSION_LOCK = threading.Lock()
_RANK = "__connectors_rank"

# ---- answering Delta's next txnVersion lookup from the commit's checksum ----
#
# Delta 4.4.0 answers ``txnVersion(appId)`` (called by every write that carries
# ``txnAppId``) from ``Snapshot.transactions``, a lazy val computed from ``computedState``:
# a full state-reconstruction job over the log, on every commit, although the snapshot that
# the commit itself installs carries a checksum (``checksumOpt``, incrementally derived by
# the commit, the content of the ``.crc`` file) whose ``setTransactions`` are exactly the
# table's txn ids. Newer Delta answers from that checksum (``setTransactionsIfKnown``,
# ``DELTA_READ_SET_TRANSACTIONS_FROM_CRC``); 4.4.0 has no conf for it. So after each commit
# the sink fills that one lazy val of the post-commit snapshot from its checksum; the next
# batch's transaction starts from the same snapshot object (no commit in between) and skips
# the job. Delta still makes the decision (skip a replay, record the app id for conflict
# detection); only where the set of txn ids comes from changes. It is done only on the exact
# Delta classes this was verified on (SHA-256 of their bytecode) and only when everything
# checks out (below); otherwise nothing is touched and Delta reconstructs the state as before.
_SNAPSHOT_CLASS = "org.apache.spark.sql.delta.Snapshot"
_SEED_CLASSES = {  # Delta 4.4.0 (delta-spark_4.2_2.13-4.4.0.jar)
    "org/apache/spark/sql/delta/Snapshot.class":
        "45b7de65a78da74785908dba3c35de97d8724757f5e6f2fe479d2a00d0ab75f7",
    "org/apache/spark/sql/delta/SnapshotStateManager.class":
        "3429b92d8be569fd14a1b040461dcd517c7aae1df08270e6512134673d7ef882",
}
#: In those classes: ``transactions`` is initialized iff this bit of ``bitmap$0`` is set
#: (``Snapshot.transactions$lzycompute``), and ``SnapshotStateManager.$anonfun$transactions$1``
#: is the ``t => t.appId -> t.version`` of ``transactions`` (the Long boxed as Delta boxes it).
_TRANSACTIONS_BIT = 1 << 19
_RETENTION_KEY = "delta.setTransactionRetentionDuration"
_SEED_LOCK = threading.Lock()
_seed_tools: dict[int, Any] = {}  # id(JVM view) -> _SeedTools, or None if not applicable
_delta_log_classes: dict[int, tuple[Any, Any]] = {}  # id(JVM view) -> (view, DeltaLog class)


class _SeedTools:
    """Reflection handles for one driver JVM (None when its Delta is not the verified one).

    Every handle is looked up once: each py4j round trip costs ~0.15 ms, and the seed runs
    after every commit.
    """

    def __init__(self, jvm: Any, snapshot_class: Any) -> None:
        import hashlib

        loader = snapshot_class.getClassLoader()
        for resource, digest in _SEED_CLASSES.items():
            stream = loader.getResourceAsStream(resource)
            if stream is None:
                raise LookupError(resource)
            try:
                data = bytes(stream.readAllBytes())
            finally:
                stream.close()
            if hashlib.sha256(data).hexdigest() != digest:
                raise LookupError(f"{resource} is not the verified Delta 4.4.0 class")
        self.field = snapshot_class.getDeclaredField("transactions")
        self.field.setAccessible(True)
        unsafe_field = jvm.java.lang.Class.forName("sun.misc.Unsafe").getDeclaredField(
            "theUnsafe")
        unsafe_field.setAccessible(True)
        self.unsafe = unsafe_field.get(None)
        self.bitmap = self.unsafe.objectFieldOffset(snapshot_class.getDeclaredField("bitmap$0"))
        self.pair = getattr(jvm.org.apache.spark.sql.delta.SnapshotStateManager,
                            "$anonfun$transactions$1")
        self.empty_map = getattr(
            getattr(jvm.scala.collection.immutable, "Map$"), "MODULE$").empty()


def _delta_log_class(jvm: Any) -> Any:
    """``DeltaLog``'s py4j class handle, looked up once per JVM (six round trips)."""
    known = _delta_log_classes.get(id(jvm))
    if known is None or known[0] is not jvm:  # (the view is kept: its id is never reused)
        known = _delta_log_classes[id(jvm)] = (jvm, jvm.org.apache.spark.sql.delta.DeltaLog)
    return known[1]


def _seed_txn_lookup(session: SparkSession, location: str, app_id: str, batch_id: int) -> bool:
    """Fill ``transactions`` of the table's post-commit snapshot from its checksum.

    Called right after the commit of ``(app_id, batch_id)``. Returns whether it did; any
    doubt (other Delta classes, no checksum, the checksum without txn ids or without this
    commit's, a txn retention configured, the state already computed) leaves the snapshot
    alone. Never raises. About 20 py4j round trips (3 ms) with one app id on the table.
    """
    jvm = getattr(session, "_jvm", None)
    if jvm is None:  # Spark Connect
        return False
    from py4j.protocol import Py4JError

    try:
        log = _delta_log_class(jvm).forTable(session._jsparkSession, location)
        snapshot = log.unsafeVolatileSnapshot()
        cls = snapshot.getClass()
        if cls.getName() != _SNAPSHOT_CLASS:
            return False
        with _SEED_LOCK:
            key = id(jvm)
            if key not in _seed_tools:
                try:
                    _seed_tools[key] = _SeedTools(jvm, cls)
                except Exception as exc:
                    logger.info("DeltaSink: Delta's txn lookup is not answered from the "
                                "checksum (%s); every commit reconstructs the state", exc)
                    _seed_tools[key] = None
            tools = _seed_tools[key]
        if tools is None:
            return False
        unsafe, offset = tools.unsafe, tools.bitmap
        if unsafe.getIntVolatile(snapshot, offset) & _TRANSACTIONS_BIT:
            return False  # already known
        if snapshot._computedStateTriggered():
            return False  # the state is computed anyway: transactions costs no job
        # With a retention, the reconstruction drops expired ids by the time it runs:
        # keep Delta's own answer there.
        if snapshot.metadata().configuration().contains(_RETENTION_KEY):
            return False
        # No checksum, or one without txn ids (None.get throws): leave it to Delta.
        try:
            txns = snapshot.checksumOpt().get().setTransactions().get()
        except Py4JError:
            return False
        table_txns = tools.empty_map
        it = txns.iterator()
        while it.hasNext():
            table_txns = getattr(table_txns, "$plus")(tools.pair(it.next()))
        try:
            ours = int(table_txns.apply(app_id))
        except Py4JError:  # not in the checksum
            return False
        if ours < batch_id:
            return False  # not the checksum of (or after) this commit
        # Publish: the value first, then the bit with a CAS on the volatile bitmap (a bit of
        # another lazy val set meanwhile is never lost; if ours is, Delta recomputes).
        tools.field.set(snapshot, table_txns)
        for _ in range(8):
            old = unsafe.getIntVolatile(snapshot, offset)
            if old & _TRANSACTIONS_BIT or unsafe.compareAndSwapInt(
                snapshot, offset, old, old | _TRANSACTIONS_BIT
            ):
                return True
        return False
    except Exception as exc:  # an optimisation only: Delta falls back to its own lookup
        logger.debug("DeltaSink: txn lookup not seeded: %s", exc)
        return False


def _snapshot_schema(session: SparkSession, location: str) -> StructType | None:
    """The schema of the table's latest snapshot the driver JVM holds (after a commit of
    this driver: that commit's), or ``None`` (Spark Connect, any error): then the sink
    reads the table when it next needs the schema."""
    jvm = getattr(session, "_jvm", None)
    if jvm is None:
        return None
    try:
        from pyspark.sql.types import StructType

        log = _delta_log_class(jvm).forTable(session._jsparkSession, location)
        return StructType.fromJson(json.loads(log.unsafeVolatileSnapshot().schema().json()))
    except Exception as exc:
        logger.debug("DeltaSink: no snapshot schema (%s); the table is read instead", exc)
        return None


def _local_path(location: str) -> Path | None:
    """A local path for ``location`` (a plain path or ``file:`` URI), else ``None``."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else location).resolve()
    return None


def dedupe_by_key(df: DataFrame, keys: Sequence[str]) -> DataFrame:
    """One row per key, chosen deterministically: the greatest row by value wins.

    Rows are ranked within each key by every other column, descending, NULLs last
    (columns holding maps, which Spark cannot order, by their JSON form); two rows that
    tie on every column are identical, so whichever is kept, the result is the same.
    MERGE then never sees two source rows for one target row.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F  # noqa: N812

    order = []
    for f in df.schema.fields:
        if f.name in keys:
            continue
        col = F.col(f"`{f.name}`")
        order.append((F.to_json(F.struct(col)) if has_map(f.dataType) else col).desc_nulls_last())
    if not order:
        return df.dropDuplicates(list(keys))
    window = Window.partitionBy(*[F.col(f"`{k}`") for k in keys]).orderBy(*order)
    return df.withColumn(_RANK, F.row_number().over(window)).where(F.col(_RANK) == 1).drop(_RANK)


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
            Source rows are deduplicated per key deterministically (the greatest row by
            value wins); keys match NULL-safely (``<=>``).
        mode: ``"append"`` (default) or ``"overwrite"`` (each batch replaces the table);
            not with ``merge_on``.
        merge_schema: let a batch add columns to the table (Delta's ``mergeSchema`` /
            MERGE schema evolution). Without it, a batch whose columns do not fit raises
            :class:`~connectors.core.errors.BadInputError` naming them.
        create_table: create the table from the first batch's schema if it is missing;
            without it a missing table is an error.
        partition_by: partition columns used when the sink creates the table.
        ledger_path: directory of the sink's ledger (binding, recorded batches and their
            fingerprints). Default ``<table location>/_connectors/<sink_id>``; required
            when the table is not on a local (POSIX) file system.
        verify_replay: compare a replayed batch with what its commit wrote (default true):
            an append's replay with the rows of the files its commit added (read back only
            on a replay, so nothing is hashed while writing), a MERGE's with the fingerprint
            observed while it ran. See ``docs/delta.md``.
        **options: the template's options (``retry``, ``reset_binding``,
            ``on_replay_mismatch``, ``keep_batches``).

    Example::

        from connectors.delta import DeltaSink

        sink = DeltaSink(f"{path}/events", sink_id="events-delta", create_table=True)
        query = (df.writeStream.foreachBatch(sink)
                 .option("checkpointLocation", ckpt).start())

        upsert = DeltaSink(table="lake.users", sink_id="users", merge_on=["user_id"])

    Delta forgets transaction ids older than ``delta.setTransactionRetentionDuration`` when
    a table sets it: the sink detects a forgotten id when a run starts and refuses to write
    a batch it can no longer prove uncommitted, rather than write it twice.
    """

    #: No separate fingerprint job before a write: a MERGE's fingerprint is observed inside
    #: its own job (``DataFrame.observe``); an append's is recomputed from its commit's files
    #: only when the batch is replayed (:meth:`committed_fingerprint`).
    fingerprint_in_commit: ClassVar[bool] = True
    #: After each commit, answer the next write's ``txnVersion`` lookup from the commit's
    #: checksum instead of a state reconstruction (Delta 4.4.0 only; see ``docs/delta.md``).
    seed_txn_lookup: ClassVar[bool] = True

    def __init__(
        self,
        path: str | None = None,
        *,
        sink_id: str,
        table: str | None = None,
        merge_on: Iterable[str] | None = None,
        mode: Mode = "append",
        merge_schema: bool = False,
        create_table: bool = False,
        partition_by: Iterable[str] | None = None,
        ledger_path: str | None = None,
        verify_replay: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(sink_id=sink_id, **options)
        if (path is None) == (table is None):
            raise ConfigurationError(
                "give exactly one of path (DeltaSink('/data/events', ...)) or table "
                "(DeltaSink(table='db.events', ...))",
                sink_id=self.sink_id,
            )
        for name, value in (("path", path), ("table", table), ("ledger_path", ledger_path)):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigurationError(f"{name} must be a non-empty string", sink_id=sink_id)
        if isinstance(merge_on, str):
            merge_on = [merge_on]
        keys = tuple(merge_on) if merge_on is not None else ()
        if merge_on is not None and (not keys or not all(isinstance(k, str) and k for k in keys)):
            raise ConfigurationError(
                "merge_on must be a non-empty list of column names, e.g. merge_on=['user_id']",
                sink_id=sink_id,
            )
        if len(set(keys)) != len(keys):
            raise ConfigurationError(f"merge_on repeats a column: {list(keys)}", sink_id=sink_id)
        if mode not in ("append", "overwrite"):
            raise ConfigurationError(
                f"mode must be 'append' or 'overwrite', not {mode!r}", sink_id=sink_id
            )
        if keys and mode != "append":
            raise ConfigurationError(
                "merge_on upserts each batch; it cannot be combined with mode='overwrite'",
                sink_id=sink_id,
            )
        self.path = path
        self.table = table
        self.merge_on = keys
        self.mode: Mode = mode
        self.merge_schema = bool(merge_schema)
        self.create_table = bool(create_table)
        self.partition_by = tuple(partition_by or ())
        self.ledger_path = ledger_path
        self.verify_replay = bool(verify_replay)
        self._reset_driver_side()

    def _reset_driver_side(self) -> None:
        # Driver-only state; never pickled (see __getstate__).
        self._df: DataFrame | None = None
        self._write_ms: float | None = None  # the last batch's Delta write, for its metrics
        self._location: str | None = None
        self._ledger: DeltaLedger | None = None
        self._log: LogState | None = None  # read once per driver run
        self._versions: dict[str, int] = {}  # app id -> last committed batch, kept locally
        self._schema: StructType | None = None
        self._history: dict[str, dict[int, tuple[int, dict[str, str]]]] | None = None

    def __repr__(self) -> str:
        target = f"{self.path!r}" if self.path is not None else f"table={self.table!r}"
        merge = f", merge_on={list(self.merge_on)!r}" if self.merge_on else ""
        return f"DeltaSink({target}, sink_id={self.sink_id!r}{merge})"

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        for key in ("_df", "_ledger", "_log", "_schema", "_history"):
            state[key] = None
        state["_versions"] = {}
        return state

    # ---- the entry point: keep the batch's DataFrame for the hooks ----
    def write_batch(
        self, batch: BatchInput, batch_id: int, *, query_id: str | None = None
    ) -> BatchMetrics:
        df = batch.spark_df
        if df is None:
            raise ConfigurationError(
                "DeltaSink writes Spark DataFrames: call it from foreachBatch or as "
                "sink(df, batch_id)",
                sink_id=self.sink_id,
            )
        self._df, self._write_ms = df, None
        try:
            metrics = super().write_batch(batch, batch_id, query_id=query_id)
            if self._write_ms is not None:  # Delta's own write (the rest is the sink's)
                metrics.extra["write_ms"] = round(self._write_ms, 1)
            return metrics
        except BaseException:
            # The outcome of a failed commit is known only to the log: read it again.
            self._log, self._schema, self._history = None, None, None
            raise
        finally:
            self._df = None

    def close(self) -> None:
        super().close()
        self._log, self._schema, self._history = None, None, None
        self._versions = {}
        self._ledger = None
        self._location = None

    @property
    def _session(self) -> SparkSession:
        if self._df is None:  # pragma: no cover - hooks run inside write_batch only
            raise ConfigurationError("no batch in progress", sink_id=self.sink_id)
        return self._df.sparkSession

    # ---- where the table is ----
    def location(self) -> str:
        """The table's location (resolved once; for a catalog table, through the catalog)."""
        if self._location is None:
            if self.path is not None:
                local = _local_path(self.path)
                self._location = str(local) if local is not None else self.path
            else:
                self._location = self._resolve_table()
        return self._location

    def _resolve_table(self) -> str:
        assert self.table is not None
        session = self._session
        if not session.catalog.tableExists(self.table):
            if not self.create_table:
                raise BadInputError(
                    f"table {self.table} does not exist: create it (CREATE TABLE ... USING "
                    "delta), or pass create_table=True",
                    sink_id=self.sink_id,
                )
            assert self._df is not None
            writer = self._df.limit(0).write.format("delta")
            if self.partition_by:
                writer = writer.partitionBy(*self.partition_by)
            try:
                writer.saveAsTable(self.table)
                logger.info("sink %s: created table %s", self.sink_id, self.table)
            except Exception:
                if not session.catalog.tableExists(self.table):  # not created meanwhile
                    raise
        rows = session.sql(f"DESCRIBE DETAIL {self.table}").select("format", "location").collect()
        if not rows or str(rows[0][0]).lower() != "delta":
            raise BadInputError(
                f"table {self.table} is not a Delta table: DeltaSink writes Delta tables only",
                sink_id=self.sink_id,
            )
        location = str(rows[0][1])
        local = _local_path(location)
        return str(local) if local is not None else location

    # ---- the ledger ----
    def create_ledger(self) -> Ledger:
        """Driver, once per driver run: a :class:`DeltaLedger` next to the table."""
        if self.ledger_path is not None:
            root = Path(self.ledger_path)
        else:
            local = _local_path(self.location())
            if local is None:
                raise ConfigurationError(
                    f"the table at {self.location()} is not on a local file system, so the "
                    "sink cannot keep its ledger next to it: pass ledger_path='/a/local/or/"
                    "shared/posix/dir'",
                    sink_id=self.sink_id,
                )
            root = local / "_connectors" / self.sink_id
        self._ledger = DeltaLedger(root, sink_id=self.sink_id, probe=self._probe)
        return self._ledger

    def _probe(self, app_id: str) -> int | None:
        return self._read_log([app_id]).version(app_id)

    # ---- reading the log (once per run) ----
    def _read_log(self, app_ids: Sequence[str]) -> LogState:
        session = self._session
        try:
            return jvm_log_state(session, self.location(), app_ids)
        except AttributeError:  # Spark Connect: no JVM gateway
            local = _local_path(self.location())
            if local is None:
                raise ConfigurationError(
                    "without a JVM gateway (Spark Connect) the sink reads the Delta log "
                    "itself, which it can only do on a local file system: run it on classic "
                    "Spark, or write to a local table",
                    sink_id=self.sink_id,
                ) from None
            return LocalDeltaLog(local).read()

    def _run_log(self, ctx: BatchContext) -> LogState:
        """The log as read at the start of this driver run (and after any failure)."""
        if self._log is None:
            state = self._read_log([ctx.app_id])
            self._log = state
            self._versions = dict(state.versions)
            self._history = None
            logger.info(
                "sink %s: the Delta table (version %d) records app id %s at batch %s",
                self.sink_id, state.table_version, ctx.app_id, state.version(ctx.app_id),
            )
            if state.retention:
                logger.warning(
                    "sink %s: the table sets %s=%s; Delta forgets a transaction id unused "
                    "for that long: keep every restart of the query shorter than that",
                    self.sink_id, "delta.setTransactionRetentionDuration", state.retention,
                )
        return self._log

    def _tags(self, app_id: str) -> dict[int, tuple[int, dict[str, str]]]:
        """batch id -> (table version, operationMetrics) of the commits tagged by ``app_id``.

        Reads the table's history (one call, then cached until the next failure); used only
        to reconcile after a crash and to settle an expired transaction id.
        """
        if self._history is None:
            self._history = {}
        if app_id not in self._history:
            from delta.tables import DeltaTable

            found: dict[int, tuple[int, dict[str, str]]] = {}
            history = DeltaTable.forPath(self._session, self.location()).history()
            rows = history.where("userMetadata IS NOT NULL").select(
                "version", "userMetadata", "operationMetrics"
            ).collect()
            for row in rows:
                tag = parse_user_metadata(row["userMetadata"])
                if tag is not None and tag.app_id == app_id:
                    found.setdefault(tag.batch_id, (int(row["version"]),
                                                    dict(row["operationMetrics"] or {})))
            self._history[app_id] = found
        return self._history[app_id]

    # ---- hooks ----
    def validate_input(self, schema: pa.Schema) -> None:
        """Driver, before a fresh write: the table exists (or will be created) and the
        batch's columns fit it (names, types, NOT NULL columns, merge keys)."""
        assert self._df is not None
        batch_schema = self._df.schema
        table_schema = self._table_schema(batch_schema)
        if table_schema is not None:
            problems = self._schema_problems(batch_schema, table_schema)
            if problems:
                table_schema = self._table_schema(batch_schema, refresh=True)
                problems = self._schema_problems(batch_schema, table_schema) if table_schema else []
            if problems:
                raise BadInputError(
                    f"the batch does not fit the Delta table at {self.location()}: "
                    + "; ".join(problems)
                    + ". Fix the query's columns"
                    + ("" if self.merge_schema else ", or pass merge_schema=True to add new "
                       "columns to the table"),
                    sink_id=self.sink_id,
                )
        missing_keys = [k for k in self.merge_on if k not in batch_schema.fieldNames()]
        if missing_keys:
            raise BadInputError(
                f"merge_on column(s) {', '.join(missing_keys)} are not in the batch (its "
                f"columns: {', '.join(batch_schema.fieldNames())}): select them, or change "
                "merge_on",
                sink_id=self.sink_id,
            )

    def _table_schema(
        self, batch_schema: StructType, *, refresh: bool = False
    ) -> StructType | None:
        if self._schema is not None and not refresh:
            return self._schema
        from pyspark.errors import AnalysisException

        try:
            self._schema = self._session.read.format("delta").load(self.location()).schema
        except AnalysisException as exc:
            err = translate(exc, doing="reading the table's schema", sink_id=self.sink_id)
            if not isinstance(err, BadInputError):
                raise
            if not self.create_table:
                raise BadInputError(
                    f"there is no Delta table at {self.location()}: create it, or pass "
                    "create_table=True to create it from the first batch",
                    sink_id=self.sink_id,
                ) from None
            return None
        return self._schema

    def _schema_problems(self, batch: StructType, table: StructType) -> list[str]:
        problems = []
        table_fields = {f.name.lower(): f for f in table.fields}
        batch_names = {f.name.lower() for f in batch.fields}
        extra = [f.name for f in batch.fields if f.name.lower() not in table_fields]
        if extra and not self.merge_schema:
            problems.append(f"column(s) {', '.join(extra)} are not in the table")
        for f in batch.fields:
            t = table_fields.get(f.name.lower())
            if t is not None and t.dataType.simpleString() != f.dataType.simpleString():
                problems.append(
                    f"column {f.name} is {f.dataType.simpleString()} in the batch but "
                    f"{t.dataType.simpleString()} in the table (cast it in the query)"
                )
        required = [f.name for f in table.fields
                    if not f.nullable and f.name.lower() not in batch_names]
        if required:
            problems.append(f"NOT NULL column(s) {', '.join(required)} of the table are "
                            "missing from the batch")
        if self.merge_on:
            absent = [k for k in self.merge_on if k.lower() not in table_fields]
            if absent:
                problems.append(f"merge_on column(s) {', '.join(absent)} are not in the table")
        return problems

    def fingerprint_input(self, batch: BatchInput) -> Fingerprint | None:
        """Driver, on a replay of a recorded batch only: the fingerprint computed as one
        Spark job, to compare (a fresh write observes it inside its own job instead:
        :attr:`fingerprint_in_commit`)."""
        if not self.verify_replay or batch.spark_df is None:
            return None
        return fingerprint_now(batch.spark_df)

    def is_committed(self, ctx: BatchContext) -> bool:
        """Driver: does the Delta log hold ``(ctx.app_id, ctx.batch_id)``?

        Answered from the log as read once at the start of the run, kept up to date by
        :meth:`commit_batch`. A transaction id that Delta forgot (expired, or the table
        was restored or recreated) is settled from the table's history, or refused.
        """
        state = self._run_log(ctx)
        version = self._versions.get(ctx.app_id)
        assert self._ledger is not None
        recorded = self._ledger.last_batch_id()
        if recorded is not None and (version is None or version < recorded):
            committed = self._settle_forgotten(ctx, state, version, recorded)
        else:
            committed = version is not None and ctx.batch_id <= version
            if committed:
                if version is not None and version > ctx.batch_id:
                    logger.warning(
                        "sink %s: the table records batch %s of app id %s, beyond batch %d "
                        "being written: another driver runs with this sink id?",
                        self.sink_id, version, ctx.app_id, ctx.batch_id,
                    )
                self._check_reconciled(ctx)
        if committed:
            latest = max(ctx.batch_id, version if version is not None else -1)
            self._versions[ctx.app_id] = latest
        return committed

    def _settle_forgotten(
        self, ctx: BatchContext, state: LogState, version: int | None, recorded: int
    ) -> bool:
        """The ledger records batch ``recorded`` but the log no longer knows it.

        The batch at hand (``recorded + 1`` or later) may have been committed before a crash
        and then forgotten. The history decides when it still holds the commit of
        ``recorded`` (then every later commit is there too); otherwise the sink refuses.
        """
        why = (
            f"the table sets delta.setTransactionRetentionDuration={state.retention} and "
            "the id expired" if state.retention else
            "the table was restored to an older version, recreated or replaced"
        )
        tags = self._tags(ctx.app_id) if state.exists else {}
        if recorded in tags:
            committed = ctx.batch_id in tags
            logger.warning(
                "sink %s: Delta no longer records app id %s (last version %s, the ledger "
                "records batch %d): %s. The table's history still holds batch %d, so batch "
                "%d is %s",
                self.sink_id, ctx.app_id, version, recorded, why, recorded, ctx.batch_id,
                "committed" if committed else "not committed",
            )
            if committed:
                self._check_reconciled(ctx)
            return committed
        raise ConfigurationError(
            f"Delta no longer records the sink's transaction id {ctx.app_id!r} (the table "
            f"says {version}, the sink's ledger records batch {recorded} as committed): {why}. "
            f"The history no longer shows that commit either, so the sink cannot prove that "
            f"batch {ctx.batch_id} was not written and refuses to write it again. Check "
            f"DESCRIBE HISTORY for a commit whose userMetadata names batch {ctx.batch_id}; "
            "then raise delta.setTransactionRetentionDuration (ALTER TABLE ... SET "
            "TBLPROPERTIES) well above the longest stop of the query, and resume with a new "
            "sink_id (and checkpoint) if the batch is missing, or restore the table",
            sink_id=self.sink_id,
            batch_id=ctx.batch_id,
        )

    def committed_fingerprint(self, ctx: BatchContext) -> Fingerprint | None:
        """Driver, on the replay of an append/overwrite batch the ledger recorded: the
        fingerprint of the rows its Delta commit added, read back from that commit's files
        (:mod:`connectors.delta._replay`). Where they cannot be read, the replay's row
        count is compared with the commit's instead, and ``None`` is returned."""
        if self.merge_on or not self.verify_replay or self._df is None:
            return None
        found = self._tags(ctx.app_id).get(ctx.batch_id)
        if found is None:
            logger.warning(
                "sink %s batch %d: the table's history no longer shows the commit of this "
                "batch (log retention?), so its replay is not compared",
                self.sink_id, ctx.batch_id,
            )
            return None
        fp = self._content_of(ctx, found[0])
        if fp is None:
            self._check_count(ctx, found)
        return fp

    def _content_of(self, ctx: BatchContext, version: int) -> Fingerprint | None:
        assert self._df is not None
        try:
            return committed_fingerprint(self._session, self.location(), version,
                                         self._df, _local_path(self.location()))
        except Unreadable as exc:
            logger.warning(
                "sink %s batch %d: %s; the replay is compared by its row count only",
                self.sink_id, ctx.batch_id, exc,
            )
            return None

    def _check_reconciled(self, ctx: BatchContext) -> None:
        """A batch committed to Delta but not recorded: an append's replay must hold the rows
        its commit wrote (a MERGE's: as many source rows)."""
        if not self.verify_replay or self._df is None:
            return
        found = self._tags(ctx.app_id).get(ctx.batch_id)
        if found is None:
            return
        if not self.merge_on:
            committed = self._content_of(ctx, found[0])
            if committed is not None:
                from connectors.core.driver import check_replay

                check_replay(self, ctx.batch_id, committed, fingerprint_now(self._df))
                return
        self._check_count(ctx, found)

    def _check_count(self, ctx: BatchContext, found: tuple[int, dict[str, str]]) -> None:
        assert self._df is not None
        version, metrics = found
        key = "numSourceRows" if self.merge_on else "numOutputRows"
        if key not in metrics:
            return
        committed = int(metrics[key])
        source = dedupe_by_key(self._df, self.merge_on) if self.merge_on else self._df
        actual = source.count()
        if actual == committed:
            return
        err = NonDeterministicReplayError(
            f"replayed batch has {actual} row(s), but Delta commit {version} of this batch "
            f"wrote {committed}. The query is not deterministic (rand(), uuid(), a changed "
            "source?). Make it deterministic, or pass on_replay_mismatch=\"warn\" to keep the "
            "committed rows",
            sink_id=self.sink_id,
            batch_id=ctx.batch_id,
        )
        if self.on_replay_mismatch == "fail":
            raise err
        logger.warning("%s", err)

    def commit_batch(self, batch: BatchInput, ctx: BatchContext) -> Fingerprint | None:
        """Driver: the batch as one Delta commit with txn id ``(ctx.app_id, ctx.batch_id)``.

        Steps:
          1. MERGE only: attach the fingerprint aggregates to the batch (observed by the
             write job); an append records none (a replay is compared with the files its
             commit added: :meth:`committed_fingerprint`);
          2. append/overwrite with the ``txnAppId``/``txnVersion`` writer options, or MERGE
             with the txn session confs set on the query's own session (and unset after);
          3. keep the committed version locally; fill the post-commit snapshot's txn ids
             from its checksum so that the next batch's write skips Delta's state
             reconstruction (:func:`_seed_txn_lookup`); return the observed fingerprint
             (the template records it in the ledger), or ``None``.

        Delta skips the write if the log already holds the pair (a retry after an
        ambiguous failure), so calling it again is harmless.
        """
        df = batch.spark_df
        assert df is not None and self._ledger is not None
        tag = CommitTag(self.sink_id, ctx.app_id, ctx.batch_id, ctx.query_id, ctx.run_id)
        if self.merge_on and self._schema is None:
            self._create_empty(df)
        # Step 1: only a MERGE is fingerprinted while it runs (its commit holds merged rows,
        # not the batch's); an append's replay is compared with its commit's files instead.
        observed = (
            observe(df, f"connectors_{self.sink_id}_{ctx.batch_id}_{uuid.uuid4().hex[:8]}")
            if self.verify_replay and self.merge_on else None
        )
        source = observed.df if observed is not None else df
        # Step 2
        started = time.monotonic()
        try:
            if self.merge_on:
                self._merge(source, ctx, tag)
            else:
                self._append(source, ctx, tag)
            self._write_ms = (time.monotonic() - started) * 1000
        except Exception as exc:
            raise translate(
                exc, doing=f"writing batch {ctx.batch_id} to {self.location()}",
                sink_id=self.sink_id, batch_id=ctx.batch_id,
            ) from exc
        # Step 3
        self._versions[ctx.app_id] = max(ctx.batch_id, self._versions.get(ctx.app_id, -1))
        self._history = None  # read again if a replay of this batch must find its commit
        if self.seed_txn_lookup:
            # Spare the next batch's write Delta's state reconstruction (see _seed_txn_lookup).
            _seed_txn_lookup(df.sparkSession, self.location(), ctx.app_id, ctx.batch_id)
        if self.merge_schema or self._schema is None:
            # The table may have new columns (or was just created): its schema as of this
            # commit, from the JVM's snapshot (a read of the table costs a job, ~0.3 s).
            self._schema = _snapshot_schema(df.sparkSession, self.location())
        if observed is None:
            return None
        fp = observed.result()
        if fp is None:
            logger.warning("sink %s batch %d: no fingerprint observed (the write was "
                           "skipped?); a replay of it is not checked",
                           self.sink_id, ctx.batch_id)
        return fp

    def _append(self, df: DataFrame, ctx: BatchContext, tag: CommitTag) -> None:
        writer = (
            df.write.format("delta")
            .mode(self.mode)
            .option("txnAppId", ctx.app_id)
            .option("txnVersion", str(ctx.batch_id))
            .option("userMetadata", tag.to_json())
        )
        if self.merge_schema:
            writer = writer.option("mergeSchema", "true")
        if self.partition_by and self._schema is None:
            writer = writer.partitionBy(*self.partition_by)
        writer.save(self.location())

    def _create_empty(self, df: DataFrame) -> None:
        """create_table for MERGE: an empty table with the batch's schema (one commit,
        without a txn id: if the driver dies after it, the next run finds the table)."""
        from delta.tables import DeltaTable

        if DeltaTable.isDeltaTable(df.sparkSession, self.location()):
            return
        writer = df.limit(0).write.format("delta").mode("append")
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        writer.save(self.location())
        logger.info("sink %s: created the Delta table at %s", self.sink_id, self.location())

    def _merge(self, df: DataFrame, ctx: BatchContext, tag: CommitTag) -> None:
        from delta.tables import DeltaTable

        session = df.sparkSession
        source = dedupe_by_key(df, self.merge_on)
        condition = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in self.merge_on)
        with self._merge_confs(session, ctx, tag):
            builder = (
                DeltaTable.forPath(session, self.location()).alias("t")
                .merge(source.alias("s"), condition)
                .whenMatchedUpdateAll()
                .whenNotMatchedInsertAll()
            )
            if self.merge_schema:
                builder = builder.withSchemaEvolution()
            builder.execute()

    @contextlib.contextmanager
    def _merge_confs(
        self, session: SparkSession, ctx: BatchContext, tag: CommitTag
    ) -> Iterator[None]:
        """Delta's txn session confs, on ``session`` only, unset afterwards.

        In ``foreachBatch`` the batch's session is the query's own clone, so two streaming
        queries never see each other's confs. A batch job's session may be shared: MERGEs
        on it are serialized by a process-wide lock.
        """
        streaming = ctx.query_id not in (None, BATCH_JOB_QUERY_ID)
        lock = contextlib.nullcontext() if streaming else _SHARED_SESSION_LOCK
        with lock:
            conf = session.conf
            try:
                conf.set(CONF_TXN_APP_ID, ctx.app_id)
                conf.set(CONF_TXN_VERSION, str(ctx.batch_id))
                # Delta clears the version after the commit; the app id stays: unset both.
                conf.set(CONF_TXN_AUTO_RESET, "true")
                conf.set(CONF_USER_METADATA, tag.to_json())
                yield
            finally:
                for key in _MERGE_CONFS:
                    conf.unset(key)


class DeltaSinks:
    """Several Delta sinks fed by one ``foreachBatch``, each exactly once.

    Each sink commits its own Delta commit with its own txn app id (its sink id), so two
    of them may write the same table in one batch: Delta would silently skip the second
    write if both used one app id. The batch is persisted once and unpersisted after.

    Example::

        sinks = DeltaSinks([
            DeltaSink(f"{path}/events", sink_id="events", create_table=True),
            DeltaSink(f"{path}/users", sink_id="users", merge_on=["user_id"],
                      create_table=True),
        ])
        query = df.writeStream.foreachBatch(sinks).option("checkpointLocation", ckpt).start()
    """

    def __init__(self, sinks: Iterable[DeltaSink], *, persist: bool = True) -> None:
        self.sinks = list(sinks)
        if not self.sinks or not all(isinstance(s, DeltaSink) for s in self.sinks):
            raise ConfigurationError("DeltaSinks needs a non-empty list of DeltaSink")
        ids = [s.sink_id for s in self.sinks]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ConfigurationError(
                f"sink id(s) {', '.join(dup)} repeat: each sink needs its own sink_id (its "
                "Delta txn app id), or Delta skips the second write to a table"
            )
        self.persist = bool(persist)

    def __repr__(self) -> str:
        return f"DeltaSinks({self.sinks!r})"

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        data = df.persist() if self.persist else df
        try:
            for sink in self.sinks:
                sink(data, batch_id)
        finally:
            if self.persist:
                data.unpersist()

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
