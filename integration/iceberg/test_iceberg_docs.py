"""The Iceberg blocks of README.md and docs/iceberg.md, run verbatim where Iceberg has a Spark
runtime (CI: the spark41 lane).

The docs test (``integration/docs``) runs on the test lane's Spark 4.2, which has no Iceberg
runtime, so these blocks are marked illustrative there with the reason naming this file;
here every such block runs as the user would paste it (saved as the file its first line
names, run with this interpreter, ``EOS_EXAMPLE_DIR`` an empty directory), and the table is
read back with pyiceberg (never Spark) and compared row by row. The quick-starts first run
with their driver SIGKILLed after batch 1's snapshot committed and before the ledger recorded
it, then again, as the README says a user may; the change stream runs twice with the same run
id (the rerun writes nothing).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from connectors.testing.kill import DriverRun, run_driver
from integration.docs import _snippets as sn
from integration.iceberg._support import tags_of

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.iceberg]

ROOT = sn.REPO_ROOT
THIS = "integration/iceberg/test_iceberg_docs.py"
EVENTS = [(i, f"user-{i}") for i in range(300)]


def blocks() -> list[sn.Block]:
    """The python blocks whose illustrative reason says this file runs them."""
    found = []
    for doc in ("README.md", "docs/iceberg.md"):
        for block in sn.parse_markdown((ROOT / doc).read_text(), doc):
            if block.lang == "python" and THIS in (block.illustrative or ""):
                found.append(block)
    return found


def table(warehouse: Path, name: str) -> Any:
    from pyiceberg.table import StaticTable

    meta = warehouse / "db" / name / "metadata"
    version = int((meta / "version-hint.text").read_text().strip())
    return StaticTable.from_metadata(str(meta / f"v{version}.metadata.json"))


def rows(warehouse: Path, name: str, columns: list[str]) -> list[tuple[Any, ...]]:
    arrow = table(warehouse, name).scan().to_arrow()
    return sorted(zip(*[arrow.column(c).to_pylist() for c in columns], strict=True))


def run(block: sn.Block, work: Path, *args: str, crash: str | None = None) -> DriverRun:
    name = block.python_name
    assert name, f"{block.where}: the first line names no file"
    script = work.parent / name
    script.write_text(block.code)
    return run_driver(list(args), command=[sys.executable, str(script)], root=work.parent,
                      env={"EOS_EXAMPLE_DIR": str(work)}, crash=crash,
                      crash_log=work.parent / "crash.log")


def test_every_iceberg_block_of_the_docs_runs_verbatim_and_is_exact(tmp_path: Path) -> None:
    found = blocks()
    names = sorted(b.python_name or "" for b in found)
    assert names == ["iceberg_changes.py", "iceberg_events.py", "quickstart_iceberg.py"], (
        names)  # the docs name this file for exactly these: none is skipped silently
    for i, block in enumerate(found):
        work = tmp_path / f"page-{i}" / "work"
        work.mkdir(parents=True)
        where = block.where
        if block.python_name == "iceberg_changes.py":
            for _ in range(2):  # the rerun of run id 0 writes nothing
                done = run(block, work, "0")
                assert done.returncode == 0, f"{where}\n{done.tail()}"
            got = rows(work / "warehouse", "accounts", ["id", "seq", "name", "score"])
            sn.exact(got, [(1, 4, "ada", 11), (3, 7, "cy", 31)], f"{where}: lake.db.accounts")
            assert tags_of(table(work / "warehouse", "accounts"), "accounts-cdc") == {0: 1}
            continue
        killed = run(block, work, crash="after_decision:batch=1:sink=events-iceberg")
        assert killed.returncode == -9, f"{where}: not killed\n{killed.tail()}"
        assert tags_of(table(work / "warehouse", "events"), "events-iceberg") == {0: 1, 1: 1}
        again = run(block, work)
        assert again.returncode == 0, f"{where}\n{again.tail()}"
        sn.exact(rows(work / "warehouse", "events", ["id", "name"]), EVENTS,
                 f"{where}: lake.db.events after a kill and a rerun")
        assert tags_of(table(work / "warehouse", "events"), "events-iceberg") == \
            {0: 1, 1: 1, 2: 1}
