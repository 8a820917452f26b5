"""What the Delta table holds, asked by DeltaSink's driver hooks: does it have a batch, and
is a replay the batch its commit wrote (:mod:`connectors.delta._replay_fingerprint`)?

:class:`TableReplay` is a collaborator of :class:`~connectors.delta._sink.DeltaSink`, built
from the sink's settings; the sink's ``is_committed`` and ``committed_fingerprint`` hand it
the batch's session, table location and DataFrame.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from connectors.core.batch import BatchContext
from connectors.core.fingerprint import Fingerprint
from connectors.delta._history import Commit
from connectors.delta._replay_fingerprint import ReplayCheck

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from connectors.core.templates.template import ReplayPolicy
    from connectors.delta._table_commits import TableCommits
    from connectors.lake.changes import ChangeSpec

__all__ = ["TableReplay"]


@dataclass(frozen=True)
class TableReplay:
    """``is_committed`` and ``committed_fingerprint`` of one batch (driver side)."""

    sink_id: str
    changes: ChangeSpec
    verify_replay: bool
    on_replay_mismatch: ReplayPolicy
    commits: TableCommits
    session: SparkSession
    location: str
    df: DataFrame | None

    def is_committed(self, ctx: BatchContext) -> bool:
        """Does the table hold the commit of ``(ctx.app_id, ctx.batch_id)``?

        Tag path (default): committed by this driver run (kept locally), or an intent
        without a decision that the table's history settles; the first batch of every run
        also looks at the newest commits once (a commit of a release that wrote no intents,
        or an intent lost with an operating-system crash). No intent: never attempted.
        Txn path: answered from the log as read once at the start of the run, kept up to
        date by the sink's ``commit_batch``. A transaction id that Delta forgot (expired,
        or the table was restored or recreated) is settled from the table's history, or
        refused. :class:`TableCommits` answers; a batch found committed is compared with
        its commit (:meth:`_check_reconciled`).
        """
        return self.commits.is_committed(self.session, self.location, ctx,
                                           self._check_reconciled)

    def committed_fingerprint(self, ctx: BatchContext) -> Fingerprint | None:
        """On the replay of an append/overwrite batch the ledger recorded: the fingerprint
        of the rows its Delta commit added, read back from that commit's files
        (:mod:`connectors.delta._replay_fingerprint`). Where they cannot be read, the replay's row
        count is compared with the commit's instead, and ``None`` is returned."""
        if self.changes.merges or not self.verify_replay or self.df is None:
            return None
        return self._replay_check(ctx).committed_fingerprint(self._find_commit(ctx))

    def _check_reconciled(self, ctx: BatchContext) -> None:
        """A batch committed to Delta but not recorded: an append's replay must hold the rows
        its commit wrote (a MERGE's: as many source rows)."""
        if self.verify_replay and self.df is not None:
            self._replay_check(ctx).reconciled(self._find_commit(ctx))

    def _find_commit(self, ctx: BatchContext) -> Commit | None:
        return self.commits.find_commit(self.session, self.location, ctx.app_id,
                                          ctx.batch_id)

    def _replay_check(self, ctx: BatchContext) -> ReplayCheck:
        assert self.df is not None
        return ReplayCheck(self.session, self.location, self.df, self.changes,
                           self.on_replay_mismatch, self.sink_id, ctx.batch_id)
