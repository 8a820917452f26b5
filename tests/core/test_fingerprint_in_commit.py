"""COMMIT_ON_DRIVER sinks that observe the fingerprint inside their own write
(``fingerprint_in_commit``): no separate job before a fresh write, the observed fingerprint
is what the ledger records, and replays are still compared with it."""

from __future__ import annotations

from typing import Any, ClassVar

import pyarrow as pa
import pytest

from connectors.core.batch import BatchContext, BatchInput
from connectors.core.errors import NonDeterministicReplayError
from connectors.core.fingerprint import Fingerprint, fingerprint_batches
from connectors.testing import InMemoryDriverCommitSink, InMemoryTarget, LocalBatch


class ObservingSink(InMemoryDriverCommitSink):
    fingerprint_in_commit: ClassVar[bool] = True

    def __init__(self, target: InMemoryTarget, **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        self.fingerprint_jobs = 0

    def fingerprint_input(self, batch: BatchInput) -> Fingerprint | None:
        self.fingerprint_jobs += 1
        return super().fingerprint_input(batch)

    def commit_batch(self, batch: BatchInput, ctx: BatchContext) -> Fingerprint | None:
        super().commit_batch(batch, ctx)
        return fingerprint_batches(batch.to_arrow().to_batches())  # "observed by the write"


def table(n: int, offset: int = 0) -> pa.Table:
    return pa.table({"id": pa.array(range(offset, offset + n), pa.int64())})


def test_fresh_writes_run_no_fingerprint_job_and_record_the_observed_one() -> None:
    target = InMemoryTarget()
    sink = ObservingSink(target, sink_id="obs")
    for b in range(3):
        sink.write_batch(LocalBatch(table(5, 5 * b), partitions=2), b)
    assert sink.fingerprint_jobs == 0
    entry = target.ledger("obs").get(2)
    assert entry is not None
    assert entry.fingerprint == fingerprint_batches(table(5, 10).to_batches())
    assert sink.last_metrics is not None and sink.last_metrics.rows == 5


def test_replays_are_still_compared_with_the_observed_fingerprint() -> None:
    target = InMemoryTarget()
    ObservingSink(target, sink_id="obs").write_batch(LocalBatch(table(5), partitions=2), 0)
    same = ObservingSink(target, sink_id="obs")
    same.write_batch(LocalBatch(table(5), partitions=3), 0)  # a replay: nothing written
    assert same.fingerprint_jobs == 1 and len(target.committed_rows()) == 5
    with pytest.raises(NonDeterministicReplayError):
        ObservingSink(target, sink_id="obs").write_batch(
            LocalBatch(table(5, 1), partitions=2), 0)
