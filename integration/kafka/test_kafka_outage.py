"""The Kafka broker SIGKILLed and restarted under a running streaming query (issue 40, item
0): the query rides it out.

One driver run of ``examples.stream_to_kafka`` (a file source, one file per batch) writes
while the broker is SIGKILLed and started again (same address) several times, each after
the job committed a few more batches. Nothing restarts the job: a batch whose slots meet the
dead broker waits for it (the slots' retries with backoff), or, when a transaction was cut
or the retries ran out, runs again as a new driver run within the sink's
``outage_timeout``: its slots are fenced, the
committed ones find their markers, the others write again. The run ends by itself with exit
0; a ``read_committed`` consumer sees every record once, every batch is COMMITTED, no
transaction stays open. The seconds from the broker's return to the next committed batch
are printed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from integration.kafka.test_kafka_kill import KafkaJob, kafka_own  # noqa: F401 - the fixture
from integration.support._fixtures_services import NativeKafka
from integration.support._kafka import KafkaTarget
from integration.support._outage import ride_out, started_while_down

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OUTAGES, EVERY = 3, 3


def test_broker_sigkilled_and_restarted_again_and_again_under_one_driver_run_is_exact(
    tmp_path: Path, kafka_own: KafkaTarget, native_kafka: NativeKafka  # noqa: F811
) -> None:
    job = KafkaJob(tmp_path, kafka_own, files=OUTAGES * EVERY + 4)

    def committed() -> int:
        return sum(1 for s in job.ledger().values() if s == "COMMITTED")

    seen = ride_out(job, progress=committed, outages=OUTAGES, every=EVERY,
                    restart=lambda _: native_kafka.restart(kill=True, downtime=2.0))
    print(seen.report("Kafka broker SIGKILLed and restarted"))
    assert seen.run.returncode == 0, seen.run.tail()
    metrics = seen.run.metrics()
    print([(m["batch_id"], m["outcome"], m.get("total_ms"), m.get("retries"),
            m.get("batch_restarts")) for m in metrics])
    # Each outage met a batch in flight: it waited for the broker (the slots' retries
    # with backoff, the sink's ``retry``), or failed and ran again (``outage_timeout``).
    met = [m for m in metrics if m.get("batch_restarts")
           or float(m.get("total_ms", 0)) > 5000]
    assert len(met) >= OUTAGES, metrics
    job.assert_exact()
    kafka_own.assert_no_open_transactions()


def test_a_query_started_while_the_broker_is_down_waits_for_it_then_is_exact(
    tmp_path: Path, kafka_own: KafkaTarget, native_kafka: NativeKafka  # noqa: F811
) -> None:
    """The driver's first contact with the cluster meets no broker (stopped before the
    driver starts, started 10 s after the query's first batch is in Spark's offset log):
    "no answer from the Kafka cluster" is transient, so the batch waits within
    ``outage_timeout`` and lands once the broker is back."""
    job = KafkaJob(tmp_path, kafka_own, files=3)
    run, after = started_while_down(job, stop=lambda: native_kafka.stop(kill=True),
                                    start=native_kafka.start)
    assert run.returncode == 0, run.tail()
    first = run.batch_metrics(kafka_own.sink_id, 0)
    print(f"first contact with the broker down: the run ended {after:.1f} s "
          f"after its return; batch 0: {first}")
    job.assert_exact()
    kafka_own.assert_no_open_transactions()
