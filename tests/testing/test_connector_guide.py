"""docs/connector-guide.md: the hooks it says an author must write are the families' abstract
methods, and its shortest sink of each family implements exactly those and passes the kit.

(integration/docs/test_docs_snippets.py runs the page's blocks as a user would, under
pytest; this test needs no service and runs with the unit tests.)
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors.sdk import DriverCommitSink, PreparedTransactionSink, TaskCommitSink
from connectors.testing import SinkHarness, run_conformance

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "connector-guide.md"
FAMILIES: dict[str, type[Any]] = {
    "PreparedTransactionSink": PreparedTransactionSink,
    "TaskCommitSink": TaskCommitSink,
    "DriverCommitSink": DriverCommitSink,
}
#: The guide's sink of each family: (module the block is saved as, class).
SINKS = {
    "PreparedTransactionSink": ("staged_files_sink", "StagedFilesSink"),
    "TaskCommitSink": ("slot_files_sink", "SlotFilesSink"),
    "DriverCommitSink": ("batch_file_sink", "BatchFileSink"),
}
_ROW = re.compile(r"^\| `(\w+)(?:\[H\])?` \| (\d+) \| (.+) \|$", re.M)


def stated_counts() -> dict[str, tuple[int, set[str]]]:
    """The guide's table: template -> (how many hooks, which)."""
    text = GUIDE.read_text(encoding="utf-8")
    return {m.group(1): (int(m.group(2)), set(re.findall(r"`(\w+)`", m.group(3))))
            for m in _ROW.finditer(text)}


def test_the_guide_counts_every_family_s_abstract_hooks() -> None:
    stated = stated_counts()
    assert stated.keys() == FAMILIES.keys()
    for name, family in FAMILIES.items():
        count, hooks = stated[name]
        assert hooks == set(family.__abstractmethods__), name
        assert count == len(family.__abstractmethods__) == len(hooks), name
        assert "create_ledger" in hooks  # inherited from TwoPhaseCommitSink


@pytest.fixture(scope="module")
def guide_modules(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The guide's python blocks saved as the files their first lines name, importable."""
    folder = tmp_path_factory.mktemp("guide")
    blocks = re.findall(r"^```python\n(.*?)^```$", GUIDE.read_text(encoding="utf-8"),
                        re.M | re.S)
    for code in blocks:
        name = re.match(r"# (\w+\.py)", code)
        assert name is not None, code[:80]
        (folder / name.group(1)).write_text(code, encoding="utf-8")
    sys.path.insert(0, str(folder))
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))
        for module, _ in SINKS.values():
            sys.modules.pop(module, None)


def _sink_class(family: str) -> type[Any]:
    module, cls = SINKS[family]
    found: type[Any] = getattr(importlib.import_module(module), cls)
    return found


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_guide_s_sink_writes_exactly_the_counted_hooks(family: str,
                                                           guide_modules: Path) -> None:
    sink = _sink_class(family)
    assert issubclass(sink, FAMILIES[family]) and not sink.__abstractmethods__
    hooks = {n for n in vars(sink) if not n.startswith("_")}
    assert hooks == stated_counts()[family][1], family  # no optional hook: the shortest


class _Files(SinkHarness):
    def __init__(self, sink: type[Any], path: Path) -> None:
        self.sink, self.path = sink, path

    def new_sink(self, **overrides: Any) -> Any:
        return self.sink(self.path, **{"sink_id": "mine", **overrides})

    def committed_rows(self) -> list[tuple[Any, ...]]:
        import pyarrow.parquet as pq

        rows = [r for f in (self.path / "data").glob("*.parquet")
                for r in pq.read_table(f).to_pylist()]
        return [(r["batch"], r["seq"], r["payload"]) for r in rows]

    def lingering_transactions(self) -> int:
        return len(list((self.path / "_staged").glob("*")))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_guide_s_sink_passes_the_kit(family: str, guide_modules: Path,
                                         tmp_path: Path) -> None:
    sink = _sink_class(family)
    targets = iter(range(1000))
    run_conformance(lambda: _Files(sink, tmp_path / f"target-{next(targets)}"))
