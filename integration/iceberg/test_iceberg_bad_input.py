"""Bad input into IcebergSink on real Spark and a real Iceberg table: a batch whose columns the
table lacks, then a NULL in a column the table requires. Each is refused with an error that
names the column and the fix, commits nothing (no tagged snapshot, no row), and after the fix
the restarted query delivers every row exactly once (read back with pyiceberg)."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import pytest

from examples.stream_to_files import make_input_files
from integration.iceberg._support import (
    ledger_batches,
    maintain,
    row_count,
    snapshot_tags,
    table_rows,
)
from integration.support._delta import input_rows
from integration.support._driver import REPO, run_driver

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.iceberg]

SINK = "events-iceberg"
FILES, ROWS = 4, 50
BAD_ID = 10_000
BAD_TS = dt.datetime(2026, 1, 1, 1, 0, 0, tzinfo=dt.UTC)


def test_bad_columns_then_a_null_in_a_required_column_are_refused_then_exact(
        tmp_path: Path) -> None:
    source, warehouse, checkpoint = tmp_path / "in", tmp_path / "wh", tmp_path / "ckpt"
    total = make_input_files(source, FILES, ROWS)
    # The last file (the last micro-batch) holds a row without an amount.
    bad = source / f"part-{FILES:05d}.json"
    bad.write_text(json.dumps({"id": BAD_ID, "name": "no-amount", "amount": None,
                               "ts": BAD_TS.strftime("%Y-%m-%dT%H:%M:%SZ")}) + "\n")
    later = max(p.stat().st_mtime for p in source.glob("part-*.json")) + 10
    os.utime(bad, (later, later))
    # The table requires amount and has no ts column.
    maintain(warehouse, "CREATE NAMESPACE IF NOT EXISTS lake.db",
             "CREATE TABLE lake.db.events (id BIGINT, name STRING, amount DOUBLE NOT NULL) "
             "USING iceberg")

    def run() -> str:
        result = run_driver(["--source", "files", "--input", str(source), "--checkpoint",
                             str(checkpoint), "--warehouse", str(warehouse), "--sink-id",
                             SINK], module="examples.stream_to_iceberg", root=REPO)
        return result.output if result.returncode != 0 else ""

    out = run()
    assert "BadInputError" in out and "column(s) ts" in out and "ADD COLUMN" in out, out[-3000:]
    assert snapshot_tags(warehouse, SINK) == {}, "the refused batch committed nothing"
    assert row_count(warehouse) == 0

    maintain(warehouse, "ALTER TABLE lake.db.events ADD COLUMN ts TIMESTAMP")
    out = run()
    assert "BadInputError" in out and "'amount' is required (NOT NULL)" in out, out[-3000:]
    assert "DROP NOT NULL" in out and "no-amount" not in out, "no row value in the error"
    assert snapshot_tags(warehouse, SINK) == dict.fromkeys(range(FILES), 1)
    assert table_rows(warehouse) == input_rows(total), "the batches before it, once each"

    maintain(warehouse, "ALTER TABLE lake.db.events ALTER COLUMN amount DROP NOT NULL")
    assert run() == "", "the restart after the fix ends cleanly"
    want = [*input_rows(total), (BAD_ID, "no-amount", None, int(BAD_TS.timestamp()) * 10**6)]
    assert table_rows(warehouse) == sorted(want), "every row once after the fix"
    assert snapshot_tags(warehouse, SINK) == dict.fromkeys(range(FILES + 1), 1)
    assert ledger_batches(warehouse, SINK) == list(range(FILES + 1))
