"""IcebergSink on real Spark (4.1) and a real Iceberg table: drivers SIGKILLed at every crash
point of the COMMIT_ON_DRIVER family and at random moments, restarted from the same
checkpoint; a concurrent writer, a compaction and snapshot expiry between a crash and the
restart. The table is read back with pyiceberg (never Spark) and compared with the input row
by row: nothing missing, nothing twice; one tagged snapshot per batch; no intent left.

The driver is ``examples/stream_to_iceberg.py`` (files source: one file per micro-batch)
into a Hadoop catalog on a local warehouse; maintenance runs in a Spark driver of its own
(``integration.iceberg._support.maintain``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from connectors.sdk import CrashPoint
from examples.stream_to_files import make_input_files
from integration.iceberg._support import (
    intents,
    ledger_batches,
    ledger_root,
    maintain,
    snapshot_tags,
    table_rows,
)
from integration.support._delta import input_rows
from integration.support._driver import (
    REPO,
    SEED,
    DriverRun,
    KillJob,
    file_batches,
    finished_batches,
    kill_at_each,
    kill_at_random,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.iceberg]

SINK = "events-iceberg"
FILES, ROWS = 4, 150


class IcebergJob(KillJob):
    module = "examples.stream_to_iceberg"

    def __init__(self, root: Path, files: int = FILES) -> None:
        super().__init__(root, sink_id=SINK, cwd=REPO)
        self.input = root / "in"
        self.warehouse = root / "wh"
        self.batches = files
        self.total = make_input_files(self.input, files, ROWS)

    def args(self) -> list[str]:
        return ["--source", "files", "--input", str(self.input), "--checkpoint",
                str(self.checkpoint), "--warehouse", str(self.warehouse), "--sink-id", SINK]

    def assert_exact(self, extra: Sequence[tuple[Any, ...]] = ()) -> None:
        want = sorted([*input_rows(self.total), *extra])
        got = table_rows(self.warehouse)
        assert len(got) == len(want), (len(got), len(want))
        assert got == want, "the table differs from the input row by row"
        assert intents(self.warehouse, SINK) == [], "intents of recorded batches are pruned"
        # Spark's micro-batches, not the files: a kill can put two files in one batch.
        batches = finished_batches(self.checkpoint)
        assert 0 < batches <= self.batches, (batches, self.batches)
        assert ledger_batches(self.warehouse, SINK) == list(range(batches))


# The points of the family in the order a restarted driver meets them: before the commit
# (intent recorded), after the table's commit with nothing recorded, after everything.
PLAN = [
    (CrashPoint.BEFORE_DECISION, SINK, 1),
    (CrashPoint.AFTER_DECISION, SINK, 2),
    (CrashPoint.AFTER_COMMIT, SINK, 3),
]


def status(job: IcebergJob) -> tuple[int, dict[str, Any]]:
    """``connectors status --iceberg <the table's location> --json`` as an operator runs it
    (no Spark): its exit code and the sink's entry."""
    proc = subprocess.run([sys.executable, "-m", "connectors", "status", "--iceberg",
                           str(job.warehouse / "db" / "events"), "--sink-id", SINK, "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc.returncode, json.loads(proc.stdout)[0]


def test_killed_at_every_crash_point_then_at_random(tmp_path: Path) -> None:
    job = IcebergJob(tmp_path / "points")

    def after_kill(point: CrashPoint, sink: str, batch: int, run: DriverRun) -> None:
        tags = snapshot_tags(job.warehouse, SINK)
        # the table holds the batch exactly from AFTER_DECISION on (the commit is the decision)
        assert (batch in tags) == (point is not CrashPoint.BEFORE_DECISION), (point, tags)
        assert all(n == 1 for n in tags.values()), tags
        if point is CrashPoint.AFTER_DECISION:  # the table is ahead of the ledger: status says so
            code, entry = status(job)
            assert code == 1 and entry["last_committed"] == batch - 1, entry
            assert entry["unfinished"] == [batch], entry
            assert f"last batch committed by this sink = {batch}" in " ".join(entry["notes"])

    kill_at_each(job, PLAN, after_kill=after_kill)
    job.assert_exact()
    code, entry = status(job)
    assert code == 0 and entry["last_committed"] == FILES - 1 and entry["unfinished"] == []
    assert snapshot_tags(job.warehouse, SINK) == dict.fromkeys(range(FILES), 1)

    rnd = IcebergJob(tmp_path / "random", files=6)
    kill_at_random(rnd, progress=lambda: len(snapshot_tags(rnd.warehouse, SINK)),
                   runs=2, seed=SEED)
    rnd.assert_exact()
    assert snapshot_tags(rnd.warehouse, SINK) == dict.fromkeys(
        range(finished_batches(rnd.checkpoint)), 1)


def _other_rows(start: int, n: int) -> list[tuple[Any, ...]]:
    return [(-i, f"other-{i}", 0.0, 0) for i in range(start, start + n)]


def _insert_other(start: int, n: int) -> str:
    values = ", ".join(f"({-i}, 'other-{i}', 0.0D, TIMESTAMP '1970-01-01 00:00:00 UTC')"
                       for i in range(start, start + n))
    return f"INSERT INTO lake.db.events (id, name, amount, ts) VALUES {values}"


def test_concurrent_writer_compaction_and_expiry_between_crash_and_restart(
        tmp_path: Path) -> None:
    """Killed with batch 1 in the table and not in the ledger; before the restart another
    writer commits, the files are compacted, and every snapshot but the last three is
    expired (batch 0's goes): the restart finds batch 1 on the chain and does not write it
    again. Then killed the same way at batch 2, and everything but the current snapshot is
    expired: the sink cannot prove batch 2 either way and refuses, writing nothing; the fix
    its error names (the table holds the rows: delete them and the intent) ends exact."""
    job = IcebergJob(tmp_path / "maint")
    first = job.run(crash=f"after_decision:batch=1:sink={SINK}")
    assert first.returncode == -9, first.tail()
    assert job.reached(CrashPoint.AFTER_DECISION, 1)
    assert snapshot_tags(job.warehouse, SINK) == {0: 1, 1: 1}
    assert intents(job.warehouse, SINK) == [1]
    maintain(job.warehouse, _insert_other(1, 5),
             "CALL lake.system.rewrite_data_files(table => 'db.events', "
             "options => map('min-input-files', '2'))",
             "CALL lake.system.expire_snapshots(table => 'db.events', "
             "older_than => current_timestamp(), retain_last => 3)")
    assert 0 not in snapshot_tags(job.warehouse, SINK), "batch 0's snapshot was expired"
    second = job.run(crash=f"after_decision:batch=2:sink={SINK}")
    assert second.returncode == -9, second.tail()
    assert "batch 1: the table's snapshots say committed" in second.output, second.tail()
    maintain(job.warehouse, _insert_other(6, 5),
             "CALL lake.system.expire_snapshots(table => 'db.events', "
             "older_than => current_timestamp(), retain_last => 1)")
    refused = job.run()
    assert refused.returncode != 0, refused.tail()
    assert "cannot be proved" in refused.output and "expire_snapshots" in refused.output, \
        refused.tail()
    # Batch 2's file (the file source orders files by modification time, not by name).
    part = next(name for name, batch in file_batches(job.checkpoint).items() if batch == 2)
    low = int(part.split("-")[1].split(".")[0]) * ROWS
    rows = table_rows(job.warehouse)
    batch2 = [r for r in rows if low <= r[0] < low + ROWS]
    assert len(batch2) == ROWS, "the refusal wrote nothing: batch 2 is in the table once"
    assert len(rows) == 3 * ROWS + 10, "batches 0-2 once each, and the other writer's rows"
    # The fix the error names: the table holds the batch, so delete its rows and the intent.
    maintain(job.warehouse, f"DELETE FROM lake.db.events WHERE id >= {low} "
                            f"AND id < {low + ROWS}")
    (ledger_root(job.warehouse, SINK) / "intents" / f"{2:020d}.json").unlink()
    last = job.run()
    assert last.returncode == 0, last.tail()
    job.assert_exact(_other_rows(1, 10))


def test_orphan_file_removal_leaves_the_ledger_beside_the_table(tmp_path: Path) -> None:
    """Iceberg's remove_orphan_files deletes every file under the table's location that its
    metadata does not list and that is older than its cut-off (3 days by default): the
    sink's ledger (``<table>/_connectors/<sink_id>``) must survive it, or a restart would
    lose its decisions. Every file is made 4 days old first; a stray data file proves the
    procedure did delete orphans; the restart then writes nothing again."""
    job = IcebergJob(tmp_path / "orphans", files=2)
    assert job.run().returncode == 0
    job.assert_exact()
    table = job.warehouse / "db" / "events"
    stray = table / "data" / "00000-0-stray.parquet"
    stray.write_bytes(b"not listed in any manifest")
    old = time.time() - 4 * 86_400
    for path in table.rglob("*"):
        os.utime(path, (old, old))
    ledger = sorted(p.relative_to(table) for p in ledger_root(job.warehouse, SINK).rglob("*"))
    assert ledger, "the ledger has files"
    removed = maintain(job.warehouse,
                       "CALL lake.system.remove_orphan_files(table => 'db.events')")[0]
    assert any(str(row[0]).endswith("00000-0-stray.parquet") for row in removed), removed
    assert not stray.exists()
    assert sorted(p.relative_to(table)
                  for p in ledger_root(job.warehouse, SINK).rglob("*")) == ledger
    again = job.run()
    assert again.returncode == 0, again.tail()
    job.assert_exact()
    assert snapshot_tags(job.warehouse, SINK) == dict.fromkeys(range(2), 1)
