"""The operator CLI against a real Kafka broker, with what a SIGKILLed driver really left.

A streaming job into KafkaSink is SIGKILLed while one slot's task holds its transaction
open (records produced, not committed): ``read_committed`` consumers of the output topic
are stalled (last stable offset < high watermark). ``connectors status`` must show it
without taking the sink's ledger lease, ``doctor`` must find checkpoint and ledger
consistent, ``recover --abort-undecided`` must fence the slots so the transaction is
aborted, and the restarted job must deliver every record exactly once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from connectors.sdk import CrashPoint
from integration.kafka.test_kafka_kill import KafkaJob
from integration.support._driver import reached, run_cli
from integration.support._kafka import (
    KafkaTarget,
    open_transactions,
    target_fixture,
    wait_no_open_transactions,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def cli(*args: str) -> tuple[int, Any]:
    code, data, err = run_cli(*args)
    assert not isinstance(data, str) or code != 0, err
    return code, data


kafka = target_fixture("cli")


def test_status_recover_doctor_on_an_open_transaction_of_a_killed_driver(
    tmp_path: Path, kafka: KafkaTarget
) -> None:
    job = KafkaJob(tmp_path, kafka, barrier=False)
    point = CrashPoint.BEFORE_PRECOMMIT
    # The task stalls holding its open transaction; the driver is SIGKILLed meanwhile.
    run = job.run(crash=f"{point.value}:batch=1:partition=0:action=stall:seconds=120",
                  kill_after=1.0, kill_when=lambda: job.reached(point, 1, partition=0))
    assert run.returncode == -9, run.tail()
    assert job.reached(point, 1, partition=0), reached(job.crash_log)
    stalled = open_transactions(kafka.bootstrap, [kafka.topic])
    assert stalled.get(kafka.topic), "the killed task's transaction should be open"

    target = ["--kafka", kafka.bootstrap, "--sink-id", kafka.sink_id, "--kafka-topic",
              kafka.topic]
    code, data = cli("status", *target)
    assert code == 1, data
    (s,) = data
    assert s["last_committed"] == 0 and s["unfinished"] == []
    assert {x["transaction"] for x in s["lingering"]} >= {
        f"{kafka.topic}[{p}]" for p in stalled[kafka.topic]}

    code, findings = cli("doctor", "--checkpoint", str(job.checkpoint), *target)
    assert code == 0 and all(f["ok"] for f in findings if f["severity"] == "error"), findings

    code, data = cli("recover", *target, "--commit-decided")
    assert code == 1 and data[0]["aborted"] == [] and data[0]["left"], data
    code, data = cli("recover", *target, "--abort-undecided")
    assert code == 0 and data[0]["left"] == [] and data[0]["aborted"], data
    wait_no_open_transactions(kafka.bootstrap, [kafka.topic, kafka.marker_topic])
    code, data = cli("status", *target)
    assert code == 0 and data[0]["lingering"] == [], data

    final = job.run()
    assert final.returncode == 0, final.tail()
    job.assert_exact()
