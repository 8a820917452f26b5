"""KafkaSink (``barrier=False``) under Spark's own speculation, on a real standalone cluster.

The set-up of ``test_speculation.py``: two one-core workers on different loopback hosts,
so Spark launches speculative copies; the first attempt of batch 1's slot 0 stalls 25 s
with its transaction open (records produced, not committed). The copy's
``init_transactions`` fences the straggler (aborting its transaction) and commits the slot
with its marker; the straggler can never commit after that. A ``read_committed`` consumer
sees every record once, the slot has one marker for the batch, and no transaction stays
open. (Barrier stages are never speculated: that mode needs no such test.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from integration.core.test_speculation import (
    STALLED_BATCH,
    run_with_a_straggler,
)
from integration.kafka.test_kafka_kill import SLOTS, KafkaJob
from integration.support._kafka import KafkaTarget, ledger, target_fixture
from integration.support._standalone import StandaloneCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]


kafka = target_fixture("spec")


def test_speculative_copy_fences_the_straggler_and_the_slot_commits_once(
    cluster: StandaloneCluster, kafka: KafkaTarget, tmp_path: Path
) -> None:
    job = KafkaJob(tmp_path, kafka, files=3, barrier=False)
    _run, attempts = run_with_a_straggler(job, cluster)
    listing = "\n".join(map(str, attempts))
    slot0 = [a for a in attempts if a.batch == STALLED_BATCH and a.index == 0
             and a.stage == max(x.stage for x in attempts if x.batch == STALLED_BATCH)]
    assert any(a.speculative for a in slot0), f"no speculative copy of the straggler:\n{listing}"
    assert len(slot0) >= 2, listing

    # The ledger records one commit per slot, each from an attempt Spark accepted.
    entry = ledger(kafka.bootstrap, kafka.ledger_topic)[f"batch/{STALLED_BATCH:020d}"]
    accepted = {a.task_id for a in attempts if a.batch == STALLED_BATCH and a.reason == "Success"}
    recorded = {c["attempt"] for c in entry["commits"]}
    assert sorted(c["partition"] for c in entry["commits"]) == list(range(SLOTS))
    assert recorded <= accepted, f"{recorded} vs accepted {accepted}:\n{listing}"
    # One marker for the batch in slot 0, though two attempts wrote it.
    assert [m["batch_id"] for m in job.markers()[0]].count(STALLED_BATCH) == 1

    cluster.wait_apps_gone()  # the straggler's process is gone: it can commit nothing later
    job.assert_exact()
