"""The example file-system sink (``examples/fs_sink.py``, written only against the public
template) passes the same conformance kit as our own sinks, on a real directory."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import pytest

from connectors.testing import SinkConformanceTests, SinkHarness

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from examples.fs_sink import FileSystemSink, read_output

_count = itertools.count()


class FileSystemHarness(SinkHarness):
    """One empty directory; every sink built on it is a restarted driver."""

    def __init__(self, root: Path) -> None:
        self.path = root / f"target-{next(_count)}"

    def new_sink(self, **overrides: Any) -> FileSystemSink:
        return FileSystemSink(self.path, **{"sink_id": "example", **overrides})

    def committed_rows(self) -> list[tuple[Any, ...]]:
        table = read_output(self.path)
        if table is None:
            return []
        return list(zip(*(table.column(c).to_pylist() for c in ("batch", "seq", "payload")),
                        strict=True))

    def lingering_transactions(self) -> int:
        staging = self.path / "_staging"
        return sum(1 for _ in staging.iterdir()) if staging.exists() else 0


class TestExampleFileSystemSink(SinkConformanceTests):
    @pytest.fixture(autouse=True)
    def _root(self, tmp_path: Path) -> None:
        self.root = tmp_path

    def make_harness(self) -> SinkHarness:
        return FileSystemHarness(self.root)
