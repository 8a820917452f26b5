"""Savepoints on the real services (issue 52, steps 1-4): a Kafka source into PostgresSink.

Each test runs the old query (``integration/savepoints/_job.py --variant 1``) as a driver
process, ends it, takes the savepoint with ``connectors savepoint`` and starts the changed
query (``--variant 2``: another projection, 5 shuffle partitions instead of 2, a shuffle on
``id``) on a new checkpoint from the savepoint's ``startingOffsets``, its sink given the
savepoint (``resume_from``), after more records arrived. Then the table, row by row: every
id exactly once, each source partition's rows exactly the records below the savepoint's
offset for the old query; nothing left prepared; the sink bound to the new query.

- stopped with a savepoint: ``--stop-pid`` sends SIGTERM to the driver, whose
  ``stop_on_sigterm`` stops it gracefully, waits for it to end, then reads the ledger and
  the checkpoint;
- SIGKILLed right after batch 2's decision (its transactions prepared, not committed): the
  savepoint taken afterwards names batch 2, decided; the changed query's sink commits
  batch 2 first, then reads on from where batch 2 ended (an offset one record too early
  would write a record twice, one too late lose one: the row-by-row check sees both).

A resume one record too early and one too late in a partition: each refused before
anything is written (the driver fails naming both positions; the table, the ledger's
binding and the prepared transactions unchanged), then the right start is exact.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors.sdk import CrashPoint
from connectors.testing.kill import point_reached, run_driver
from integration.savepoints._support import JOB, NEW, OLD, kafka_source
from integration.savepoints._support import savepoint as savepoint_of
from integration.support._driver import REPO, run_cli
from integration.support._kafka import KafkaTarget
from integration.support._pg import PgTarget

pytestmark = pytest.mark.integration



@pytest.fixture
def pg(postgres_conninfo: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[PgTarget]:
    monkeypatch.setenv("EOS_POSTGRES_CONNINFO", postgres_conninfo)  # the CLI reads it
    target = PgTarget(postgres_conninfo, prefix="savepoint")
    yield target
    target.cleanup()


@pytest.fixture
def source(kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[KafkaTarget]:
    yield from kafka_source(kafka_bootstrap, monkeypatch, "savepoint-in")


def _job_args(pg: PgTarget, source: KafkaTarget, checkpoint: Path, variant: int,
              starting: str, *extra: str) -> list[str]:
    return ["--sink", "postgres", "--conninfo", pg.conninfo, "--table", pg.table,
            "--sink-id", pg.sink_id, "--ledger-table", pg.ledger, "--topic", source.topic,
            "--checkpoint", str(checkpoint), "--variant", str(variant), "--starting-offsets",
            starting, *extra]


def _target(pg: PgTarget) -> tuple[str, ...]:
    """``connectors savepoint``'s target arguments for the sink's ledger."""
    return ("--postgres-env", "EOS_POSTGRES_CONNINFO", "--ledger-table", pg.ledger)


def _old_query_then_savepoint(pg: PgTarget, source: KafkaTarget, tmp_path: Path,
                              *form: str) -> tuple[dict[str, Any], str, dict[str, int]]:
    """The old query reads every record there is; its savepoint, the topic and the
    savepoint's end offsets; then the new records arrive."""
    run = run_driver(_job_args(pg, source, tmp_path / "ck1", 1, "earliest", *form), module=JOB)
    assert run.returncode == 0, run.tail()
    found = savepoint_of(tmp_path / "ck1", pg.sink_id, tmp_path / "savepoint.json", *_target(pg))
    ((topic, ends),) = json.loads(found["sources"][0]["options"]["startingOffsets"]).items()
    assert sum(ends.values()) == OLD  # the old query read everything there was
    source.produce_input(source.topic, NEW, start=OLD)
    return found, topic, ends


def _rows(pg: PgTarget) -> list[tuple[int, int]]:
    return [(int(i), int(p)) for i, p in pg.execute(
        f'SELECT id, src_partition FROM "{pg.table}"')]


