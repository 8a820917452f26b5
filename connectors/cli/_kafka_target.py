"""The operator tools' view of Kafka: ledger topics, marker topics, open transactions.

confluent-kafka has no list/describe-transactions call, so an open transaction is seen the
way a ``read_committed`` consumer feels it: a partition whose last stable offset (LSO) is
below its high watermark (HWM). Checked: the sink's marker and ledger topics, and the
output topics named with ``--kafka-topic`` (an open slot transaction holds back the output
topic before its marker is written). KafkaSink commits in its tasks, so nothing is ever
"decided but not committed"; ``recover`` fences every slot id of the sink
(``init_transactions``), which aborts what a dead task or driver left open. The ledger is
read without taking its lease, so ``status`` and ``doctor`` never fence a live driver.
"""

from __future__ import annotations

import time
from typing import Any

from connectors.cli._model import Lingering, RecoverReport
from connectors.cli._targets import Target
from connectors.core.ledger import Ledger

__all__ = ["KafkaTarget"]

_PREFIX, _LEDGER_SUFFIX, _MARKER_SUFFIX = "_connectors.", ".ledger", ".markers"


class KafkaTarget(Target):
    """A Kafka cluster and the KafkaSinks' internal topics in it."""

    kind = "kafka"

    def __init__(self, bootstrap: str, config: dict[str, Any] | None = None,
                 topics: list[str] | None = None, timeout: float = 30.0) -> None:
        from connectors.kafka._config import KafkaConfig, validate_topic

        self.config = KafkaConfig({**(config or {}), "bootstrap.servers": bootstrap})
        self.topics = [validate_topic(t, "--kafka-topic") for t in topics or []]
        self.timeout = timeout
        self._admin: Any = None

    def describe(self) -> str:
        return f"kafka {self.config.bootstrap}"

    def _admin_client(self) -> Any:
        from connectors.kafka._io import Admin

        if self._admin is None:
            self._admin = Admin(self.config, self.timeout, "operator")
        return self._admin

    def sink_ids(self) -> list[str]:
        try:
            names = self._admin_client().client.list_topics(timeout=self.timeout).topics
        except Exception as exc:
            raise self._admin_client().error(exc, "listing topics") from None
        return sorted(n[len(_PREFIX):-len(_LEDGER_SUFFIX)] for n in names
                      if n.startswith(_PREFIX) and n.endswith(_LEDGER_SUFFIX))

    def ledger(self, sink_id: str) -> Ledger:
        from connectors.kafka._ledger import KafkaLedger

        return KafkaLedger(self.config, f"{_PREFIX}{sink_id}{_LEDGER_SUFFIX}", sink_id=sink_id,
                           admin=self._admin_client(), timeout=self.timeout, read_only=True)

    def _open_partitions(self, sink_id: str) -> list[tuple[str, int, int, int]]:
        """(topic, partition, LSO, HWM) of every checked partition with LSO < HWM."""
        from confluent_kafka import Consumer, TopicPartition

        topics = [f"{_PREFIX}{sink_id}{_MARKER_SUFFIX}", f"{_PREFIX}{sink_id}{_LEDGER_SUFFIX}",
                  *self.topics]
        committed = Consumer({**self.config.consumer(), "isolation.level": "read_committed"})
        uncommitted = Consumer({**self.config.consumer(),
                                "isolation.level": "read_uncommitted"})
        found = []
        try:
            for topic in topics:
                info = self._admin_client().topic(topic)
                for p in range(info.partitions if info else 0):
                    tp = TopicPartition(topic, p)
                    _, lso = committed.get_watermark_offsets(tp, self.timeout, cached=False)
                    _, hwm = uncommitted.get_watermark_offsets(tp, self.timeout, cached=False)
                    if lso < hwm:
                        found.append((topic, p, int(lso), int(hwm)))
        except Exception as exc:
            raise self._admin_client().error(exc, "reading offsets") from None
        finally:
            committed.close()
            uncommitted.close()
        return found

    def lingering(self, sink_id: str) -> list[Lingering]:
        # Commit/abort markers are written just after commit_transaction returns: look twice.
        first = {(t, p) for t, p, _, _ in self._open_partitions(sink_id)}
        if not first:
            return []
        time.sleep(1.0)
        return [Lingering(f"{t}[{p}]", None, None, False,
                          f"open transaction: LSO {lso} < HWM {hwm}")
                for t, p, lso, hwm in self._open_partitions(sink_id) if (t, p) in first]

    def recover(
        self, sink_id: str, *, commit_decided: bool, abort_undecided: bool, min_age_s: float
    ) -> RecoverReport:
        from connectors.kafka._sink import KafkaSink

        report = RecoverReport(sink_id, self.describe())
        open_now = self.lingering(sink_id)
        if not open_now:
            return report
        if not abort_undecided:
            report.left = open_now
            report.notes.append("KafkaSink commits in its tasks: an open transaction is never "
                                "decided; --abort-undecided fences the slots to abort it")
            return report
        sink = KafkaSink(None, dict(self.config), sink_id=sink_id)
        try:
            # The steps a driver's start runs for a slot sink: fence every slot.
            _, metrics = sink.driver.settle([], commit_decided=commit_decided,
                                            abort_undecided=True)
            fenced = metrics.reconciled
        finally:
            sink.close()
        report.notes.append(f"fenced {fenced} slot transactional id(s) (init_transactions); "
                            "a live driver's task in flight fails and Spark retries it")
        deadline = time.monotonic() + self.timeout
        left = self._open_partitions(sink_id)
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = self._open_partitions(sink_id)
        still = {f"{t}[{p}]" for t, p, _, _ in left}
        report.aborted = [i.transaction for i in open_now if i.transaction not in still]
        report.left = [i for i in open_now if i.transaction in still]
        return report

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
