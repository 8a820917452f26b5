"""Savepoints into KafkaSink and DeltaSink, and from a Delta table as the source (issue 52,
item 5), on the real services. Each runs the old query as a driver process
(``integration/savepoints/_job.py --variant 1``), takes the savepoint with ``connectors
savepoint`` from the sink's own ledger, and runs the changed query (``--variant 2``: another
projection, 5 shuffle partitions instead of 2, and into Kafka and Delta a deterministic
column added) on a new checkpoint from the savepoint, its sink given it (``resume_from``),
after more input arrived. Then the target, row by row: every id exactly once, nothing open.

- KafkaSink, its driver SIGKILLed after batch 2's slots committed (the savepoint taken
  afterwards from what was recorded);
- DeltaSink, the old query run to its end (the added column through ``merge_schema``);
- a Delta table as the source, into PostgresSink: the savepoint's ``startingVersion``
  (Spark records a Delta source's start nowhere before its first commit: the sink logs
  that it cannot check it).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from connectors.sdk import CrashPoint
from connectors.testing.kill import point_reached, run_driver
from integration.support._driver import REPO
from integration.support._kafka import KafkaTarget
from integration.support._pg import PgTarget

pytestmark = pytest.mark.integration

JOB = "integration.savepoints._job"
OLD, NEW = 1500, 1000


@pytest.fixture
def source(kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[KafkaTarget]:
    monkeypatch.setenv("EOS_KAFKA_BOOTSTRAP", kafka_bootstrap)  # the drivers read it
    target = KafkaTarget(kafka_bootstrap, prefix="sp-src", partitions=3)
    target.create()
    target.produce_input(target.topic, OLD)
    yield target
    target.cleanup()


def _savepoint(tmp_path: Path, checkpoint: Path, sink_id: str, *target: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    out = tmp_path / "savepoint.json"
    done = subprocess.run(
        [sys.executable, "-m", "connectors", "savepoint", *target, "--checkpoint",
         str(checkpoint), "--sink-id", sink_id, "--json", "--output", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    found: dict = json.loads(done.stdout)
    assert found == json.loads(out.read_text())
    return found


def _exact(ids: list[int], total: int) -> None:
    counts = collections.Counter(ids)
    missing = [i for i in range(total) if counts[i] == 0]
    twice = sorted(i for i, n in counts.items() if n > 1)
    assert not missing and not twice and len(counts) == total, (missing[:20], twice[:20])


def test_kafka_sink_sigkilled_then_resumed_from_the_savepoint_is_exact(
        source: KafkaTarget, kafka_bootstrap: str, tmp_path: Path) -> None:
    out = KafkaTarget(kafka_bootstrap, prefix="sp-out", partitions=3)
    out.create()
    try:
        common = ["--sink", "kafka", "--out-topic", out.topic, "--sink-id", out.sink_id,
                  "--topic", source.topic]
        crash_log = tmp_path / "crash.log"
        run = run_driver([*common, "--checkpoint", str(tmp_path / "ck1")], module=JOB,
                         crash=f"after_commit:batch=2:sink={out.sink_id}", crash_log=crash_log)
        assert run.returncode == -9, run.tail()
        assert point_reached(crash_log, CrashPoint.AFTER_COMMIT, out.sink_id, 2)
        sp = _savepoint(tmp_path, tmp_path / "ck1", out.sink_id, "--kafka", kafka_bootstrap)
        assert (sp["batch_id"], sp["committed"]) == (2, True)
        source.produce_input(source.topic, NEW, start=OLD)
        resumed = run_driver([*common, "--checkpoint", str(tmp_path / "ck2"), "--variant",
                              "2", "--starting-offsets",
                              sp["sources"][0]["options"]["startingOffsets"], "--resume-from",
                              str(tmp_path / "savepoint.json")], module=JOB)
        assert resumed.returncode == 0, resumed.tail()
        out.assert_exact(OLD + NEW)  # every id once, read_committed; nothing left open
        values = [m.json() for m in out.messages()]
        assert sum("twice" in v for v in values) > 0 and all(
            v["twice"] == 2 * v["id"] for v in values if "twice" in v)
    finally:
        out.cleanup()


def test_delta_sink_resumed_from_the_savepoint_with_a_column_added_is_exact(
        source: KafkaTarget, kafka_bootstrap: str, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    table, sink_id = str(tmp_path / "out-table"), f"{source.sink_id}-delta"
    common = ["--sink", "delta", "--out-path", table, "--sink-id", sink_id, "--topic",
              source.topic]
    run = run_driver([*common, "--checkpoint", str(tmp_path / "ck1")], module=JOB)
    assert run.returncode == 0, run.tail()
    sp = _savepoint(tmp_path, tmp_path / "ck1", sink_id, "--delta", table)
    assert sp["batch_id"] >= 4 and sp["committed"] is True  # batches of about 300
    source.produce_input(source.topic, NEW, start=OLD)
    resumed = run_driver([*common, "--checkpoint", str(tmp_path / "ck2"), "--variant", "2",
                          "--starting-offsets", sp["sources"][0]["options"]["startingOffsets"],
                          "--resume-from", str(tmp_path / "savepoint.json")], module=JOB)
    assert resumed.returncode == 0, resumed.tail()
    rows = DeltaTable(table).to_pyarrow_table().to_pylist()
    _exact([r["id"] for r in rows], OLD + NEW)
    added = [r for r in rows if r["twice"] is not None]
    assert len(added) == NEW and all(r["twice"] == 2 * r["id"] for r in added)


def test_a_delta_table_as_the_source_resumed_from_the_savepoint_is_exact(
        postgres_conninfo: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from deltalake import write_deltalake

    source = str(tmp_path / "source-table")
    for version in range(5):  # versions 0-4, 300 ids each
        write_deltalake(source, pa.table({"id": pa.array(range(300 * version,
                                                               300 * version + 300),
                                                         pa.int64())}), mode="append")
    pg = PgTarget(postgres_conninfo, prefix="sp_delta")
    try:
        common = ["--source", "delta", "--source-path", source, "--sink", "postgres",
                  "--conninfo", postgres_conninfo, "--table", pg.table, "--ledger-table",
                  pg.ledger, "--sink-id", pg.sink_id]
        run = run_driver([*common, "--checkpoint", str(tmp_path / "ck1"),
                          "--starting-version", "0"], module=JOB)
        assert run.returncode == 0, run.tail()
        sp = _savepoint(tmp_path, tmp_path / "ck1", pg.sink_id, "--postgres", postgres_conninfo,
                        "--ledger-table", pg.ledger)
        (position,) = sp["sources"]
        assert position["kind"] == "delta" and position["options"] == {"startingVersion": "5"}
        for version in range(5, 8):  # 900 more ids in versions 5-7
            write_deltalake(source, pa.table({"id": pa.array(range(300 * version,
                                                                   300 * version + 300),
                                                             pa.int64())}), mode="append")
        resumed = run_driver([*common, "--checkpoint", str(tmp_path / "ck2"), "--variant", "2",
                              "--starting-version", "5", "--resume-from",
                              str(tmp_path / "savepoint.json")], module=JOB)
        assert resumed.returncode == 0, resumed.tail()
        assert "Spark records a Delta source's start nowhere" in resumed.output
        ids = [int(r[0]) for r in pg.execute(f'SELECT id FROM "{pg.table}"')]
        _exact(ids, 2400)
        assert pg.prepared() == []
    finally:
        pg.cleanup()
