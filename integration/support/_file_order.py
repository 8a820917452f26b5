"""The longest test files first: what keeps both of ``scripts/test``'s workers busy to the end.

pytest-xdist's ``--dist loadfile`` hands each worker a file at a time in collection order;
a long file that starts last runs alone while the other worker idles (measured: a 10-minute
file last costs up to 10 minutes of one core). Ordering the files longest first (the classic
longest-processing-time rule) leaves the short ones to fill the end. Each file's seconds come
from ``integration/file_seconds.json``, which ``.ci/budget.py --file-seconds`` writes from a
run's JUnit reports; a file it does not list (new since) counts as :data:`UNKNOWN_SECONDS`.
Within a file the order is unchanged, and the same on every worker (xdist requires that).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

#: Where the measured seconds per file live (repository-relative paths as keys).
FILE_SECONDS = Path(__file__).resolve().parents[1] / "file_seconds.json"
#: A file the table does not know yet: placed as a middling integration file.
UNKNOWN_SECONDS = 60.0


def file_seconds(path: Path = FILE_SECONDS) -> dict[str, float]:
    """The table, empty when absent or unreadable (the order then stays collection order)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def longest_files_first(items: list[pytest.Item], seconds: dict[str, float] | None = None) -> None:
    """Reorder ``items`` in place: files by their seconds, longest first; stable within."""
    table = file_seconds() if seconds is None else seconds
    if not table:
        return
    root = FILE_SECONDS.parent.parent

    def key(item: pytest.Item) -> float:
        try:
            rel = Path(str(item.path)).resolve().relative_to(root).as_posix()
        except ValueError:
            return 0.0
        return -table.get(rel, UNKNOWN_SECONDS)

    items.sort(key=key)  # list.sort is stable: a file's tests keep their order
