"""benchmarks.chaos without services: the verdict counts duplicates, missing rows and
leftovers; the table shows every sink and kind; the timeline is a PNG."""

from __future__ import annotations

import collections
from pathlib import Path

from benchmarks._chaos_faults import KINDS, Failure
from benchmarks._chaos_jobs import (
    SinkJob,
    _verdict,
    batches_committed,
    delta_batches_committed,
)
from benchmarks._chaos_report import table, timeline_png


def test_the_verdict_counts_what_is_wrong() -> None:
    assert _verdict(5, [0, 1, 2, 3, 4], 0).exact
    v = _verdict(5, [0, 1, 1, 3, 4, 4, 4], 0)
    assert (v.seen, v.duplicates, v.missing, v.exact) == (7, 3, 1, False)
    assert not _verdict(2, [0, 1], 1).exact  # a lingering transaction is not exact


def _job(name: str) -> SinkJob:
    job = SinkJob(name, f"examples.stream_to_{name}", [], Path("/nonexistent"), [], 10)
    job.exits = collections.Counter({"ok": 2, "killed": 1})
    return job


def test_the_table_and_the_timeline(tmp_path: Path) -> None:
    jobs = [_job("postgres"), _job("delta")]
    verdicts = {"postgres": _verdict(3, [0, 1, 2], 0), "delta": _verdict(3, [0, 1, 1], 0)}
    failures = [Failure(3.0, "driver", "postgres driver", 0.01),
                Failure(9.5, "postgres", "PostgreSQL (immediate, 1.0 s down)", 2.5)]
    text = table(jobs, verdicts, failures, 42.0)
    assert "| postgres | 2 / 1 / 0 | 3 | 3 | 0 | 0 | 0 | yes |" in text
    assert "| delta | 2 / 1 / 0 | 3 | 3 | 1 | 1 | 0 | **NO** |" in text
    for kind in KINDS:
        assert f"| {kind} |" in text
    assert "| **all** | **2** |" in text
    progress = [(0.0, "postgres", 0), (5.0, "postgres", 2), (1.0, "delta", 1), (8.0, "delta", 3)]
    png = timeline_png(tmp_path / "t.png", progress, failures, ["postgres", "delta"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plotted_figure_is_batches_committed_past_the_ledgers_window(tmp_path: Path) -> None:
    """The timeline's y: a ledger keeping its last 100 decisions still says 250 batches."""
    window = {b: "COMMITTED" for b in range(150, 250)}
    assert batches_committed(window) == 250
    assert batches_committed({**window, 250: "DECIDED"}) == 250  # decided is not committed
    assert batches_committed({}) == 0
    log = tmp_path / "_delta_log"
    log.mkdir()
    assert delta_batches_committed(log) == 0
    for v in range(3):
        (log / f"{v:020d}.json").write_text("{}")
    (log / f"{2:020d}.checkpoint.parquet").write_bytes(b"")
    (log / "_last_checkpoint").write_text("{}")
    assert delta_batches_committed(log) == 3
