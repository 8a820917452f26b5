"""``DeltaSink``: exactly-once appends, overwrites and MERGEs into a Delta table.

Family COMMIT_ON_DRIVER: the driver commits the whole batch as one Delta commit tagged with
``userMetadata`` ``{"connectors": {sink, app, batch, ...}}`` (:mod:`connectors.delta._meta`).
Two ways to make that commit idempotent, chosen per sink (``delta_txn_id``):

- **tag** (default, public APIs only): the commit carries the tag and no Delta txn id, so
  Delta does no txn lookup (no state reconstruction) on the write. The sink's ledger records
  an *intent* before each attempt; a batch with an intent but no decision (a crash or a
  failed write after the intent) is settled from the table's history
  (``DeltaTable.history``, the tag). The ledger's *lease* (an exclusive ``flock`` held by
  the driver process) keeps a second driver of the sink out, in place of Delta's conflict
  check on the app id.
- **txn** (``delta_txn_id=True``): the commit also carries Delta's own txn id
  ``(txnAppId, txnVersion) = (app id, batch id)``; Delta skips a write whose version it
  has and fails a concurrent one of the same app id. Delta 4.4 answers that lookup with a
  state reconstruction per commit (~2x a plain append) unless the accelerator of
  :mod:`connectors.delta._txn_seed` runs (``txn_seed``; verified 4.4.0 classes only).

Driver side, per batch (the template's ``run_driver_batch`` calls the hooks in this order):
  1. the ledger already records the batch (crash after the commit was recorded): a replay;
     its fingerprint is recomputed (one Spark job, replays only) and compared with the
     recorded one (MERGE) or with that of the rows its commit added, read back from the
     commit's files (append/overwrite: :meth:`committed_fingerprint`);
  2. :meth:`validate_input`: the table exists (or is created), the batch's columns fit;
  3. :meth:`is_committed`: tag path: an intent without a decision sends the batch to the
     table's history; txn path: the Delta log (read once per driver run, then kept up to
     date locally) holds ``(app id, batch id)``. Either way a batch the table has (crash
     between the Delta commit and the ledger record) is compared with that commit (a MERGE
     by its row count, from the commit's ``operationMetrics``) and recorded, not rewritten;
  4. :meth:`commit_batch`: tag path: the intent first; one Delta commit with the tag (and
     on the txn path the txn id); a MERGE's fingerprint is observed inside its job (no
     extra job); an append hashes nothing;
  5. the template records the batch in the ledger (with that fingerprint, if any).
"""

from __future__ import annotations

import contextlib
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
from connectors.core.rules import check_replay
from connectors.core.template import DriverCommitSink
from connectors.delta._errors import translate
from connectors.delta._fingerprint import fingerprint_now, observe
from connectors.delta._ledger import DeltaLedger
from connectors.delta._log import LocalDeltaLog, LogState, jvm_log_state
from connectors.delta._meta import CommitTag, parse_user_metadata
from connectors.delta._replay import Unreadable, committed_fingerprint
from connectors.delta._txn_seed import ACCELERATORS_ENV, seed_problem, seed_txn_lookup
from connectors.spark.batch import has_map

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["DeltaSink", "DeltaSinks"]

logger = logging.getLogger("connectors.delta")

Mode = Literal["append", "overwrite"]
#: Which commit path a batch took (``BatchMetrics.extra["delta_path_<path>"] = 1``): ``tag``
#: (no Delta txn id), ``txn_seed`` (txn id, lookup answered from the checksum), ``txn``
#: (txn id, Delta reconstructs the state for the lookup).
DeltaPath = Literal["tag", "txn_seed", "txn"]
#: History read in windows of these many newest commits when a batch's outcome is unknown.
_HISTORY_WINDOWS = (32, 1024, 32768)
#: The sink scans this many newest commits for its tag when its ledger is found empty.
PROBE_COMMITS = 32768
#: Slack for clocks when a history window is judged to reach back to an intent by time.
_CLOCK_SLACK_S = 600.0

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

