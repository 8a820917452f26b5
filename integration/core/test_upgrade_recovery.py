"""Upgrade: a batch the previous release left unfinished recovers exactly with this one.

:data:`OLD_RELEASE`'s tree is taken from this clone's history (``git archive``, as the
Kafka order test takes its release). For each protocol family its own example driver, from
that tree, is killed at a crash point with real state left behind in the real target (the
crash log names the point; the target holds what the point stands for). Then this tree's
driver restarts on the same checkpoint, ledger and sink id and finishes the job. The check
is row by row: every input row exactly once, nothing left prepared (PostgreSQL), no open
transaction on any of the sink's topics (Kafka), one commit per batch (Delta), every batch
COMMITTED in the ledger. Each test also runs that check on the state the old driver left
and expects it to fail: the check is not blind.

Each driver runs through ``integration/core/_upgrade.py``'s launcher, whose output names the
``connectors`` it imported: the first run must be the release's, the second this tree's.

By default one crash point per family (CI's time budget); ``EOS_WIDE_MATRIX=1`` adds the
others.
"""

from __future__ import annotations

import collections
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from connectors.sdk import CrashPoint
from integration.core._upgrade import release_tree, run_tree
from integration.delta.test_delta_kill import APPEND, MERGE, DeltaJob
from integration.kafka.test_kafka_kill import SLOTS, KafkaJob
from integration.postgres.test_postgres_kill import CRASH_BATCH, FILES, PgJob
from integration.support._delta import (
    input_rows,
    intent_batches,
    ledger_batches,
    table_rows,
    tagged_commits,
)
from integration.support._driver import DriverRun, reached, spark_batches
from integration.support._kafka import KafkaTarget, open_transactions, target_fixture
from integration.support._pg import DRIVER_PGOPTIONS, PgTarget, check_restart, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: The last commit before the restructuring of ``connectors/core`` (the sans-I/O
#: coordinator replacing ``core/driver.py`` and ``core/recovery.py``, ``spark_batch``
#: moved out of core): what users upgrade from.
OLD_RELEASE = "953f96f"

WIDE = os.environ.get("EOS_WIDE_MATRIX") == "1"
_WIDE_ONLY = pytest.mark.skipif(
    not WIDE, reason="wide crash matrix only: set EOS_WIDE_MATRIX=1 (by default one crash "
    "point per family runs, for CI's time budget)")


def _point(name: str, *, wide: bool = False) -> Any:
    return pytest.param(name, id=name, marks=[_WIDE_ONLY] if wide else [])


def _log(what: str, run: DriverRun) -> None:
    print(f"{what}: exit {run.returncode} in {run.seconds:.1f} s", file=sys.stderr)


@pytest.fixture(scope="module")
def old_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = release_tree(tmp_path_factory.mktemp("upgrade"), OLD_RELEASE)
    # The release really is the one before the restructuring.
    assert (tree / "connectors" / "core" / "driver.py").is_file(), sorted(tree.rglob("*.py"))
    return tree


# ------------------------------------------------------------------------ PostgreSQL


@pytest.fixture
def pg(postgres_conninfo: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[PgTarget]:
    monkeypatch.setenv("EOS_POSTGRES_CONNINFO", postgres_conninfo)  # the drivers read it
    monkeypatch.setenv("PGOPTIONS", DRIVER_PGOPTIONS)
    target = PgTarget(postgres_conninfo, prefix="upgrade")
    target.create_table()
    yield target
    target.cleanup()


PG_MODULE = "examples.stream_to_postgres"


def _pg_exact(job: PgJob) -> None:
    """Every input id once, nothing of the sink prepared, every batch COMMITTED."""
    job.assert_exact()
    assert sorted(job.target.ledger_states()) == list(range(FILES)), job.target.ledger_states()


@pytest.mark.parametrize("point", [
    _point("between_commits"),
    _point("after_decision", wide=True),
    _point("before_decision", wide=True),
])
def test_postgres_batch_left_by_the_old_release_recovers_exactly(
    point: str, tmp_path: Path, pg: PgTarget, old_tree: Path
) -> None:
    crash = CrashPoint(point)
    job = PgJob(tmp_path, pg)
    first = run_tree(old_tree, PG_MODULE, job.args(), crash=f"{point}:batch={CRASH_BATCH}",
                     crash_log=job.crash_log)
    _log(f"{OLD_RELEASE} killed at {point}", first)
    assert first.returncode == -9, f"the old driver was not SIGKILLed:\n{first.tail()}"
    assert job.reached(crash, CRASH_BATCH), reached(job.crash_log)
    offsets, commits = spark_batches(job.checkpoint)
    assert CRASH_BATCH in offsets and CRASH_BATCH not in commits, (offsets, commits)

    # What the old release left in PostgreSQL.
    ledger = pg.ledger_states()
    assert all(ledger.get(b) == "COMMITTED" for b in range(CRASH_BATCH)), ledger
    left = pg.prepared()
    assert left and all(t.batch_id == CRASH_BATCH for t in left), left
    prepared = {str(t) for t in left}
    before = CRASH_BATCH * job.total // FILES
    if crash is CrashPoint.BEFORE_DECISION:
        assert CRASH_BATCH not in ledger, ledger
        assert pg.count() == before
    else:
        assert ledger.get(CRASH_BATCH) == "DECIDED", ledger
        decided = set(pg.decided_transactions(CRASH_BATCH))
        if crash is CrashPoint.AFTER_DECISION:
            assert prepared == decided and pg.count() == before
        else:  # between_commits: part of the decision committed, the rest prepared
            assert prepared < decided, (prepared, decided)
            assert before < pg.count() < before + job.total // FILES, pg.count()
    with pytest.raises(AssertionError, match="missing"):
        _pg_exact(job)  # not blind: the state the old release left fails the check

    second = run_tree(None, PG_MODULE, job.args(), crash_log=job.crash_log)
    _log("this release", second)
    check_restart(second)
    _pg_exact(job)
    assert not (prepared & {str(t) for t in pg.prepared()})
    outcome = second.batch_metrics(pg.sink_id, CRASH_BATCH)["outcome"]
    # A decided batch is finished (COMMIT PREPARED of what is left); an undecided one is
    # rolled back and written again.
    assert outcome == ("committed" if crash is CrashPoint.BEFORE_DECISION else "replayed")


# ----------------------------------------------------------------------------- Kafka

KAFKA_MODULE = "examples.stream_to_kafka"
KAFKA_BATCH = 1
kafka = target_fixture("upgrade")


def _kafka_exact(job: KafkaJob) -> None:
    """Every input id once for a read_committed consumer; LSO == high watermark on the
    output, marker and ledger topics; every batch COMMITTED; one marker per slot and batch."""
    job.assert_exact()  # ids exactly once, no open transaction on output and markers
    t = job.target
    assert not open_transactions(t.bootstrap, [t.ledger_topic]), "ledger topic: open txn"
    assert sorted(job.ledger()) == list(range(job.files)), job.ledger()
    for slot, ms in job.markers().items():
        batches = [m["batch_id"] for m in ms]
        assert len(batches) == len(set(batches)), (slot, batches)


@pytest.mark.parametrize("point", [
    _point("before_decision"),
    _point("after_precommit", wide=True),
    _point("before_precommit", wide=True),
])
def test_kafka_batch_left_by_the_old_release_recovers_exactly(
    point: str, tmp_path: Path, kafka: KafkaTarget, old_tree: Path
) -> None:
    """``before_decision``: every slot committed the batch, the ledger does not know.
    ``after_precommit``: slot 0's worker killed after its commit, local[2] fails the query.
    ``before_precommit``: slot 0 committed, slot 1 stalls with its records produced in an
    open transaction, and the driver is SIGKILLed: the transaction stays open."""
    crash = CrashPoint(point)
    job = KafkaJob(tmp_path, kafka, files=3, small_batch_rows=None)  # the old runner's args
    spec = f"{point}:batch={KAFKA_BATCH}"
    if crash is CrashPoint.BEFORE_DECISION:
        first = run_tree(old_tree, KAFKA_MODULE, job.args(), crash=spec,
                         crash_log=job.crash_log)
        _log(f"{OLD_RELEASE} killed at {point}", first)
        assert first.returncode == -9, f"the old driver was not SIGKILLed:\n{first.tail()}"
        assert job.reached(crash, KAFKA_BATCH), reached(job.crash_log)
        assert job.marked(KAFKA_BATCH) == set(range(SLOTS)), job.markers()
    elif crash is CrashPoint.AFTER_PRECOMMIT:
        first = run_tree(old_tree, KAFKA_MODULE, job.args(), crash=f"{spec}:partition=0",
                         crash_log=job.crash_log)
        _log(f"{OLD_RELEASE} killed at {point}", first)
        assert first.returncode not in (0, -9), f"the query should have failed:\n{first.tail()}"
        assert job.reached(crash, KAFKA_BATCH, partition=0), reached(job.crash_log)
        assert 0 in job.marked(KAFKA_BATCH), job.markers()
    else:
        first = run_tree(old_tree, KAFKA_MODULE, job.args(),
                         crash=f"{spec}:partition=1:action=stall:seconds=300",
                         crash_log=job.crash_log, kill_after=0.0,
                         kill_when=lambda: 0 in job.marked(KAFKA_BATCH))
        _log(f"{OLD_RELEASE} killed at {point}", first)
        assert first.returncode == -9, f"the old driver was not SIGKILLed:\n{first.tail()}"
        assert job.reached(crash, KAFKA_BATCH, partition=1), reached(job.crash_log)
        assert job.marked(KAFKA_BATCH) == {0}, job.markers()
        assert wait_for(lambda: open_transactions(kafka.bootstrap, [kafka.topic]), 30), (
            "slot 1's transaction is not open on the output topic")
    offsets, commits = spark_batches(job.checkpoint)
    assert KAFKA_BATCH in offsets and KAFKA_BATCH not in commits, (offsets, commits)
    ledger = job.ledger()
    assert all(ledger.get(b) == "COMMITTED" for b in range(KAFKA_BATCH)), ledger
    assert KAFKA_BATCH not in ledger, ledger  # committed in Kafka, not recorded
    with pytest.raises(AssertionError, match="missing"):
        _kafka_exact(job)  # not blind: the state the old release left fails the check

    second = run_tree(None, KAFKA_MODULE, job.args(), crash_log=job.crash_log)
    _log("this release", second)
    assert second.returncode == 0, second.tail()
    _kafka_exact(job)
    # What a slot committed under the old release is not written again (one marker per
    # slot below); a slot that had not committed writes the batch now.
    outcome = second.batch_metrics(kafka.sink_id, KAFKA_BATCH)["outcome"]
    if crash is CrashPoint.BEFORE_DECISION:
        assert outcome == "replayed", outcome
    elif crash is CrashPoint.BEFORE_PRECOMMIT:
        assert outcome == "committed", outcome
    else:  # slot 1 may have committed before the query failed
        assert outcome in ("replayed", "committed"), outcome
    for slot in range(SLOTS):
        assert [m["batch_id"] for m in job.markers()[slot]].count(KAFKA_BATCH) == 1


# ----------------------------------------------------------------------------- Delta

DELTA_MODULE = "examples.stream_to_delta"
DELTA_BATCH = 1


def _delta_args(job: DeltaJob) -> list[str]:
    """The job's arguments for the example itself (the default 'tag' commit path; the
    option ``--delta-path`` is the test program's, not the example's)."""
    args = job.args()
    i = args.index("--delta-path")
    assert args[i + 1] == "tag", args
    return args[:i] + args[i + 2:]


def _delta_rows_exact(spark: SparkSession, job: DeltaJob) -> None:
    """Table ``a`` (append): every input row exactly once."""
    want = collections.Counter(input_rows(job.total))
    got = collections.Counter(table_rows(spark, job.a, ["id", "name", "amount",
                                                        "unix_micros(ts)"]))
    missing, extra = sorted(want - got), sorted(got - want)
    assert not missing and not extra, (
        f"missing {len(missing)} rows {missing[:3]}, duplicated or unexpected {len(extra)} "
        f"{extra[:3]}")


@pytest.mark.parametrize("sink", [_point(APPEND), _point(MERGE, wide=True)])
def test_delta_commit_left_unrecorded_by_the_old_release_recovers_exactly(
    sink: str, tmp_path: Path, spark: SparkSession, old_tree: Path
) -> None:
    point = CrashPoint.AFTER_DECISION
    job = DeltaJob(tmp_path, files=3)
    first = run_tree(old_tree, DELTA_MODULE, _delta_args(job),
                     crash=f"{point.value}:batch={DELTA_BATCH}:sink={sink}",
                     crash_log=job.crash_log)
    _log(f"{OLD_RELEASE} killed at {point.value} of {sink}", first)
    assert first.returncode == -9, f"the old driver was not SIGKILLed:\n{first.tail()}"
    assert job.reached(point, DELTA_BATCH, sink_id=sink), reached(job.crash_log)
    offsets, commits = spark_batches(job.checkpoint)
    assert DELTA_BATCH in offsets and DELTA_BATCH not in commits, (offsets, commits)
    # The Delta commit is done (tagged with the sink and batch), the ledger does not know.
    path = job.a if sink == APPEND else job.b
    ledger, tags = ledger_batches(path, sink), tagged_commits(path, sink)
    assert all(ledger.get(b) for b in range(DELTA_BATCH)), ledger
    assert len(tags.get(DELTA_BATCH, [])) == 1, tags
    assert DELTA_BATCH not in ledger, ledger
    assert DELTA_BATCH in intent_batches(path, sink)
    with pytest.raises(AssertionError, match="missing"):
        _delta_rows_exact(spark, job)  # not blind: the state the old release left fails

    second = run_tree(None, DELTA_MODULE, _delta_args(job), crash_log=job.crash_log)
    _log("this release", second)
    assert second.returncode == 0, second.tail()
    job.check_path(second)
    _delta_rows_exact(spark, job)
    job.assert_exact(spark)  # both tables row by row, one commit per batch, ledger complete
    # The unrecorded commit was found in the table's history, not written again.
    metrics = second.batch_metrics(sink, DELTA_BATCH)
    assert metrics["outcome"] == "replayed" and metrics["reconciled"] == "1", metrics
    assert len(tagged_commits(path, sink)[DELTA_BATCH]) == 1
