"""The user metadata the sink puts on each of its Delta commits, and parsing it back.

Every commit of a :class:`~connectors.delta.DeltaSink` carries, in ``commitInfo.userMetadata``
(what ``DESCRIBE HISTORY`` shows as ``userMetadata``)::

    {"connectors": {"v": 1, "sink": "events-delta", "app": "events-delta", "batch": 7,
                    "query": "<streaming query id>", "run": "<driver run id>"}}

``app`` and ``batch`` repeat Delta's own ``txn`` action (``appId`` / ``version``) so that an
operator reading the history sees which batch a commit holds, and so that the sink can find
the commit of a batch again (its ``operationMetrics`` hold the row count a replay is checked
against, see ``docs/delta.md``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["CommitTag", "parse_user_metadata"]

_KEY = "connectors"
_FORMAT = 1


@dataclass(frozen=True)
class CommitTag:
    """Who wrote a Delta commit: sink, Delta app id, batch, query and driver run."""

    sink_id: str
    app_id: str
    batch_id: int
    query_id: str | None = None
    run_id: str | None = None

    def to_json(self) -> str:
        body: dict[str, Any] = {
            "v": _FORMAT,
            "sink": self.sink_id,
            "app": self.app_id,
            "batch": self.batch_id,
            "query": self.query_id,
            "run": self.run_id,
        }
        return json.dumps({_KEY: body}, separators=(",", ":"), sort_keys=True)


def parse_user_metadata(text: str | None) -> CommitTag | None:
    """The :class:`CommitTag` in a commit's ``userMetadata``, or ``None`` if it has none.

    Anything that is not this library's tag (another writer's metadata, bad JSON, a
    future format) is ``None``: it never counts as one of the sink's commits.
    """
    if not text:
        return None
    try:
        data = json.loads(text)
    except (TypeError, ValueError):
        return None
    body = data.get(_KEY) if isinstance(data, dict) else None
    if not isinstance(body, dict) or body.get("v") != _FORMAT:
        return None
    try:
        batch = body["batch"]
        if isinstance(batch, bool) or not isinstance(batch, int):
            return None
        return CommitTag(
            sink_id=str(body["sink"]),
            app_id=str(body["app"]),
            batch_id=batch,
            query_id=None if body.get("query") is None else str(body["query"]),
            run_id=None if body.get("run") is None else str(body["run"]),
        )
    except KeyError:
        return None
