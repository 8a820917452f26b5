"""What a streaming query's checkpoint says about its micro-batches: Spark's offset log
(``offsets/<id>``: the batches planned) and commit log (``commits/<id>``: the batches whose
sink returned). The kill harness (:mod:`connectors.testing.kill`) proves each kill with
them; read them after your own runs to check what Spark committed.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["finished_batches", "spark_batches"]


def spark_batches(checkpoint: Path) -> tuple[set[int], set[int]]:
    """Batch ids in a streaming query's offset log and commit log (Spark's checkpoint)."""

    def ids(d: Path) -> set[int]:
        return {int(p.name) for p in d.glob("*") if p.name.isdigit()} if d.exists() else set()

    return ids(checkpoint / "offsets"), ids(checkpoint / "commits")


def finished_batches(checkpoint: Path) -> int:
    """How many micro-batches a streaming query that ran to its end committed: its batch ids
    are ``0 .. n-1``, each in Spark's offset log and in its commit log (else
    ``AssertionError``: a batch was planned and not committed).

    Count on this, not on the input, after random kills: Spark's file source may put two of
    its files in one micro-batch even with ``maxFilesPerTrigger=1``. A driver killed after the
    source logged its next file (``sources/0/<n>``) and before the offset log recorded the
    batch leaves that file logged and unplanned; the restarted query plans its next batch
    over that file and the next one (``FileStreamSource``). Nothing is lost or doubled, but
    ``n`` files end in fewer than ``n`` batches."""
    offsets, commits = spark_batches(checkpoint)
    assert offsets == commits, f"planned, not committed: {sorted(offsets - commits)}"
    assert sorted(commits) == list(range(len(commits))), sorted(commits)
    return len(commits)
