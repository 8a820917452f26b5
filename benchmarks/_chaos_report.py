"""The chaos soak's report (:mod:`benchmarks.chaos`): a table per sink, and the campaign
as a timeline picture (batches committed over time per sink, each failure marked)."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from pathlib import Path

from benchmarks._chaos_faults import KINDS, Failure
from benchmarks._chaos_jobs import SinkJob, Verdict

__all__ = ["table", "timeline_png"]

#: (seconds into the campaign, sink, batches committed)
Progress = tuple[float, str, int]


def table(jobs: Sequence[SinkJob], verdicts: dict[str, Verdict], failures: Sequence[Failure],
          wall_s: float) -> str:
    """Markdown: one row per sink, and the failures of each kind."""
    kinds = collections.Counter(f.kind for f in failures)
    lines = [
        "| sink | driver exits (ok / killed / failed) | rows expected | rows seen | "
        "duplicates | missing | lingering | exact |",
        "|:--|:--|--:|--:|--:|--:|--:|:--|",
    ]
    for job in jobs:
        v = verdicts[job.name]
        lines.append(
            f"| {job.name} | {job.exits['ok']} / {job.exits['killed']} / {job.exits['failed']}"
            f" | {v.expected} | {v.seen} | {v.duplicates} | {v.missing} | {v.lingering} | "
            f"{'yes' if v.exact else '**NO**'} |")
    lines += ["", "| failure | count |", "|:--|--:|"]
    lines += [f"| {kind} | {kinds.get(kind, 0)} |" for kind in KINDS]
    lines += [f"| **all** | **{len(failures)}** |", "",
              f"wall time {wall_s:.0f} s"]
    return "\n".join(lines)


def timeline_png(path: Path, progress: Sequence[Progress], failures: Sequence[Failure],
                 sinks: Sequence[str]) -> Path:
    """Batches committed over time per sink, a vertical mark per failure (colour by
    kind); written to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4.5), dpi=110)
    for sink in sinks:
        points = [(t, n) for t, s, n in progress if s == sink]
        if points:
            ax.step([t for t, _ in points], [n for _, n in points], where="post", label=sink,
                    linewidth=1.6)
    colours = dict(zip(KINDS, ("#d62728", "#9467bd", "#8c564b", "#1f77b4", "#ff7f0e"),
                       strict=True))
    seen: set[str] = set()
    for f in failures:
        ax.axvline(f.at, color=colours[f.kind], alpha=0.45, linewidth=0.9,
                   label=None if f.kind in seen else f"failure: {f.kind}")
        seen.add(f.kind)
    ax.set_xlabel("seconds into the campaign")
    ax.set_ylabel("batches committed")
    ax.set_title(f"chaos soak: {len(failures)} failures")
    ax.legend(loc="upper left", fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path