def _assert_savepoint_matches_the_table(savepoint: dict[str, Any],
                                        rows: list[tuple[int, int]]) -> None:
    """The old query's rows, per source partition, are exactly the records below the
    savepoint's end offset of that partition (every partition starts at offset 0)."""
    (position,) = savepoint["sources"]
    assert position["kind"] == "kafka" and position["refusal"] is None, position
    (ends,) = json.loads(position["options"]["startingOffsets"]).values()
    per_partition = collections.Counter(p for _, p in rows)
    assert {int(p): n for p, n in ends.items() if n} == dict(per_partition), (ends,
                                                                            per_partition)


def _resume_and_check(pg: PgTarget, source: KafkaTarget, tmp_path: Path, sp_file: Path,
                      produce: bool = True) -> None:
    if produce:
        source.produce_input(source.topic, NEW, start=OLD)
    savepoint = json.loads(sp_file.read_text())
    starting = savepoint["sources"][0]["options"]["startingOffsets"]
    run = run_driver(_job_args(pg, source, tmp_path / "ck2", 2, starting, "--resume-from",
                               str(sp_file)), module=JOB)
    assert run.returncode == 0, run.tail()
    ids = collections.Counter(i for i, _ in _rows(pg))
    total = OLD + NEW
    missing = [i for i in range(total) if ids[i] == 0]
    twice = sorted(i for i, n in ids.items() if n > 1)
    assert not missing and not twice and len(ids) == total, (missing[:20], twice[:20])
    assert pg.prepared() == []
    assert set(pg.ledger_states().values()) == {"COMMITTED"}
    assert _bound(pg) != savepoint["query_id"]  # the new query's, from now on
    # The operator sees where the bound query came from.
    code, statuses, err = run_cli("status", "--postgres-env", "EOS_POSTGRES_CONNINFO",
                                  "--ledger-table", pg.ledger, "--sink-id", pg.sink_id)
    assert code == 0, err
    (status,) = statuses
    (link,) = status["lineage"]
    assert (link["from_query_id"], link["batch_id"], link["query_id"]) == (
        savepoint["query_id"], savepoint["batch_id"], _bound(pg))
    assert any(note.startswith("lineage: query ") for note in status["notes"])


def _bound(pg: PgTarget) -> str:
    ((query,),) = pg.execute(f'SELECT query_id FROM "{pg.ledger}_bindings" WHERE sink_id = %s',
                             [pg.sink_id])
    return str(query)


