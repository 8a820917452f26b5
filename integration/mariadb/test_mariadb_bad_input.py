"""Bad input into MariaDBSink on real Spark and a real MariaDB. ``LOAD DATA LOCAL`` turns a
bad value into a warning and stores a changed value (a NULL in a NOT NULL column becomes
``''``, a long string is cut); the sink reads the load's warnings and refuses the batch:
its error names the column, the row number and the fix, quotes no value, and nothing of the
batch is committed (no row, no decision, no branch left prepared). After the fix the
restarted query delivers every row exactly once."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from integration.mariadb.test_mariadb_kill import ROWS_PER_FILE, MariaJob, Target

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FILES = 3
BAD_ID = 10_000


def test_a_null_and_a_too_long_value_are_refused_then_exact_after_the_fix(
        tmp_path: Path, mariadb_url: str) -> None:
    target = Target(mariadb_url)
    try:
        target.execute(f"ALTER TABLE {target.sql()} MODIFY name VARCHAR(64) NOT NULL")
        job = MariaJob(tmp_path, target, files=FILES)
        # One more file (the last micro-batch): a row without a name, one with a long one.
        bad = job.input / f"part-{FILES:05d}.json"
        bad.write_text(json.dumps({"id": BAD_ID, "name": None, "amount": 1.0,
                                   "ts": "2026-01-01T00:00:00Z"}) + "\n"
                       + json.dumps({"id": BAD_ID + 1, "name": "secret-" + "x" * 80,
                                     "amount": 2.0, "ts": "2026-01-01T00:00:00Z"}) + "\n")
        later = max(p.stat().st_mtime for p in job.input.glob("part-*.json")) + 10
        os.utime(bad, (later, later))

        first = job.run()
        assert first.returncode != 0, first.tail()
        out = first.output
        assert "BadInputError" in out and "column 'name', row 1" in out, out[-3000:]
        assert "column 'name', row 2" in out, "the long value: its column and row too"
        assert "secret-" not in out, "no row value in the error"
        assert target.ledger_states() == dict.fromkeys(range(FILES), "COMMITTED")
        assert target.ids() == list(range(job.total)), "the batches before it, once each"
        assert target.prepared() == []

        target.execute(f"ALTER TABLE {target.sql()} MODIFY name VARCHAR(200) NULL")
        second = job.run()
        assert second.returncode == 0, second.tail()
        assert target.ids() == [*range(job.total), BAD_ID, BAD_ID + 1]
        names = dict(target.execute(f"SELECT id, name FROM {target.sql()} WHERE id >= %s",
                                    (BAD_ID,)))
        assert names == {BAD_ID: None, BAD_ID + 1: "secret-" + "x" * 80}
        assert target.ledger_states() == dict.fromkeys(range(FILES + 1), "COMMITTED")
        assert target.prepared() == []
    finally:
        target.cleanup()


def test_a_missing_table_and_an_extra_column_are_refused_before_any_task(
        tmp_path: Path, mariadb_url: str) -> None:
    target = Target(mariadb_url)
    try:
        target.execute(f"ALTER TABLE {target.sql()} DROP COLUMN amount")
        job = MariaJob(tmp_path, target, files=1)
        run = job.run()
        assert run.returncode != 0
        assert "column(s) amount" in run.output and "ADD COLUMN" in run.output, run.tail()
        assert target.ids() == [] and target.ledger_states() == {}
        assert job.total == ROWS_PER_FILE
    finally:
        target.cleanup()
