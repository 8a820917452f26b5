"""KafkaSink keeps per-key order, as Spark's own Kafka writer does, on a real broker.

Spark's writer produces the records of one input partition in their order, so the records
of one key from one input partition reach their Kafka partition in that order. KafkaSink
places keyed records into slots by their key, and Spark's shuffle hands every slot the
rows of each input partition in their order: the same guarantee. Records of one key from
different input partitions have no order (in Spark's writer neither).

The job (``integration/kafka/_order_job.py``): 4 input partitions, 3 slots, 3 topic partitions,
7 keys, every key in every input partition with ~85 records per batch there; each record
tagged (input partition, seq). Checked: every record exactly once, and ``seq`` increasing
per (key, input partition) in offset order; also after the driver is SIGKILLed with a
batch committed by some slots only, and across an upgrade from the release that placed
rows by content (its unfinished batch replays with its own placement).
"""

from __future__ import annotations

import collections
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pyspark
import pytest

from connectors.sdk import CrashPoint
from integration.support._driver import REPO, DriverRun, point_reached, reached, run_driver
from integration.support._kafka import KafkaTarget, ledger, markers, read_all, target_fixture

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SLOTS, PARTITIONS, KEYS, ROWS, BATCHES = 3, 4, 7, 2400, 3
#: The last commit that placed every row by its content (before per-key placement).
ROW_PLACEMENT_RELEASE = "7e97bb8"
#: The tests that run that release need a Spark it ran on (4.x): 3.5 came later.
RUNS_THE_OLD_RELEASE = pytest.mark.skipif(
    int(pyspark.__version__.split(".", 1)[0]) < 4,
    reason=f"pyspark {pyspark.__version__}: release {ROW_PLACEMENT_RELEASE} predates Spark 3.5")

kafka = target_fixture("order")


class OrderJob:
    def __init__(self, root: Path, target: KafkaTarget) -> None:
        self.root, self.target = root, target
        self.checkpoint = root / "ckpt"
        self.crash_log = root / "crash.log"

    def args(self) -> list[str]:
        t = self.target
        return ["--checkpoint", str(self.checkpoint), "--topic", t.topic,
                "--bootstrap", t.bootstrap, "--sink-id", t.sink_id, "--slots", str(SLOTS),
                "--partitions", str(PARTITIONS), "--keys", str(KEYS),
                "--rows-per-batch", str(ROWS), "--batches", str(BATCHES)]

    def run(self, release: Path | None = None, **kwargs: Any) -> DriverRun:
        """A driver run on this tree, or on ``release`` (a tree from :func:`_release_tree`)."""
        if release is None:
            return run_driver(self.args(), crash_log=self.crash_log,
                              module="integration.kafka._order_job", **kwargs)
        return run_driver(self.args(), crash_log=self.crash_log, module="order_job",
                          root=release, **kwargs)

    def marked(self, batch: int) -> set[int]:
        return {slot for slot, ms in markers(self.target.bootstrap, self.target.marker_topic)
                .items() if any(m["batch_id"] == batch for m in ms)}

    def kill_mid_batch(self, batch: int, release: Path | None = None) -> DriverRun:
        """SIGKILL the driver while slots 0 and 1 have committed ``batch`` and slot 2 stalls
        before its commit: the batch is half in Kafka, the ledger does not record it."""
        stall = f"{CrashPoint.BEFORE_PRECOMMIT.value}:batch={batch}:partition=2"

        def half_committed() -> bool:
            # Slot 2's task starts only when a core frees up (local[2]): wait for it to
            # reach its stall too, not just for slots 0 and 1 to commit.
            return {0, 1} <= self.marked(batch) and point_reached(
                self.crash_log, CrashPoint.BEFORE_PRECOMMIT, self.target.sink_id, batch,
                partition=2)

        first = self.run(release, crash=f"{stall}:action=stall:seconds=300", kill_after=0.0,
                         kill_when=half_committed)
        assert first.returncode == -9, f"the driver was not SIGKILLed:\n{first.tail()}"
        assert point_reached(self.crash_log, CrashPoint.BEFORE_PRECOMMIT, self.target.sink_id,
                             batch, partition=2), reached(self.crash_log)
        assert self.marked(batch) == {0, 1}, self.marked(batch)
        return first


def out_of_order(messages: list[Any]) -> tuple[int, dict[tuple[str, int], int]]:
    """Records whose ``seq`` is not above the previous one of their (key, input partition)
    in their Kafka partition's offset order; and the record count per (key, partition)."""
    last: dict[tuple[str, int], int] = {}
    counts: dict[tuple[str, int], int] = collections.Counter()
    keys_partition: dict[str, set[int]] = collections.defaultdict(set)
    bad = 0
    for m in sorted(messages, key=lambda m: (m.partition, m.offset)):
        assert m.key is not None
        key = m.key.decode()
        keys_partition[key].add(m.partition)
        value = json.loads(m.value)
        group = (key, int(value["p"]))
        counts[group] += 1
        if group in last and value["seq"] <= last[group]:
            bad += 1
        last[group] = value["seq"]
    assert all(len(ps) == 1 for ps in keys_partition.values()), keys_partition
    return bad, counts


