"""The operator tools' view of Kafka: ledger topics, marker topics, open transactions.

confluent-kafka has no list/describe-transactions call, so an open transaction is seen the
way a ``read_committed`` consumer feels it: a partition whose last stable offset (LSO) is
below its high watermark (HWM). Checked: the sink's marker and ledger topics, and the
output topics named with ``--kafka-topic`` (an open slot transaction holds back the output
topic before its marker is written). KafkaSink commits in its tasks, so nothing is ever
"decided but not committed"; ``recover`` fences every slot id of the sink
(``init_transactions``), which aborts what a dead task or driver left open. The ledger is
read without taking its lease, so ``status`` and ``doctor`` never fence a live driver. All of
it is :mod:`connectors.kafka.admin`'s; here it becomes what the commands report.
"""

from __future__ import annotations

from typing import Any

from connectors.cli._model import Lingering, RecoverReport
from connectors.cli._targets import Target
from connectors.core.ledgers.ledger import Ledger

__all__ = ["KafkaTarget"]


class KafkaTarget(Target):
    """A Kafka cluster and the KafkaSinks' internal topics in it
    (:class:`connectors.kafka.admin.KafkaAdmin`)."""

    kind = "kafka"

    def __init__(self, bootstrap: str, config: dict[str, Any] | None = None,
                 topics: list[str] | None = None, timeout: float = 30.0) -> None:
        from connectors.kafka.admin import KafkaAdmin, check_topic

        self.admin = KafkaAdmin(bootstrap, config,
                                topics=[check_topic(t, "--kafka-topic") for t in topics or []],
                                timeout=timeout)

    def describe(self) -> str:
        return self.admin.describe()

    def sink_ids(self) -> list[str]:
        return self.admin.sink_ids()

    def ledger(self, sink_id: str) -> Ledger:
        return self.admin.ledger(sink_id)

    def lingering(self, sink_id: str) -> list[Lingering]:
        return [Lingering(str(p), None, None, False,
                          f"open transaction: LSO {p.last_stable_offset} < HWM "
                          f"{p.high_watermark}")
                for p in self.admin.open_transactions(sink_id)]

    def recover(
        self, sink_id: str, *, commit_decided: bool, abort_undecided: bool, min_age_s: float
    ) -> RecoverReport:
        report = RecoverReport(sink_id, self.describe())
        open_now = self.lingering(sink_id)
        if not open_now:
            return report
        if not abort_undecided:
            report.left = open_now
            report.notes.append("KafkaSink commits in its tasks: an open transaction is never "
                                "decided; --abort-undecided fences the slots to abort it")
            return report
        fenced = self.admin.settle(sink_id, commit_decided=commit_decided, abort_undecided=True)
        report.notes.append(f"fenced {fenced} slot transactional id(s) (init_transactions); "
                            "a live driver's task in flight fails and Spark retries it")
        still = {str(p) for p in self.admin.still_open(sink_id)}
        report.aborted = [i.transaction for i in open_now if i.transaction not in still]
        report.left = [i for i in open_now if i.transaction in still]
        return report

    def close(self) -> None:
        self.admin.close()
