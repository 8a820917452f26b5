"""The benchmarks' result tables as charts (PNG, matplotlib): one panel per table, one row
per contender, the median ratio over the runs (a dot) with its spread (min-max over the
runs) as error bars, and a line at 1.0x (the baseline). When one run lies 20x away from
another, the axis is logarithmic, so that outlier does not squash the rest.

Every benchmark writes its chart beside the tables it prints, to ``--chart`` (default
``benchmarks/charts/<benchmark>.png``), and prints where. A run of one round draws no
spread: min = median = max, and the panel's title says ``1 run``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CHART_DIR", "Panel", "default_chart_path", "draw_chart"]

#: Where the charts go unless ``--chart`` says otherwise (README and benchmarks/README.md
#: show the ones of a ``--quick`` run, committed).
CHART_DIR = Path(__file__).resolve().parent / "charts"


def default_chart_path(benchmark: str) -> Path:
    """``benchmarks/charts/<benchmark>.png``."""
    return CHART_DIR / f"{benchmark}.png"


@dataclass(frozen=True)
class Panel:
    """One table: ``ratios[contender]`` = that contender's ratio in each run (round or
    batch), e.g. the baseline's time over the contender's in the same round."""

    title: str
    ratios: Mapping[str, Sequence[float]]
    xlabel: str
    better: str = "higher"  # which way is better, said under the axis
    notes: Sequence[str] = field(default_factory=tuple)


def _summary(values: Sequence[float]) -> tuple[float, float, float]:
    clean = [v for v in values if v == v]  # drop NaN
    if not clean:
        return float("nan"), float("nan"), float("nan")
    return float(statistics.median(clean)), min(clean), max(clean)


def draw_chart(path: Path | str, title: str, panels: Sequence[Panel]) -> Path:
    """Draw ``panels`` (one above the other) into the PNG ``path``; returns the path.

    Example::

        >>> import tempfile, pathlib
        >>> out = pathlib.Path(tempfile.mkdtemp()) / "demo.png"
        >>> panel = Panel("value 100 B", {"sink": [1.1, 1.2, 1.3]}, "x Spark's writer")
        >>> draw_chart(out, "demo", [panel]).read_bytes()[:4]
        b'\\x89PNG'
    """
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    if not panels:
        raise ValueError("draw_chart needs at least one panel")
    heights = [1.2 + 0.45 * max(1, len(p.ratios)) for p in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, sum(heights) + 0.6),
                             gridspec_kw={"height_ratios": heights}, squeeze=False,
                             layout="constrained")  # room for the suptitle too
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        names = list(panel.ratios)
        stats = [_summary(panel.ratios[n]) for n in names]
        medians = [m for m, _, _ in stats]
        below = [m - lo for m, lo, _ in stats]
        above = [hi - m for m, _, hi in stats]
        runs = max((len(v) for v in panel.ratios.values()), default=0)
        ypos = list(range(len(names)))
        ax.errorbar(medians, ypos, xerr=[below, above], fmt="o", color="#4c72b0",
                    ecolor="#222222", capsize=4, markersize=7)
        ax.axvline(1.0, color="#c44e52", linewidth=1, linestyle="--")
        ax.set_yticks(ypos, names)
        ax.set_ylim(len(names) - 0.5, -0.7)  # first contender on top, room for the labels
        for y, m in zip(ypos, medians, strict=True):
            if m == m:
                ax.annotate(f"{m:.2f}x", (m, y), xytext=(0, 7), textcoords="offset points",
                            ha="center", fontsize=8)
        known = [v for _, lo, hi in stats for v in (lo, hi) if v == v and v > 0] + [1.0]
        low, high = min(known), max(known)
        if high / low > 20:  # one outlier run would squash the rest: a log axis shows all
            ax.set_xscale("log")
            ax.set_xlim(low / 1.3, high * 1.3)
        else:
            ax.set_xlim(0, high * 1.12)
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _pos: f"{v:g}x"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.grid(axis="x", alpha=0.3)
        spread = "min-max over" if runs > 1 else "no spread:"
        ax.set_title(f"{panel.title} (median, {spread} {runs} run{'s' if runs != 1 else ''})",
                     fontsize=10)
        ax.set_xlabel(f"{panel.xlabel} ({panel.better} is better; dashed: 1.0x)", fontsize=9)
        for i, note in enumerate(panel.notes):
            ax.annotate(note, (0, 0), xycoords="axes fraction", xytext=(0, -30 - 11 * i),
                        textcoords="offset points", fontsize=7, color="#555555")
    fig.suptitle(title, fontsize=11)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=100)
    plt.close(fig)
    return out
