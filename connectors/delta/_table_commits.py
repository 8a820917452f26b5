"""What a DeltaSink's table has committed, and the path its commits take (driver side).

It commits nothing itself (the writer does, :mod:`connectors.delta._writer`): it chooses
how each commit is made idempotent and answers "does the table hold this batch?".

Two ways to make the batch's one Delta commit idempotent, chosen per sink (``delta_txn_id``)
and once per driver run (:meth:`TableCommits.choose_path`):

- **tag** (default, public APIs only): the commit carries the tag and no Delta txn id, so
  Delta does no txn lookup (no state reconstruction) on the write. The sink's ledger records
  an *intent* before each attempt; a batch with an intent but no decision (a crash or a
  failed write after the intent) is settled from the table's history
  (``DeltaTable.history``, the tag: :mod:`connectors.delta._history`). The ledger's *lease*
  (an exclusive ``flock`` held by the driver process) keeps a second driver of the sink
  out, in place of Delta's conflict check on the app id.
- **txn** (``delta_txn_id=True``): the commit also carries Delta's own txn id
  ``(txnAppId, txnVersion) = (app id, batch id)``; Delta skips a write whose version it
  has and fails a concurrent one of the same app id. Delta 4.4 answers that lookup with a
  state reconstruction per commit (~2x a plain append) unless the accelerator of
  :mod:`connectors.delta._txn_seed` runs (``txn_seed``; verified 4.4.0 classes only).

:class:`TableCommits` keeps what one driver run knows of the table's commits: the
ledger, the Delta log as read at the start of the run (txn path), the last committed batch
per app id, the history's tags, the attempts made in this process. None of it is pickled.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from connectors.core.batch import BatchContext
from connectors.delta._history import (
    HISTORY_WINDOWS,
    PROBE_COMMITS,
    Commit,
    Tags,
    find_commit,
    forgotten_why,
    history_rows,
    settle_forgotten,
    settle_from_history,
    tags_in,
)
from connectors.delta._log import LogState, jvm_log_state
from connectors.delta._txn_seed import ACCELERATORS_ENV, seed_problem

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from connectors.core.metrics import BatchMetrics
    from connectors.lake.ledger import TableLedger
    from connectors.lake.object_ledger import TableObjectLedger

__all__ = ["DeltaPath", "TableCommits"]

logger = logging.getLogger(__name__)

#: Which commit path a batch took (``BatchMetrics.extra["delta_path_<path>"] = 1``): ``tag``
#: (no Delta txn id), ``txn_seed`` (txn id, lookup answered from the checksum), ``txn``
#: (txn id, Delta reconstructs the state for the lookup).
DeltaPath = Literal["tag", "txn_seed", "txn"]


class TableCommits:
    """What one driver run of a sink knows of its table's commits, and the lookups that
    answer "does the table hold this batch?" on either commit path.

    The sink calls it from its hooks, on the driver only, with the batch's session and the
    table's location. ``delta_txn_id`` and ``txn_seed`` are the sink's options.
    """

    #: The sink's ``storage_options`` (delta-rs's names), for reading the log without a
    #: JVM gateway (set by the sink).
    storage_options: Mapping[str, str] | None = None

    def __init__(self, sink_id: str, *, delta_txn_id: bool, txn_seed: bool | None) -> None:
        self.sink_id = sink_id
        self.delta_txn_id = delta_txn_id
        self.txn_seed = txn_seed
        self.ledger: TableLedger | TableObjectLedger | None = None
        self.log: LogState | None = None  # read once per driver run
        self.versions: dict[str, int] = {}  # app id -> last committed batch, kept locally
        self.history: dict[str, Tags] | None = None
        self.path: DeltaPath | None = None  # the commit path, chosen once per driver run
        self.attempted: set[tuple[str, int]] = set()  # (app id, batch) tried in this process
        self.run_looked = False  # tag path: the run's first batch looked at the history

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("ledger", "log", "history", "path"):
            state[key] = None
        state["versions"] = {}
        state["attempted"] = set()
        return state

    def forget(self) -> None:
        """After a failed batch: the outcome of a failed commit is known only to the log,
        so the log and the history are read again."""
        self.log, self.history = None, None
        self.run_looked = False

    def close(self) -> None:
        """The sink is closed: the next batch starts a new driver run."""
        self.log, self.history = None, None
        self.path = None
        self.run_looked = False
        self.versions = {}
        self.ledger = None

    def report(self, metrics: BatchMetrics) -> None:
        """A ledger on an object store: ``ledger_requests``, the requests it made since the
        last batch's report (the lease's renewals aside)."""
        taken = getattr(self.ledger, "take_requests", None)
        if taken is not None:
            metrics.extra["ledger_requests"] = taken()

    def _ledger(self) -> TableLedger | TableObjectLedger:
        assert self.ledger is not None  # created by the sink's create_ledger
        return self.ledger

    # ---- the commit path: tag (default), or Delta's txn id with or without the seed ----
    def choose_path(self, session: SparkSession) -> DeltaPath:
        """The commit path of this driver run, chosen once (and logged once)."""
        if self.path is None:
            why: str | None = None
            if not self.delta_txn_id:
                path: DeltaPath = "tag"
            else:
                why = "txn_seed=False" if self.txn_seed is False else seed_problem(session)
                path = "txn_seed" if why is None else "txn"
            self.path = path
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
        return self.path

    def probe(self, session: SparkSession, location: str, app_id: str) -> int | None:
        """The ledger is empty: the last batch the table already holds for ``app_id``.

        Txn path: Delta's txn version (one log read). Tag path: the newest tagged batch in
        the last :data:`~connectors.delta._history.PROBE_COMMITS` commits of the history
        (public API only)."""
        if self.delta_txn_id:
            return self.read_log(session, location, [app_id]).version(app_id)
        rows = history_rows(session, location, PROBE_COMMITS)
        tags = tags_in(rows, app_id)
        return max(tags) if tags else None

    # ---- reading the log (once per run) ----
    def read_log(self, session: SparkSession, location: str, app_ids: Sequence[str]) -> LogState:
        try:
            return jvm_log_state(session, location, app_ids)
        except AttributeError:  # Spark Connect: no JVM gateway: delta-rs reads the log
            from connectors.delta._rs_log import DeltaRsLog
            from connectors.delta._rs_options import delta_rs_options
            from connectors.lake.store import spark_conf

            options = delta_rs_options(location, spark_conf(session), self.storage_options)
            return DeltaRsLog(location, options).read(app_ids)

    def run_log(self, session: SparkSession, location: str, ctx: BatchContext) -> LogState:
        """The log as read at the start of this driver run (and after any failure)."""
        if self.log is None:
            state = self.read_log(session, location, [ctx.app_id])
            self.log = state
            self.versions = dict(state.versions)
            self.history = None
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
        return self.log

    # ---- the history, cached until the next failure ----
    def tags(self, session: SparkSession, location: str, app_id: str) -> Tags:
        """batch id -> (table version, operationMetrics) of the commits tagged by ``app_id``.

        Reads the table's whole history (one call, then cached until the next failure);
        used only to settle an expired transaction id (txn path).
        """
        if self.history is None:
            self.history = {}
        if app_id not in self.history:
            self.history[app_id] = tags_in(history_rows(session, location, None), app_id)
        return self.history[app_id]

    def find_commit(
        self, session: SparkSession, location: str, app_id: str, batch_id: int
    ) -> Commit | None:
        """The commit tagged with ``batch_id`` (from the cached tags when the run read them),
        or None: :func:`~connectors.delta._history.find_commit`."""
        if self.history is not None and app_id in self.history:
            return self.history[app_id].get(batch_id)
        return find_commit(session, location, app_id, batch_id)

    # ---- does the table hold the batch? ----
    def is_committed(
        self,
        session: SparkSession,
        location: str,
        ctx: BatchContext,
        reconcile: Callable[[BatchContext], None],
    ) -> bool:
        """The sink's ``is_committed`` hook; ``reconcile(ctx)`` compares a batch found
        committed (but not recorded) with its commit."""
        if not self.delta_txn_id:
            return self._is_committed_tag(session, location, ctx, reconcile)
        state = self.run_log(session, location, ctx)
        version = self.versions.get(ctx.app_id)
        recorded = self._ledger().last_batch_id()
        if recorded is not None and (version is None or version < recorded):
            why = forgotten_why(state)
            tags = self.tags(session, location, ctx.app_id) if state.exists else {}
            committed = settle_forgotten(ctx, why, tags, version, recorded,
                                         sink_id=self.sink_id)
            if committed:
                reconcile(ctx)
        else:
            committed = version is not None and ctx.batch_id <= version
            if committed:
                if version is not None and version > ctx.batch_id:
                    logger.warning(
                        "sink %s: the table records batch %s of app id %s, beyond batch %d "
                        "being written: another driver runs with this sink id?",
                        self.sink_id, version, ctx.app_id, ctx.batch_id,
                    )
                reconcile(ctx)
        if committed:
            latest = max(ctx.batch_id, version if version is not None else -1)
            self.versions[ctx.app_id] = latest
        return committed

    def _is_committed_tag(
        self,
        session: SparkSession,
        location: str,
        ctx: BatchContext,
        reconcile: Callable[[BatchContext], None],
    ) -> bool:
        ledger = self._ledger()
        known = self.versions.get(ctx.app_id)
        first_of_run, self.run_looked = not self.run_looked, True
        if known is not None and ctx.batch_id <= known:
            committed = True  # this driver run committed it (its record failed)
        else:
            intent = ledger.intent(ctx.batch_id, ctx.app_id)
            if intent is not None:
                committed = settle_from_history(
                    session, location, ctx, float(intent.get("at") or 0.0),
                    ledger.last_batch_id(), sink_id=self.sink_id,
                )
                logger.info(
                    "sink %s batch %d: RECONCILING: an attempt of run %s had no decision; "
                    "the table's history says it %s", self.sink_id, ctx.batch_id,
                    intent.get("run_id"), "committed" if committed else "did not commit",
                )
            elif first_of_run:
                window = history_rows(session, location, HISTORY_WINDOWS[0])
                committed = ctx.batch_id in tags_in(window, ctx.app_id)
            else:
                return False  # never attempted
        if committed:
            self.versions[ctx.app_id] = max(ctx.batch_id, known if known is not None else -1)
            reconcile(ctx)
        return committed

    # ---- around the commit ----
    def record_intent(self, session: SparkSession, ctx: BatchContext) -> None:
        """Tag path, before the batch's first attempt (the coordinator's ``RecordIntent``):
        the ledger's intent (fsynced), so that a crash after it is settled from the
        table's history. The txn path needs none: Delta's own txn id settles it."""
        if self.choose_path(session) == "tag":
            self._ledger().intend(ctx.batch_id, ctx.app_id, ctx.run_id)

    def landed_before(self, session: SparkSession, location: str, ctx: BatchContext) -> bool:
        """Tag path, before each attempt: true when an earlier attempt in this process that
        reported a failure did commit (the history has it: nothing is written); otherwise
        the attempt is noted."""
        ledger = self._ledger()
        key = (ctx.app_id, ctx.batch_id)
        if key in self.attempted:
            intent = ledger.intent(ctx.batch_id, ctx.app_id)
            if intent is not None and settle_from_history(
                    session, location, ctx, float(intent.get("at") or 0.0),
                    ledger.last_batch_id(), sink_id=self.sink_id):
                logger.warning(
                    "sink %s batch %d: an earlier attempt that reported a failure did commit "
                    "(the table's history has it); it is not written again",
                    self.sink_id, ctx.batch_id,
                )
                self.versions[ctx.app_id] = max(ctx.batch_id,
                                                self.versions.get(ctx.app_id, -1))
                return True
        self.attempted.add(key)
        return False

    def committed(self, ctx: BatchContext) -> None:
        """After the commit: keep the committed batch locally; a replay of it reads the
        history again to find its commit."""
        self.versions[ctx.app_id] = max(ctx.batch_id, self.versions.get(ctx.app_id, -1))
        self.history = None
