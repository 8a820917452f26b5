"""Writing a batch of :func:`connectors.testing.batch_rows` into an in-memory sink and
checking the target holds exactly the given batches: shared by the core's tests."""

from __future__ import annotations

import collections
from typing import Any

from connectors.core.templates.template import TwoPhaseCommitSink
from connectors.testing import InMemoryTarget, LocalBatch, batch_rows

__all__ = ["QUERY", "Row", "assert_exact", "expected", "write"]

QUERY = "query-1"
Row = tuple[Any, ...]


def expected(*batch_ids: int) -> list[Row]:
    """The rows of ``batch_ids``, sorted."""
    return sorted(
        (tuple(r.values()) for b in batch_ids for r in batch_rows(b).to_pylist()), key=repr
    )


def write(
    sink: TwoPhaseCommitSink, batch_id: int, *, rows_of: int | None = None, partitions: int = 3,
    **options: Any,
) -> Any:
    """``sink.write_batch`` of batch ``batch_id`` (the rows of ``rows_of`` when given) in
    ``partitions`` tasks of a :class:`LocalBatch` (``options``: its options)."""
    table = batch_rows(batch_id if rows_of is None else rows_of)
    return sink.write_batch(LocalBatch(table, partitions=partitions, **options), batch_id,
                            query_id=QUERY)


def assert_exact(target: InMemoryTarget, *batch_ids: int) -> None:
    """The target holds the rows of ``batch_ids`` once each, and nothing is left prepared
    or open."""
    assert collections.Counter(target.committed_rows()) == collections.Counter(
        expected(*batch_ids)
    )
    assert target.lingering() == 0