def _snapshot_schema(session: SparkSession, location: str) -> StructType | None:
    """The table's schema as of its latest commit, through the public ``DeltaTable`` API
    (after a commit of this driver Delta's cached snapshot is that commit's: no job), or
    ``None`` on any error: then the sink reads the table when it next needs the schema."""
    try:
        from delta.tables import DeltaTable

        return DeltaTable.forPath(session, location).toDF().schema
    except Exception as exc:
        logger.debug("DeltaSink: no snapshot schema (%s); the table is read instead",
                     type(exc).__name__)
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
        delta_txn_id: bool = False,
        txn_seed: bool | None = None,
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
        if txn_seed is not None and not isinstance(txn_seed, bool):
            raise ConfigurationError(
                f"txn_seed must be None (auto), True or False, not {txn_seed!r}",
                sink_id=sink_id,
            )
        if txn_seed and not delta_txn_id:
            raise ConfigurationError(
                "txn_seed=True speeds up Delta's txn id lookup, which only delta_txn_id=True "
                "writes: pass delta_txn_id=True too, or drop txn_seed",
                sink_id=sink_id,
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
        self.delta_txn_id = bool(delta_txn_id)
        self.txn_seed = txn_seed
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
        self._path: DeltaPath | None = None  # the commit path, chosen once per driver run
        self._batch_path: DeltaPath | None = None  # the path the last commit took
        self._attempted: set[tuple[str, int]] = set()  # (app id, batch) tried in this process
        self._run_looked = False  # tag path: the run's first batch looked at the history

    def __repr__(self) -> str:
        target = f"{self.path!r}" if self.path is not None else f"table={self.table!r}"
        merge = f", merge_on={list(self.merge_on)!r}" if self.merge_on else ""
        return f"DeltaSink({target}, sink_id={self.sink_id!r}{merge})"

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        for key in ("_df", "_ledger", "_log", "_schema", "_history", "_path", "_batch_path"):
            state[key] = None
        state["_versions"] = {}
        state["_attempted"] = set()
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
        self._df, self._write_ms, self._batch_path = df, None, None
        try:
            return super().write_batch(batch, batch_id, query_id=query_id)
        except BaseException:
            # The outcome of a failed commit is known only to the log: read it again.
            self._log, self._schema, self._history = None, None, None
            self._run_looked = False
            raise
        finally:
            self._df = None

    def report_metrics(self, metrics: BatchMetrics) -> None:
        """Delta's own write time, and the commit path this batch's commit took."""
        if self._write_ms is not None:  # Delta's own write (the rest is the sink's)
            metrics.extra["write_ms"] = round(self._write_ms, 1)
        if self._batch_path is not None:
            metrics.extra[f"delta_path_{self._batch_path}"] = 1

    def close(self) -> None:
        super().close()
        self._log, self._schema, self._history = None, None, None
        self._path = None
        self._run_looked = False
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
        """The ledger is empty: the last batch the table already holds for ``app_id``.

        Txn path: Delta's txn version (one log read). Tag path: the newest tagged batch in
        the last :data:`PROBE_COMMITS` commits of the history (public API only)."""
        if self.delta_txn_id:
            return self._read_log([app_id]).version(app_id)
        rows = self._history_rows(PROBE_COMMITS)
        tags = self._tags_in(rows, app_id)
        return max(tags) if tags else None

    # ---- the commit path: tag (default), or Delta's txn id with or without the seed ----
    def _commit_path(self, session: SparkSession) -> DeltaPath:
        """The commit path of this driver run, chosen once (and logged once)."""
        if self._path is None:
            why: str | None = None
            if not self.delta_txn_id:
                path: DeltaPath = "tag"
            else:
                why = "txn_seed=False" if self.txn_seed is False else seed_problem(session)
                path = "txn_seed" if why is None else "txn"
            self._path = path
            if path == "txn":
                logger.warning(
                    "sink %s: delta_txn_id=True and no fast path for Delta's txn lookup (%s): "
                    "Delta reconstructs the table state on every commit to look the txn "
                    "version up, which costs about as much again as the write itself (1.9-2.2x "
                    "a plain append measured). The default delta_txn_id=False needs no lookup "
                    "(docs/delta.md, 'Commit paths')%s",
                    self.sink_id, why,
                    f"; {ACCELERATORS_ENV}=off turned the accelerator off" if
                    why == f"{ACCELERATORS_ENV}=off" else "",
                )
            else:
                logger.info("sink %s: Delta commit path %s", self.sink_id, path)
        return self._path

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

    def _history_rows(self, limit: int | None) -> list[Any]:
        """The newest ``limit`` commits of the table's history (all with ``None``), newest
        first: ``version``, ``ms`` (commit time), ``userMetadata``, ``operationMetrics``.
        Public API (``DeltaTable.history``); Delta reads only those commits' files."""
        from delta.tables import DeltaTable

        if not DeltaTable.isDeltaTable(self._session, self.location()):
            return []  # no table yet: no commits
        table = DeltaTable.forPath(self._session, self.location())
        history = table.history(limit) if limit is not None else table.history()
        return list(history.selectExpr(
            "version", "unix_millis(timestamp) AS ms", "userMetadata", "operationMetrics"
        ).collect())

    @staticmethod
    def _tags_in(rows: Iterable[Any], app_id: str) -> dict[int, tuple[int, dict[str, str]]]:
        """batch id -> (table version, operationMetrics) of the rows tagged by ``app_id``."""
        found: dict[int, tuple[int, dict[str, str]]] = {}
        for row in rows:
            tag = parse_user_metadata(row["userMetadata"])
            if tag is not None and tag.app_id == app_id:
                found.setdefault(tag.batch_id, (int(row["version"]),
                                                dict(row["operationMetrics"] or {})))
        return found

    def _tags(self, app_id: str) -> dict[int, tuple[int, dict[str, str]]]:
        """batch id -> (table version, operationMetrics) of the commits tagged by ``app_id``.

        Reads the table's whole history (one call, then cached until the next failure);
        used only to settle an expired transaction id (txn path).
        """
        if self._history is None:
            self._history = {}
        if app_id not in self._history:
            self._history[app_id] = self._tags_in(self._history_rows(None), app_id)
        return self._history[app_id]

    def _find_commit(self, app_id: str, batch_id: int) -> tuple[int, dict[str, str]] | None:
        """The commit tagged with ``batch_id``: (table version, operationMetrics), or None.

        Reads the history newest first in growing windows (a replayed batch's commit is
        among the newest): used only on replays and reconciles."""
        if self._history is not None and app_id in self._history:
            return self._history[app_id].get(batch_id)
        for limit in (*_HISTORY_WINDOWS, None):
            rows = self._history_rows(limit)
            tags = self._tags_in(rows, app_id)
            if batch_id in tags:
                return tags[batch_id]
            if limit is None or len(rows) < limit or any(b < batch_id for b in tags):
                return None  # the whole history, or already past where the batch would be
        return None

    def _settle_from_history(self, ctx: BatchContext, since: float) -> bool:
        """Tag path: did the commit of ``ctx.batch_id`` land? An attempt was recorded at
        wall time ``since`` (0: unknown) and no decision followed.

        The history is read newest first in growing windows until the batch's tagged commit
        is found (committed), or the window provably holds every commit made since the
        attempt (not committed): it reaches version 0, or the commit of a batch the ledger
        recorded before this one, or a commit older than the attempt (with
        :data:`_CLOCK_SLACK_S` for clocks). Delta's log clean-up drops only the oldest
        commits, so everything newer than such a commit is there. Otherwise the sink cannot
        prove the batch unwritten and refuses (``ConfigurationError``) rather than risk a
        duplicate.
        """
        assert self._ledger is not None
        recorded = self._ledger.last_batch_id()
        for limit in (*_HISTORY_WINDOWS, None):
            rows = self._history_rows(limit)
            tags = self._tags_in(rows, ctx.app_id)
            if ctx.batch_id in tags:
                return True
            if not rows:
                return False  # no commit at all
            oldest_version = min(int(r["version"]) for r in rows)
            oldest_s = min(int(r["ms"]) for r in rows) / 1000
            if (oldest_version == 0
                    or (recorded is not None and any(b <= recorded for b in tags))
                    or (since > 0 and oldest_s <= since - _CLOCK_SLACK_S)):
                return False
            if limit is None or len(rows) < limit:
                break
        raise ConfigurationError(
            f"batch {ctx.batch_id} was being committed when a driver stopped (the sink's "
            f"ledger has its intent, no decision), and the table's history no longer reaches "
            f"back to that moment (Delta's log clean-up removed it), so the sink cannot prove "
            "whether that commit landed and refuses to write the batch again. Check DESCRIBE "
            f"HISTORY for a commit whose userMetadata names batch {ctx.batch_id} of app id "
            f"{ctx.app_id!r}; if there is none, delete the intent file "
            f"intents/{ctx.batch_id:020d}.json in the sink's ledger directory and restart",
            sink_id=self.sink_id,
            batch_id=ctx.batch_id,
        )

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
        """Driver: does the table hold the commit of ``(ctx.app_id, ctx.batch_id)``?

        Tag path (default): committed by this driver run (kept locally), or an intent
        without a decision that the table's history settles
        (:meth:`_settle_from_history`); the first batch of every run also looks at the
        newest commits once (a commit of a release that wrote no intents, or an intent lost
        with an operating-system crash). No intent: the batch was never attempted.

        Txn path: answered from the log as read once at the start of the run, kept up to
        date by :meth:`commit_batch`. A transaction id that Delta forgot (expired, or the
        table was restored or recreated) is settled from the table's history, or refused.
        """
        if not self.delta_txn_id:
            return self._is_committed_tag(ctx)
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

    def _is_committed_tag(self, ctx: BatchContext) -> bool:
        assert self._ledger is not None
        known = self._versions.get(ctx.app_id)
        first_of_run, self._run_looked = not self._run_looked, True
        if known is not None and ctx.batch_id <= known:
            committed = True  # this driver run committed it (its record failed)
        else:
            intent = self._ledger.intent(ctx.batch_id, ctx.app_id)
            if intent is not None:
                committed = self._settle_from_history(ctx, float(intent.get("at") or 0.0))
                logger.info(
                    "sink %s batch %d: RECONCILING: an attempt of run %s had no decision; "
                    "the table's history says it %s", self.sink_id, ctx.batch_id,
                    intent.get("run_id"), "committed" if committed else "did not commit",
                )
            elif first_of_run:
                window = self._history_rows(_HISTORY_WINDOWS[0])
                committed = ctx.batch_id in self._tags_in(window, ctx.app_id)
            else:
                return False  # never attempted
        if committed:
            self._versions[ctx.app_id] = max(ctx.batch_id, known if known is not None else -1)
            self._check_reconciled(ctx)
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
        found = self._find_commit(ctx.app_id, ctx.batch_id)
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
        found = self._find_commit(ctx.app_id, ctx.batch_id)
        if found is None:
            return
        if not self.merge_on:
            committed = self._content_of(ctx, found[0])
            if committed is not None:
                check_replay(self.sink_id, self.on_replay_mismatch, ctx.batch_id, committed,
                             fingerprint_now(self._df))
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
        """Driver: the batch as one Delta commit tagged ``(ctx.app_id, ctx.batch_id)``.

        Steps:
          1. tag path: a retry after a failed attempt in this process first asks the
             table's history whether that attempt landed (then nothing is written); every
             attempt is preceded by the ledger's intent (fsynced);
          2. MERGE only: attach the fingerprint aggregates to the batch (observed by the
             write job); an append records none (a replay is compared with the files its
             commit added: :meth:`committed_fingerprint`);
          3. append/overwrite with the ``userMetadata`` tag (txn path: and the
             ``txnAppId``/``txnVersion`` writer options), or MERGE with the matching session
             confs set on the query's own session (and unset after);
          4. keep the committed version locally; txn path with the accelerator: fill the
             post-commit snapshot's txn ids from its checksum so that the next batch's
             write skips Delta's state reconstruction
             (:func:`~connectors.delta._txn_seed.seed_txn_lookup`); return the observed
             fingerprint (the template records it in the ledger), or ``None``.

        Calling it again is harmless: the tag path settles an earlier attempt from the
        history first; on the txn path Delta skips a version it holds.
        """
        df = batch.spark_df
        assert df is not None and self._ledger is not None
        session = df.sparkSession
        path = self._commit_path(session)
        tag = CommitTag(self.sink_id, ctx.app_id, ctx.batch_id, ctx.query_id, ctx.run_id)
        # Step 1
        if path == "tag":
            key = (ctx.app_id, ctx.batch_id)
            intent = self._ledger.intent(ctx.batch_id, ctx.app_id)
            if key in self._attempted and intent is not None and self._settle_from_history(
                    ctx, float(intent.get("at") or 0.0)):
                logger.warning(
                    "sink %s batch %d: an earlier attempt that reported a failure did commit "
                    "(the table's history has it); it is not written again",
                    self.sink_id, ctx.batch_id,
                )
                self._versions[ctx.app_id] = max(ctx.batch_id, self._versions.get(ctx.app_id, -1))
                self._batch_path = path
                return None
            self._ledger.intend(ctx.batch_id, ctx.app_id, ctx.run_id)
            self._attempted.add(key)
        if self.merge_on and self._schema is None:
            self._create_empty(df)
        # Step 2: only a MERGE is fingerprinted while it runs (its commit holds merged rows,
        # not the batch's); an append's replay is compared with its commit's files instead.
        observed = (
            observe(df, f"connectors_{self.sink_id}_{ctx.batch_id}_{uuid.uuid4().hex[:8]}")
            if self.verify_replay and self.merge_on else None
        )
        source = observed.df if observed is not None else df
        # Step 3
        started = time.monotonic()
        try:
            if self.merge_on:
                self._merge(source, ctx, tag)
            else:
                self._append(source, ctx, tag)
            self._write_ms = (time.monotonic() - started) * 1000
        except Exception as exc:
            err = translate(
                exc, doing=f"writing batch {ctx.batch_id} to {self.location()}",
                sink_id=self.sink_id, batch_id=ctx.batch_id,
                values_in_errors=self.values_in_errors,
            )
            if err is exc:
                raise
            if self.values_in_errors:
                raise err from exc
            raise err from None  # the original's text may quote row values
        # Step 4
        self._versions[ctx.app_id] = max(ctx.batch_id, self._versions.get(ctx.app_id, -1))
        self._history = None  # read again if a replay of this batch must find its commit
        self._batch_path = path
        # txn_seed: spare the next batch's write Delta's state reconstruction (_txn_seed).
        if path == "txn_seed" and not seed_txn_lookup(session, self.location(), ctx.app_id,
                                                      ctx.batch_id):
            self._batch_path = "txn"
        if self.merge_schema or self._schema is None:
            # The table may have new columns (or was just created): its schema as of this
            # commit, from Delta's cached snapshot (a read of the table costs a job, ~0.3 s).
            self._schema = _snapshot_schema(session, self.location())
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
            .option("userMetadata", tag.to_json())
        )
        if self.delta_txn_id:
            writer = (writer.option("txnAppId", ctx.app_id)
                      .option("txnVersion", str(ctx.batch_id)))
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
        """The commit's session confs (the ``userMetadata`` tag; on the txn path Delta's
        txn confs too), on ``session`` only, unset afterwards.

        In ``foreachBatch`` the batch's session is the query's own clone, so two streaming
        queries never see each other's confs. A batch job's session may be shared: MERGEs
        on it are serialized by a process-wide lock.
        """
        streaming = ctx.query_id not in (None, BATCH_JOB_QUERY_ID)
        lock = contextlib.nullcontext() if streaming else _SHARED_SESSION_LOCK
        with lock:
            conf = session.conf
            try:
                if self.delta_txn_id:
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
