"""The benchmarks' charts (benchmarks/_chart.py): a small table becomes a valid PNG whose
bars carry the spread over the runs."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from benchmarks._chart import Panel, _summary, default_chart_path, draw_chart


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def test_a_small_table_draws_a_valid_png(tmp_path: Path) -> None:
    panels = [
        Panel("value 100 B", {"kafka-sink": [1.05, 1.12, 1.20], "plain-producer": [2.0, 2.4]},
              "x Spark's writer (its time over the contender's)"),
        Panel("100-record batches", {"kafka-sink": [1.8]}, "x Spark's writer", better="lower"),
    ]
    out = draw_chart(tmp_path / "sub" / "bench.png", "a bench", panels)
    data = out.read_bytes()
    width, height = _png_size(data)
    assert (width, height) > (300, 200)
    matplotlib_image = pytest.importorskip("matplotlib.image")
    pixels = matplotlib_image.imread(out)  # decodes whole: not just a header
    assert pixels.shape[:2] == (height, width)


def test_the_error_bars_are_the_min_max_over_the_runs() -> None:
    assert _summary([1.2, 1.0, 1.5]) == (1.2, 1.0, 1.5)
    assert _summary([2.0]) == (2.0, 2.0, 2.0)


def test_no_panel_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one panel"):
        draw_chart(tmp_path / "x.png", "empty", [])


def test_the_default_place_is_benchmarks_charts() -> None:
    path = default_chart_path("kafka_bench")
    assert path.parts[-3:] == ("benchmarks", "charts", "kafka_bench.png")
