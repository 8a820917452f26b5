"""The table's history read for the sink's tags (public ``DeltaTable.history`` only).

The commits an app id tagged, the commit of one batch, and the two questions only the
history answers: did an attempt with an intent but no decision land (tag path,
:func:`settle_from_history`), and is a batch committed when Delta forgot the sink's
transaction id (txn path, :func:`settle_forgotten`)? Where the history cannot prove a
batch unwritten, both refuse (``ConfigurationError``) rather than risk a duplicate.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from connectors.core.batch import BatchContext
from connectors.core.errors import ConfigurationError
from connectors.delta._meta import parse_user_metadata

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from connectors.delta._log import LogState

__all__ = [
    "CLOCK_SLACK_S",
    "HISTORY_WINDOWS",
    "PROBE_COMMITS",
    "Commit",
    "Tags",
    "find_commit",
    "forgotten_why",
    "history_rows",
    "settle_forgotten",
    "settle_from_history",
    "tags_in",
]

logger = logging.getLogger(__name__)

#: History read in windows of these many newest commits when a batch's outcome is unknown.
HISTORY_WINDOWS = (32, 1024, 32768)
#: The sink scans this many newest commits for its tag when its ledger is found empty.
PROBE_COMMITS = 32768
#: Slack for clocks when a history window is judged to reach back to an intent by time.
CLOCK_SLACK_S = 600.0

#: A tagged commit: (table version, ``operationMetrics``).
Commit = tuple[int, dict[str, str]]
#: batch id -> the commit an app id tagged with it.
Tags = dict[int, Commit]


def history_rows(session: SparkSession, location: str, limit: int | None) -> list[Any]:
    """The newest ``limit`` commits of the table's history (all with ``None``), newest
    first: ``version``, ``ms`` (commit time), ``userMetadata``, ``operationMetrics``.
    Public API (``DeltaTable.history``; ``DESCRIBE HISTORY`` under Spark Connect: see
    :mod:`connectors.delta._api`); Delta reads only those commits' files."""
    import connectors.delta._api as delta_api

    if not delta_api.is_delta_table(session, location):
        return []  # no table yet: no commits
    return list(delta_api.history(session, location, limit).selectExpr(
        "version", "unix_millis(timestamp) AS ms", "userMetadata", "operationMetrics"
    ).collect())


def tags_in(rows: Iterable[Any], app_id: str) -> Tags:
    """batch id -> (table version, operationMetrics) of the rows tagged by ``app_id``."""
    found: Tags = {}
    for row in rows:
        tag = parse_user_metadata(row["userMetadata"])
        if tag is not None and tag.app_id == app_id:
            found.setdefault(tag.batch_id, (int(row["version"]),
                                            dict(row["operationMetrics"] or {})))
    return found


def find_commit(
    session: SparkSession, location: str, app_id: str, batch_id: int
) -> Commit | None:
    """The commit tagged with ``batch_id``: (table version, operationMetrics), or None.

    Reads the history newest first in growing windows (a replayed batch's commit is
    among the newest): used only on replays and reconciles."""
    for limit in (*HISTORY_WINDOWS, None):
        rows = history_rows(session, location, limit)
        tags = tags_in(rows, app_id)
        if batch_id in tags:
            return tags[batch_id]
        if limit is None or len(rows) < limit or any(b < batch_id for b in tags):
            return None  # the whole history, or already past where the batch would be
    return None


def settle_from_history(
    session: SparkSession,
    location: str,
    ctx: BatchContext,
    since: float,
    recorded: int | None,
    *,
    sink_id: str,
) -> bool:
    """Tag path: did the commit of ``ctx.batch_id`` land? An attempt was recorded at
    wall time ``since`` (0: unknown) and no decision followed; the ledger recorded batch
    ``recorded`` last.

    The history is read newest first in growing windows until the batch's tagged commit
    is found (committed), or the window provably holds every commit made since the
    attempt (not committed): it reaches version 0, or the commit of a batch the ledger
    recorded before this one, or a commit older than the attempt (with
    :data:`CLOCK_SLACK_S` for clocks). Delta's log clean-up drops only the oldest
    commits, so everything newer than such a commit is there. Otherwise the sink cannot
    prove the batch unwritten and refuses (``ConfigurationError``) rather than risk a
    duplicate.
    """
    for limit in (*HISTORY_WINDOWS, None):
        rows = history_rows(session, location, limit)
        tags = tags_in(rows, ctx.app_id)
        if ctx.batch_id in tags:
            return True
        if not rows:
            return False  # no commit at all
        oldest_version = min(int(r["version"]) for r in rows)
        oldest_s = min(int(r["ms"]) for r in rows) / 1000
        if (oldest_version == 0
                or (recorded is not None and any(b <= recorded for b in tags))
                or (since > 0 and oldest_s <= since - CLOCK_SLACK_S)):
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
        sink_id=sink_id,
        batch_id=ctx.batch_id,
    )


def forgotten_why(state: LogState) -> str:
    """Why Delta no longer records the sink's transaction id (for messages)."""
    return (
        f"the table sets delta.setTransactionRetentionDuration={state.retention} and "
        "the id expired" if state.retention else
        "the table was restored to an older version, recreated or replaced"
    )


def settle_forgotten(
    ctx: BatchContext, why: str, tags: Tags, version: int | None, recorded: int, *,
    sink_id: str,
) -> bool:
    """Txn path: the ledger records batch ``recorded`` but the log no longer knows it
    (``why``; Delta's version is ``version``).

    The batch at hand (``recorded + 1`` or later) may have been committed before a crash
    and then forgotten. The history (``tags``, the app id's tagged commits) decides when it
    still holds the commit of ``recorded`` (then every later commit is there too);
    otherwise the sink refuses.
    """
    if recorded in tags:
        committed = ctx.batch_id in tags
        logger.warning(
            "sink %s: Delta no longer records app id %s (last version %s, the ledger "
            "records batch %d): %s. The table's history still holds batch %d, so batch "
            "%d is %s",
            sink_id, ctx.app_id, version, recorded, why, recorded, ctx.batch_id,
            "committed" if committed else "not committed",
        )
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
        sink_id=sink_id,
        batch_id=ctx.batch_id,
    )
