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
  that it cannot check it);
- a FanOut of the three, SIGKILLed after a decision: the fan-out's savepoint resumes its
  ledger and every target's.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from connectors.sdk import CrashPoint
from connectors.testing.kill import point_reached, run_driver
from integration.savepoints._support import JOB, NEW, OLD, kafka_source, savepoint, take
from integration.support._kafka import KafkaTarget
from integration.support._pg import PgTarget, prepared_of

pytestmark = pytest.mark.integration


@pytest.fixture
def source(kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[KafkaTarget]:
    yield from kafka_source(kafka_bootstrap, monkeypatch, "sp-src")


def _savepoint(tmp_path: Path, checkpoint: Path, sink_id: str, *target: str) -> dict[str, Any]:
    return savepoint(checkpoint, sink_id, tmp_path / "savepoint.json", *target)


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


def test_a_fan_out_sigkilled_then_resumed_from_its_savepoint_is_exact_in_every_target(
        source: KafkaTarget, kafka_bootstrap: str, postgres_conninfo: str,
        tmp_path: Path) -> None:
    """A FanOut of PostgresSink, KafkaSink and DeltaSink, its driver SIGKILLed after batch
    2's decision (in the fan-out's ledger, not yet in every target): its savepoint is
    refused until the old query ran again and finished batch 2 (Kafka and Delta write after
    the decision, from the batch's rows); then the fan-out's savepoint (its ledger is
    PostgreSQL's) resumes it and every target."""
    from deltalake import DeltaTable

    pg = PgTarget(postgres_conninfo, prefix="sp_fan")
    out = KafkaTarget(kafka_bootstrap, prefix="sp-fan-out", partitions=3)
    out.create()
    table = str(tmp_path / "fan-table")
    try:
        common = ["--sink", "fanout", "--sink-id", pg.sink_id, "--topic", source.topic,
                  "--conninfo", postgres_conninfo, "--table", pg.table, "--ledger-table",
                  pg.ledger, "--out-topic", out.topic, "--out-path", table]
        crash_log = tmp_path / "crash.log"
        run = run_driver([*common, "--checkpoint", str(tmp_path / "ck1")], module=JOB,
                         crash=f"after_decision:batch=2:sink={pg.sink_id}", crash_log=crash_log)
        assert run.returncode == -9, run.tail()
        assert point_reached(crash_log, CrashPoint.AFTER_DECISION, pg.sink_id, 2)
        where = ("--postgres", postgres_conninfo, "--ledger-table", pg.ledger)
        code, _, err = take(tmp_path / "ck1", pg.sink_id, tmp_path / "savepoint.json", *where)
        assert code == 2 and "Run the old query once more" in err, err
        again = run_driver([*common, "--checkpoint", str(tmp_path / "ck1")], module=JOB)
        assert again.returncode == 0, again.tail()  # replays batch 2, reads to the end
        sp = _savepoint(tmp_path, tmp_path / "ck1", pg.sink_id, *where)
        assert sp["batch_id"] >= 2 and sp["committed"] is True
        source.produce_input(source.topic, NEW, start=OLD)
        resumed = run_driver([*common, "--checkpoint", str(tmp_path / "ck2"), "--variant", "2",
                              "--starting-offsets",
                              sp["sources"][0]["options"]["startingOffsets"], "--resume-from",
                              str(tmp_path / "savepoint.json")], module=JOB)
        assert resumed.returncode == 0, resumed.tail()
        total = OLD + NEW
        _exact([int(r[0]) for r in pg.execute(f'SELECT id FROM "{pg.table}"')], total)
        assert prepared_of(postgres_conninfo, f"{pg.sink_id}-pg") == []
        out.assert_exact(total)
        _exact([r["id"] for r in DeltaTable(table).to_pyarrow_table().to_pylist()], total)
    finally:
        out.cleanup()
        pg.cleanup()
