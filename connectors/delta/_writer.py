"""The write of a DeltaSink's commit: an append/overwrite (``replaceWhere``, dynamic
partition overwrite) with the ``userMetadata`` tag (and Delta's txn id on the txn path), or
a MERGE (:mod:`connectors.lake.changes`' condition form, or the user's function:
:mod:`connectors.delta._changes`) with
the same as session confs; the empty table a MERGE creates. :func:`dedupe_by_key`, which
gives a MERGE one source row per key, is re-exported from :mod:`connectors.lake.changes`."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from connectors.core.batch import BatchContext
from connectors.core.errors import ConfigurationError
from connectors.core.ledgers.ledger import BATCH_JOB_QUERY_ID
from connectors.delta._changes import CONNECT_MERGE_FUNCTION
from connectors.delta._errors import translate
from connectors.delta._meta import CommitTag
from connectors.delta._options import Mode
from connectors.lake.changes import ChangeSpec, dedupe_by_key
from connectors.lake.commit_confs import commit_confs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "CONF_TXN_APP_ID",
    "CONF_TXN_AUTO_RESET",
    "CONF_TXN_VERSION",
    "CONF_USER_METADATA",
    "CONNECT_MERGE_FUNCTION",
    "DeltaWriter",
    "dedupe_by_key",
]

logger = logging.getLogger(__name__)

#: Session confs through which Delta makes MERGE/UPDATE/DELETE idempotent (delta-io/delta
#: #3934: they are session-wide, so only the query's own session may carry them).
CONF_TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
CONF_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
CONF_TXN_AUTO_RESET = "spark.databricks.delta.write.txnVersion.autoReset.enabled"
CONF_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
_MERGE_CONFS = (CONF_TXN_APP_ID, CONF_TXN_VERSION, CONF_TXN_AUTO_RESET, CONF_USER_METADATA)

@dataclass(frozen=True)
class DeltaWriter:
    """One batch's write into the table at ``location``, with the sink's options; the
    sink builds one per commit (``commit_batch``, driver side)."""

    location: str
    sink_id: str
    mode: Mode
    changes: ChangeSpec
    merge_schema: bool
    partition_by: tuple[str, ...]
    delta_txn_id: bool
    values_in_errors: bool
    replace_where: str | None = None
    partition_overwrite_mode: str | None = None

    def write(self, df: DataFrame, ctx: BatchContext, tag: CommitTag, *,
              new_table: bool) -> float:
        """Write ``df`` as one Delta commit tagged ``tag`` (MERGE with ``merge_on``); return
        Delta's write time in ms. ``new_table``: the sink knows no schema of the table yet
        (an append then partitions by ``partition_by``). Errors are translated
        (:func:`~connectors.delta._errors.translate`); without ``values_in_errors`` the
        original, which may quote row values, is not chained."""
        started = time.monotonic()
        try:
            if self.changes.merges:
                self._merge(df, ctx, tag)
            else:
                self._append(df, ctx, tag, new_table=new_table)
            return (time.monotonic() - started) * 1000
        except Exception as exc:
            err = translate(
                exc, doing=f"writing batch {ctx.batch_id} to {self.location}",
                sink_id=self.sink_id, batch_id=ctx.batch_id,
                values_in_errors=self.values_in_errors,
            )
            if err is exc:
                raise
            if self.values_in_errors:
                raise err from exc
            raise err from None  # the original's text may quote row values

    def _append(self, df: DataFrame, ctx: BatchContext, tag: CommitTag, *,
                new_table: bool) -> None:
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
        if self.replace_where is not None:
            writer = writer.option("replaceWhere", self.replace_where)
        if self.partition_overwrite_mode is not None:
            writer = writer.option("partitionOverwriteMode", self.partition_overwrite_mode)
        if self.partition_by and new_table:
            writer = writer.partitionBy(*self.partition_by)
        writer.save(self.location)

    def create_empty(self, df: DataFrame) -> None:
        """create_table for MERGE: an empty table with the batch's schema (one commit,
        without a txn id: if the driver dies after it, the next run finds the table)."""
        import connectors.delta._api as delta_api

        if delta_api.is_delta_table(df.sparkSession, self.location):
            return
        writer = self.changes.table_df(df).limit(0).write.format("delta").mode("append")
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        writer.save(self.location)
        logger.info("sink %s: created the Delta table at %s", self.sink_id, self.location)

    def _merge(self, df: DataFrame, ctx: BatchContext, tag: CommitTag) -> None:
        import connectors.delta._api as delta_api
        from connectors.spark.toolkit import is_connect

        session = df.sparkSession
        source = self.changes.source(df)
        if self.changes.merge is None:
            with self._merge_confs(session, ctx, tag):
                delta_api.merge(session, self.location, source, self.changes,
                           schema_evolution=self.merge_schema)
            return
        if is_connect(session):
            raise ConfigurationError(CONNECT_MERGE_FUNCTION, sink_id=self.sink_id)
        from connectors.delta._changes import user_merge

        tables = delta_api.delta_tables(session)

        # The user's function runs inside the commit's confs too: a MERGE it wrongly
        # executes itself is refused below, but it carries the batch's tag (and txn id), so
        # a replay after the fix finds it committed instead of applying it twice.
        with self._merge_confs(session, ctx, tag):
            builder = user_merge(self.changes, tables.DeltaTable.forPath(session, self.location),
                                 source, sink_id=self.sink_id)
            if self.merge_schema:
                builder = builder.withSchemaEvolution()
            builder.execute()

    def _merge_confs(
        self, session: SparkSession, ctx: BatchContext, tag: CommitTag
    ) -> contextlib.AbstractContextManager[None]:
        """The commit's session confs (the ``userMetadata`` tag; on the txn path Delta's
        txn confs too), on ``session`` only, unset afterwards
        (:func:`connectors.lake.commit_confs.commit_confs`: who else may share them)."""
        confs = {}
        if self.delta_txn_id:
            confs[CONF_TXN_APP_ID] = ctx.app_id
            confs[CONF_TXN_VERSION] = str(ctx.batch_id)
            # Delta clears the version after the commit; the app id stays: unset both.
            confs[CONF_TXN_AUTO_RESET] = "true"
        confs[CONF_USER_METADATA] = tag.to_json()
        return commit_confs(session, confs, streaming=ctx.query_id not in
                            (None, BATCH_JOB_QUERY_ID), unset=_MERGE_CONFS)