def test_stopped_with_a_savepoint_then_a_changed_query_from_it_is_exact(
        pg: PgTarget, source: KafkaTarget, tmp_path: Path) -> None:
    ck1 = tmp_path / "ck1"
    log = (tmp_path / "old.log").open("w")
    driver = subprocess.Popen(
        [sys.executable, "-m", JOB, *_job_args(pg, source, ck1, 1, "earliest", "--trigger",
                                               "continuous", "--max-offsets", "200",
                                               "--on-sigterm")],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable})
    try:
        deadline = time.monotonic() + 240
        while len(pg.ledger_states()) < 3:  # a few batches in, more records waiting
            assert driver.poll() is None, (tmp_path / "old.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the old query wrote no 3 batches"
            time.sleep(0.5)
        sp_file = tmp_path / "savepoint.json"
        savepoint = savepoint_of(ck1, pg.sink_id, sp_file, "--stop-pid", str(driver.pid),
                               *_target(pg))
        assert driver.wait(30) == 0  # stopped gracefully by its SIGTERM handler
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        log.close()
    states = pg.ledger_states()
    assert savepoint["batch_id"] == max(states) and savepoint["committed"] is True
    assert savepoint["batch_id"] >= 2 and states[savepoint["batch_id"]] == "COMMITTED"
    rows = _rows(pg)
    assert 0 < len(rows) < OLD  # stopped midway: the rest is the new query's
    _assert_savepoint_matches_the_table(savepoint, rows)
    _resume_and_check(pg, source, tmp_path, sp_file)


def test_sigkilled_after_a_decision_the_savepoint_taken_afterwards_is_exact(
        pg: PgTarget, source: KafkaTarget, tmp_path: Path) -> None:
    ck1 = tmp_path / "ck1"
    crash_log = tmp_path / "crash.log"
    run = run_driver(_job_args(pg, source, ck1, 1, "earliest"), module=JOB,
                     crash=f"after_decision:batch=2:sink={pg.sink_id}", crash_log=crash_log)
    assert run.returncode == -9, run.tail()
    assert point_reached(crash_log, CrashPoint.AFTER_DECISION, pg.sink_id, 2)
    assert pg.ledger_states() == {0: "COMMITTED", 1: "COMMITTED", 2: "DECIDED"}
    assert pg.prepared(), "batch 2's transactions are prepared, not committed"
    sp_file = tmp_path / "savepoint.json"
    savepoint = savepoint_of(ck1, pg.sink_id, sp_file, *_target(pg))
    assert (savepoint["batch_id"], savepoint["committed"]) == (2, False)
    # The savepoint ends after batch 2, whose rows are prepared (not visible yet): an
    # offset too early would write them twice after the resume, one too late lose some.
    (ends,) = json.loads(savepoint["sources"][0]["options"]["startingOffsets"]).values()
    visible = len(_rows(pg))
    assert 0 < visible < sum(ends.values()) < OLD, (visible, ends)
    _resume_and_check(pg, source, tmp_path, sp_file)


@pytest.mark.parametrize("shift", [-1, +1], ids=["one-record-too-early", "one-too-late"])
def test_a_resume_one_record_off_is_refused_before_anything_is_written(
        pg: PgTarget, source: KafkaTarget, tmp_path: Path, shift: int) -> None:
    savepoint, topic, ends = _old_query_then_savepoint(pg, source, tmp_path)
    sp_file = tmp_path / "savepoint.json"
    before = sorted(_rows(pg))
    wrong = dict(ends, **{"1": ends["1"] + shift})
    bad = run_driver(_job_args(pg, source, tmp_path / "ck-wrong", 2, json.dumps({topic: wrong}),
                               "--resume-from", str(sp_file)), module=JOB)
    assert bad.returncode != 0, bad.tail()
    what = (f"records {wrong['1']}..{ends['1'] - 1} would be written twice (an overlap)"
            if shift < 0 else
            f"records {ends['1']}..{wrong['1'] - 1} would never be written (a gap)")
    expected = (f"topic {topic} partition 1: the new query starts at offset {wrong['1']}, "
                f"the savepoint ends at {ends['1']}: {what}")
    assert expected in bad.output and "nothing was written" in bad.output, bad.tail()
    assert sorted(_rows(pg)) == before and pg.prepared() == []
    assert _bound(pg) == savepoint["query_id"]  # still the old query's
    # The right start, on a new checkpoint, is exact.
    _resume_and_check(pg, source, tmp_path, sp_file, produce=False)


def test_the_data_source_form_resumes_from_a_savepoint_file(
        pg: PgTarget, source: KafkaTarget, tmp_path: Path) -> None:
    """``format("connectors.postgres")`` with ``resume_from`` (the savepoint's file) and
    ``checkpoint_location`` as options: a start one record too early is refused in the
    first batch's commit, after its tasks prepared: rolled back, nothing committed; then
    the right start is exact."""
    form = ["--form", "datasource"]
    savepoint, topic, ends = _old_query_then_savepoint(pg, source, tmp_path, *form)
    sp_file = tmp_path / "savepoint.json"
    before = sorted(_rows(pg))
    early = json.dumps({topic: dict(ends, **{"0": ends["0"] - 1})})
    bad = run_driver(_job_args(pg, source, tmp_path / "ck-wrong", 2, early, *form,
                               "--resume-from", str(sp_file)), module=JOB)
    assert bad.returncode != 0, bad.tail()
    assert "would be written twice (an overlap)" in bad.output, bad.tail()
    assert sorted(_rows(pg)) == before and pg.prepared() == []
    assert _bound(pg) == savepoint["query_id"]
    starting = savepoint["sources"][0]["options"]["startingOffsets"]
    good = run_driver(_job_args(pg, source, tmp_path / "ck2", 2, starting, *form,
                                "--resume-from", str(sp_file)), module=JOB)
    assert good.returncode == 0, good.tail()
    ids = collections.Counter(i for i, _ in _rows(pg))
    assert sorted(ids) == list(range(OLD + NEW)) and set(ids.values()) == {1}
    assert pg.prepared() == [] and _bound(pg) != savepoint["query_id"]
