"""The replay rule, once: a replayed batch must hold the rows that were committed.

Every place that compares a replay with what a batch committed (the coordinator with the
ledger's fingerprint, a slot's task with its marker, a slot started over with another
attempt's marker, a Delta replay with its commit's row count) asks :func:`replay_mismatch`,
which applies the sink's ``on_replay_mismatch`` policy and words the one error.

Example::

    >>> from connectors.core.fingerprint import Fingerprint
    >>> replay_mismatch("events", "fail", 3, Fingerprint(2, 7), Fingerprint(2, 7)) is None
    True
    >>> err = replay_mismatch("events", "fail", 3, Fingerprint(2, 7), Fingerprint(3, 9))
    >>> "replayed batch differs from what was committed: committed 2 rows" in str(err)
    True
"""

from __future__ import annotations

import logging

from connectors.core.errors import NonDeterministicReplayError

__all__ = ["check_replay", "replay_mismatch"]

logger = logging.getLogger(__name__)


def replay_mismatch(
    sink_id: str,
    policy: str,
    batch_id: int,
    recorded: object | None,
    actual: object | None,
    *,
    what: str | None = None,
    transaction_id: str | None = None,
) -> NonDeterministicReplayError | None:
    """The error to raise (or return as a task's outcome) when a replay differs.

    ``recorded`` and ``actual`` are what the batch (or ``what``: a slot, a commit's row
    count) committed and what the replay holds, compared with ``==``; ``None`` on either
    side means "not known": nothing to compare. Returns ``None`` when they agree, or when
    ``policy`` is ``"warn"`` (the mismatch is logged: the operator keeps the committed
    rows); the error when ``policy`` is ``"fail"``.
    """
    if recorded is None or actual is None or recorded == actual:
        return None
    err = NonDeterministicReplayError(
        f"replayed batch differs from what was committed{f' in {what}' if what else ''}: "
        f"committed {recorded}, replay has {actual}. The query is not deterministic (rand(), "
        "uuid(), a changed source?). Make it deterministic, or pass "
        "on_replay_mismatch=\"warn\" to keep the committed rows",
        sink_id=sink_id, batch_id=batch_id, transaction_id=transaction_id,
    )
    if policy == "fail":
        return err
    logger.warning("%s", err)
    return None


def check_replay(
    sink_id: str,
    policy: str,
    batch_id: int,
    recorded: object | None,
    actual: object | None,
    *,
    what: str | None = None,
    transaction_id: str | None = None,
) -> None:
    """:func:`replay_mismatch`, raised: for the driver's steps."""
    err = replay_mismatch(sink_id, policy, batch_id, recorded, actual, what=what,
                          transaction_id=transaction_id)
    if err is not None:
        raise err