def check(target: KafkaTarget, *, from_batch: int = 0) -> None:
    messages = read_all(target.bootstrap, target.topic)
    seqs = sorted(json.loads(m.value)["seq"] for m in messages)
    assert seqs == list(range(ROWS * BATCHES)), (
        f"{len(seqs)} records, {len(set(seqs))} distinct, expected {ROWS * BATCHES}")
    ordered = [m for m in messages if json.loads(m.value)["b"] >= from_batch]
    bad, counts = out_of_order(ordered)
    # The shape the guarantee is about: every key in >= 2 input partitions, >= 20 records
    # in each per batch.
    batches = BATCHES - from_batch
    for k in range(KEYS):
        parts = [p for (key, p), n in counts.items() if key == f"k{k}" and n >= 20 * batches]
        assert len(parts) >= 2, (k, counts)
    assert bad == 0, f"{bad} of {len(ordered)} records out of order per (key, input partition)"
    target.assert_no_open_transactions()


def test_keyed_records_keep_their_input_partition_order(tmp_path: Path,
                                                        kafka: KafkaTarget) -> None:
    job = OrderJob(tmp_path, kafka)
    run = job.run()
    assert run.returncode == 0, run.tail()
    check(kafka)
    binding = ledger(kafka.bootstrap, kafka.ledger_topic)["binding"]
    assert binding["placement"] == "key" and binding["slots"] == SLOTS, binding


def test_order_kept_after_driver_sigkill_with_a_half_committed_batch(
        tmp_path: Path, kafka: KafkaTarget) -> None:
    job = OrderJob(tmp_path, kafka)
    job.kill_mid_batch(1)
    second = job.run()
    assert second.returncode == 0, second.tail()
    assert job.marked(1) == {0, 1, 2}
    check(kafka)


def _release_tree(root: Path, commit: str) -> Path:
    """The package as of ``commit``, from this clone's history (``git archive``)."""
    tree = root / f"release-{commit}"
    tree.mkdir()
    archive = root / "release.tar"
    git = ["git", "-C", str(REPO)]
    if subprocess.run([*git, "cat-file", "-e", f"{commit}^{{commit}}"],
                      capture_output=True, check=False).returncode != 0:
        # A shallow clone: fetch the history from where it was cloned.
        subprocess.run([*git, "fetch", "--quiet", "--unshallow"], capture_output=True,
                       check=False, timeout=300)
    result = subprocess.run([*git, "archive", "--format=tar", "-o", str(archive), commit,
                             "connectors", "examples"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, (
        f"git archive {commit} failed (a clone with its history is needed): {result.stderr}")
    with tarfile.open(archive) as tar:
        # The "data" filter where this Python has it (3.11.4+, 3.10.12+): Debian 12's
        # python3 is 3.11.2, and CI's test lane runs on it. The archive is this clone's own
        # history (git archive), so without the filter nothing is less safe in practice.
        if hasattr(tarfile, "data_filter"):
            tar.extractall(tree, filter="data")
        else:
            tar.extractall(tree)
    shutil.copy(Path(__file__).with_name("_order_job.py"), tree / "order_job.py")
    # the job loop the driver shares with the examples (pyspark only; not in old releases)
    shutil.copy(REPO / "examples" / "_runner.py", tree / "examples" / "_runner.py")
    return tree


@RUNS_THE_OLD_RELEASE
def test_batch_started_by_the_row_placement_release_replays_with_its_placement(
        tmp_path: Path, kafka: KafkaTarget) -> None:
    """Upgrade: the previous release (rows placed by content, no placement in the ledger)
    is SIGKILLed with batch 1 committed by slots 0 and 1 only; this release must replay
    batch 1 with that placement (slot 2 writes the rows the old placement gave it), then
    place by key from batch 2 on."""
    old = _release_tree(tmp_path, ROW_PLACEMENT_RELEASE)
    job = OrderJob(tmp_path, kafka)
    first = job.kill_mid_batch(1, release=old)
    assert f"connectors from {old}" in first.output, first.tail()
    binding = ledger(kafka.bootstrap, kafka.ledger_topic)["binding"]
    assert "placement" not in binding, binding
    second = job.run()
    assert second.returncode == 0, second.tail()
    assert f"connectors from {REPO}" in second.output, second.tail()
    assert "was started with the 'row' placement" in second.output, second.tail()
    assert job.marked(1) == {0, 1, 2}
    check(kafka, from_batch=2)  # every record exactly once; order from the first key batch
    binding = ledger(kafka.bootstrap, kafka.ledger_topic)["binding"]
    assert binding["placement"] == "key", binding


@RUNS_THE_OLD_RELEASE
def test_the_order_check_sees_disorder(tmp_path: Path, kafka: KafkaTarget) -> None:
    """The check is not blind: the previous release (placement by content) fails it."""
    old = _release_tree(tmp_path, ROW_PLACEMENT_RELEASE)
    job = OrderJob(tmp_path, kafka)
    run = job.run(old)
    assert run.returncode == 0 and f"connectors from {old}" in run.output, run.tail()
    bad, _ = out_of_order(read_all(kafka.bootstrap, kafka.topic))
    print(f"row placement: {bad} of {ROWS * BATCHES} records out of order", file=sys.stderr)
    assert bad > 0
