"""KafkaSink on real Spark and a real Kafka broker (KRaft): killed drivers, killed tasks,
retried and speculative tasks, a restarted broker.

Every test runs real Structured Streaming drivers (``examples/stream_to_kafka.py``) as child
processes, kills them, restarts them from the same checkpoint and then reads the output
topic with a ``read_committed`` consumer, record by record: every input id exactly once,
and at the end no open transaction (last stable offset == high watermark) on the output
and marker topics. Each kill first proves its crash point was reached (the crash log names
it; Spark's offset log holds the batch without a commit entry) and that Kafka holds the
state the crash point stands for (slot markers, ledger records).

Each test has its own output topic and sink id (so its own marker and ledger topics).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from connectors.core.states import CRASH_POINTS, Family
from connectors.kafka._native import ACCELERATORS_ENV, accelerators_off
from connectors.sdk import CrashPoint
from examples.stream_to_files import make_input_files
from integration.support._driver import (
    REPO,
    SEED,
    DriverRun,
    KillJob,
    a_failed_task_was_retried,
    kill_at_random,
    reached,
    run_with_a_failing_task,
    spark_batches,
)
from integration.support._fixtures_services import NativeKafka
from integration.support._kafka import KafkaTarget, ledger_batches, markers, target_fixture

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODULE = "examples.stream_to_kafka"
ROWS_PER_FILE = 300
SLOTS = 2


class KafkaJob(KillJob):
    """One streaming job into Kafka: its directories, target and expected output."""

    module = MODULE

    def __init__(self, root: Path, target: KafkaTarget, source: str = "files",
                 files: int = 4, barrier: bool = False,
                 small_batch_rows: int | None = 0) -> None:
        super().__init__(root, sink_id=target.sink_id, cwd=REPO)
        self.target = target
        #: 0 (default here): every slot runs as a Spark task, which these tests kill and
        #: retry; the driver route of small batches has tests of its own. ``None``: the
        #: runner's default (and no option an older release's runner would refuse).
        self.small_batch_rows = small_batch_rows
        self.source = source
        self.barrier = barrier
        self.input = root / "in"
        self.files = files
        self.input_topic = ""
        if source == "files":
            self.total = make_input_files(self.input, files, ROWS_PER_FILE)
        elif source == "rate":
            self.batches, self.rows_per_batch = 4, 400
            self.total = self.batches * self.rows_per_batch
        else:
            self.total = 1200
            self.input_topic = target.create(f"{target.topic}-in", partitions=2)
            target.produce_input(self.input_topic, self.total)

    def args(self) -> list[str]:
        t = self.target
        common = ["--checkpoint", str(self.checkpoint), "--topic", t.topic,
                  "--sink-id", t.sink_id, "--bootstrap", t.bootstrap, "--slots", str(SLOTS),
                  *([] if self.small_batch_rows is None
                    else ["--small-batch-rows", str(self.small_batch_rows)]),
                  *(["--barrier"] if self.barrier else [])]
        if self.source == "files":
            return ["--source", "files", "--input", str(self.input), *common]
        if self.source == "kafka":
            return ["--source", "kafka", "--input-topic", self.input_topic,
                    "--max-offsets-per-trigger", "400", *common]
        return ["--source", "rate", "--batches", str(self.batches),
                "--rows-per-batch", str(self.rows_per_batch), *common]

    def run(self, *extra: str, **kwargs: Any) -> DriverRun:
        run = super().run(*extra, **kwargs)
        _check_produce_path(run)
        return run

    def markers(self) -> dict[int, list[dict[str, Any]]]:
        return markers(self.target.bootstrap, self.target.marker_topic)

    def marked(self, batch: int) -> set[int]:
        """Slots whose committed markers include ``batch``."""
        return {slot for slot, ms in self.markers().items()
                if any(m["batch_id"] == batch for m in ms)}

    def ledger(self) -> dict[int, str]:
        return ledger_batches(self.target.bootstrap, self.target.ledger_topic)

    def assert_exact(self) -> None:
        self.target.assert_exact(self.total)
        states = self.ledger()
        assert states and set(states.values()) == {"COMMITTED"}, states


kafka = target_fixture("kill")


@pytest.fixture
def kafka_own(native_kafka: NativeKafka) -> Iterator[KafkaTarget]:
    """As ``kafka``, on the broker of the module's own that ``native_kafka`` restarts (the
    shared one serves the other tests meanwhile)."""
    target = KafkaTarget(native_kafka.bootstrap, prefix="kill")
    target.create()
    yield target
    target.cleanup()


#: Rows each produce path wrote in this module's driver runs (batch metrics).
PRODUCED: dict[str, float] = {}


def _check_produce_path(run: DriverRun) -> None:
    """Count the rows per produce path; with ``CONNECTORS_ACCELERATORS=off`` (the CI lane
    of the public path, inherited by every driver and its workers) no batch may have used
    the ctypes accelerator."""
    for metrics in run.metrics():
        for path in ("owned", "native", "batch", "record"):
            rows = float(metrics.get(f"produce_{path}_rows", 0))
            PRODUCED[path] = PRODUCED.get(path, 0.0) + rows
            if path == "native" and accelerators_off():
                assert rows == 0, f"{ACCELERATORS_ENV}=off, yet the accelerator ran: {metrics}"


def _ok(run: DriverRun) -> None:
    assert run.returncode == 0, run.tail()


def _crashed_in_batch(job: KafkaJob, batch: int) -> None:
    offsets, commits = spark_batches(job.checkpoint)
    assert batch in offsets and batch not in commits, (offsets, commits)


# ------------------------------------------------- every COMMIT_IN_TASK crash point

#: Driver crash points: one driver run each (SIGKILL ends it), each in its own batch.
DRIVER_SEQUENCE = [(CrashPoint.BEFORE_DECISION, 0), (CrashPoint.AFTER_COMMIT, 1)]
#: Task crash points: the Python worker of slot 0 is SIGKILLed. In barrier mode the slots
#: run as one barrier shuffle-map stage, which Spark retries as a whole even on local[2]:
#: both fire in one driver run, which then finishes by itself.
TASK_SEQUENCE = [(CrashPoint.BEFORE_PRECOMMIT, 2), (CrashPoint.AFTER_PRECOMMIT, 3)]


def test_sequences_cover_every_crash_point_of_the_family() -> None:
    # before_tasks (nothing of the batch done yet) is killed in a KafkaSink driver by
    # integration/core/test_batch_jobs.py and held by a stop in integration/core/test_stopping.py;
    # it costs a driver run here, in two CI lanes.
    points = {p for p, _ in DRIVER_SEQUENCE + TASK_SEQUENCE}
    assert points == set(CRASH_POINTS[Family.COMMIT_IN_TASK]) - {CrashPoint.BEFORE_TASKS}


def test_sigkill_at_every_crash_point_then_restarts_are_exact(
    tmp_path: Path, kafka: KafkaTarget
) -> None:
    """Every crash point of the COMMIT_IN_TASK family (barrier mode, whose stage Spark
    retries as a whole even on ``local[2]``): the driver killed twice (each restart first
    repairs the previous crash), then two task kills in one run. The default
    ``barrier=False`` is killed at random moments, in the rate, retry and speculation
    tests."""
    job = KafkaJob(tmp_path, kafka, files=5, barrier=True)
    history = []
    for point, batch in DRIVER_SEQUENCE:
        run = job.run(crash=f"{point.value}:batch={batch}")
        history.append(run)
        assert run.returncode == -9, f"driver was not SIGKILLed:\n{run.tail()}"
        assert job.reached(point, batch), reached(job.crash_log)
        _crashed_in_batch(job, batch)
        ledger = job.ledger()
        assert all(ledger.get(b) == "COMMITTED" for b in range(batch)), ledger
        marked = job.marked(batch)
        if point is CrashPoint.BEFORE_DECISION:
            # Every slot committed with its marker; the ledger does not know yet.
            assert marked == set(range(SLOTS)) and batch not in ledger, (marked, ledger)
        else:
            assert marked == set(range(SLOTS)) and ledger.get(batch) == "COMMITTED", ledger

    spec = ";".join(f"{p.value}:batch={b}:partition=0:once={tmp_path / p.value}"
                    for p, b in TASK_SEQUENCE)
    final = job.run(crash=spec)
    history.append(final)
    _ok(final)
    for point, batch in TASK_SEQUENCE:
        assert job.reached(point, batch, partition=0), reached(job.crash_log)
    assert "Python worker exited unexpectedly" in final.output  # the kills really happened
    job.assert_exact()
    outcomes = {int(m["batch_id"]): m["outcome"] for r in history for m in r.metrics()}
    assert outcomes.get(0) == "replayed", outcomes  # before_decision: every slot marked
    assert outcomes.get(1) == "replayed", outcomes  # after_commit: in the ledger
    # before_precommit: slot 0 never committed batch 2, so the retried stage wrote it.
    assert outcomes.get(2) == "committed", outcomes
    produced = {path: sum(float(m.get(f"produce_{path}_rows", 0)) for r in history
                          for m in r.metrics()) for path in ("owned", "native", "batch")}
    # The slot producer CONNECTORS_KAFKA_PRODUCER picks (auto: the owned handle).
    owned = os.environ.get("CONNECTORS_KAFKA_PRODUCER", "auto") in ("auto", "owned")
    if owned:
        assert produced["owned"] > 0 and produced["native"] + produced["batch"] == 0, produced
    elif accelerators_off():  # the public path's CI lane: produce_batch wrote every batch
        assert produced["batch"] > 0 and produced["native"] == 0, produced
    else:
        assert produced["batch"] + produced["native"] > 0, produced
    # A slot written twice would show as a duplicate above; a marker twice too:
    for slot, ms in job.markers().items():
        batches = [m["batch_id"] for m in ms]
        assert len(batches) == len(set(batches)), (slot, batches)


def test_driver_killed_at_random_moments_then_restart_is_exact(
    tmp_path: Path, kafka: KafkaTarget
) -> None:
    job = KafkaJob(tmp_path, kafka, files=8)
    kill_at_random(job, progress=lambda: _ledger_len(job),
                   runs=int(os.environ.get("EOS_RANDOM_KILLS", "1")), seed=SEED, check=_ok)
    job.assert_exact()


def _ledger_len(job: KafkaJob) -> int:
    try:
        return len(job.ledger())
    except Exception:  # the ledger topic does not exist yet
        return 0


# --------------------------------------------------------------- the other sources


def test_rate_micro_batch_source_without_barrier_with_crash_is_exact(
    tmp_path: Path, kafka: KafkaTarget
) -> None:
    """``barrier=False`` (records validated in a separate job, slots as ordinary tasks),
    the driver killed with every slot committed and nothing recorded."""
    job = KafkaJob(tmp_path, kafka, source="rate", barrier=False)
    first = job.run(crash="before_decision:batch=1")
    assert first.returncode == -9, first.tail()
    assert job.reached(CrashPoint.BEFORE_DECISION, 1)
    _crashed_in_batch(job, 1)
    assert job.marked(1) == set(range(SLOTS)) and 1 not in job.ledger()
    second = job.run()
    _ok(second)
    job.assert_exact()
    names = {m.json()["id"]: m.json()["name"] for m in kafka.messages()}
    assert all(name == f"rate-{i}" for i, name in names.items())


def test_kafka_source_to_kafka_sink_with_task_killed_after_its_commit_is_exact(
    tmp_path: Path, kafka: KafkaTarget
) -> None:
    """Spark's Kafka source -> KafkaSink (``barrier=False``); slot 0's task is killed
    between its commit and the end of the batch (after_precommit); the restart replays the
    batch: slot 0 finds its marker and writes nothing, the other slot writes. Keys and
    headers are copied."""
    job = KafkaJob(tmp_path, kafka, source="kafka", barrier=False)
    first = job.run(crash="after_precommit:batch=1:partition=0")
    # barrier=False on local[2]: a lost task is not retried, the query fails.
    assert first.returncode not in (0, -9), first.tail()
    assert job.reached(CrashPoint.AFTER_PRECOMMIT, 1, partition=0)
    _crashed_in_batch(job, 1)
    assert 0 in job.marked(1) and 1 not in job.ledger()
    second = job.run()
    _ok(second)
    job.assert_exact()
    # Slot 0 committed batch 1 once, though two drivers ran it; slot 1 may have committed
    # it before the kill too (barrier=False: slots commit independently).
    batch1 = [m for m in second.metrics() if m["batch_id"] == "1"]
    assert batch1 and batch1[0]["outcome"] in ("committed", "replayed"), batch1
    for slot in range(SLOTS):
        assert [m["batch_id"] for m in job.markers()[slot]].count(1) == 1
    for m in kafka.messages():
        i = m.json()["id"]
        assert m.key == str(i).encode() and m.headers == (("n", str(i).encode()),), m


# ------------------------------------------------------------------ Spark task retries


def test_failed_task_is_retried_on_local_n_f_and_the_retry_finds_the_marker(
    tmp_path: Path, kafka: KafkaTarget
) -> None:
    """``local[2,3]`` retries a failed task. Slot 0's first attempt commits, then its
    process dies (after_precommit): the retry fences the slot, finds the committed marker,
    compares fingerprints and writes nothing. The event log proves the retry ran."""
    job = KafkaJob(tmp_path, kafka, barrier=False)
    run, attempts = run_with_a_failing_task(job, "after_precommit:batch=1:partition=0")
    _ok(run)
    assert job.reached(CrashPoint.AFTER_PRECOMMIT, 1, partition=0)
    assert a_failed_task_was_retried(attempts), json.dumps(attempts, indent=1)
    job.assert_exact()
    assert len([m for m in job.markers()[0] if m["batch_id"] == 1]) == 1


def test_failed_barrier_task_retries_the_whole_stage_and_is_exact(
    tmp_path: Path, kafka: KafkaTarget
) -> None:
    """Barrier mode on ``local[2,3]``: a task dies before its commit; Spark retries the
    whole barrier stage (every slot fences its previous attempt) and the batch is exact."""
    job = KafkaJob(tmp_path, kafka, files=3, barrier=True)
    run, attempts = run_with_a_failing_task(job, "before_precommit:batch=1:partition=1")
    _ok(run)
    assert job.reached(CrashPoint.BEFORE_PRECOMMIT, 1, partition=1)
    assert any(a["failed"] for a in attempts), json.dumps(attempts, indent=1)
    job.assert_exact()


# ----------------------------------------------------------------- broker restarted


def test_broker_killed_and_restarted_mid_transaction_then_exact(
    tmp_path: Path, kafka_own: KafkaTarget, native_kafka: NativeKafka
) -> None:
    """Slot 0 stalls with its transaction open (records produced, not committed); the
    broker is SIGKILLed and restarted meanwhile. The slot's commit then succeeds after the
    restart, or fails and the restarted driver redoes the batch; either way a
    read_committed consumer sees every record once and no transaction stays open."""
    stall = 15.0
    job = KafkaJob(tmp_path, kafka_own, files=3)
    spec = f"before_precommit:batch=1:partition=0:action=stall:seconds={stall:g}"
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(job.run, crash=spec)
        deadline = time.monotonic() + 300
        while not (job.reached(CrashPoint.BEFORE_PRECOMMIT, 1) or future.done()):
            assert time.monotonic() < deadline, "the stall was never reached"
            time.sleep(0.1)
        assert job.reached(CrashPoint.BEFORE_PRECOMMIT, 1), future.result().tail()
        native_kafka.restart(kill=True, downtime=1.0)
        run = future.result()
    runs = [run]
    if run.returncode != 0:
        runs.append(job.run())
        _ok(runs[-1])
    print("exit codes:", [r.returncode for r in runs])
    job.assert_exact()
