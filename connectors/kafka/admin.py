"""Operating KafkaSinks from outside their queries: their ledgers, open transactions, fencing.

The operator tools (``connectors status``, ``recover``, ``doctor``) read and settle a
cluster through this module, and so can a script. :class:`KafkaAdmin` is one cluster:

- :meth:`~KafkaAdmin.sink_ids`: every sink with a ledger topic
  (``_connectors.<sink_id>.ledger``, the sinks' default);
- :meth:`~KafkaAdmin.ledger`: a sink's ledger, read without taking its lease (reading it
  never fences a live driver);
- :meth:`~KafkaAdmin.open_transactions`: the partitions a transaction holds open.
  confluent-kafka has no list/describe-transactions call, so an open transaction is seen
  the way a ``read_committed`` consumer feels it: a partition whose last stable offset
  (LSO) is below its high watermark (HWM). Checked: the sink's marker and ledger topics,
  and the output topics the admin was given (an open slot transaction holds back the
  output topic before its marker is written);
- :meth:`~KafkaAdmin.settle`: a KafkaSink commits in its tasks, so nothing is ever
  "decided but not committed": settling fences every slot's transactional id
  (``init_transactions``), which aborts what a dead task or driver left open, with the
  steps a driver's start runs; :meth:`~KafkaAdmin.still_open` waits for the brokers to
  write the abort markers.

:func:`is_secret_key` says which client settings hold a secret (a command line refuses
them); :func:`check_topic` checks a topic name. Settings are never shown: errors and
:meth:`KafkaAdmin.describe` name the bootstrap servers only.

Example (``bootstrap``: the cluster's bootstrap servers)::

    from connectors.kafka.admin import KafkaAdmin

    admin = KafkaAdmin(bootstrap, {"security.protocol": "PLAINTEXT"})
    try:
        if admin.open_transactions(sink_id):  # what a dead driver left open
            admin.settle(sink_id, abort_undecided=True)
            assert not admin.still_open(sink_id)
    finally:
        admin.close()
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from connectors.core.ledgers.ledger import Ledger
from connectors.kafka._config import (
    INTERNAL_TOPIC_PREFIX,
    LEDGER_TOPIC_SUFFIX,
    KafkaConfig,
    default_ledger_topic,
    default_marker_topic,
    validate_topic,
)
from connectors.kafka._io import Admin
from connectors.kafka._ledger import KafkaLedger
from connectors.kafka._redact import is_secret_key
from connectors.kafka._sink import KafkaSink

__all__ = ["KafkaAdmin", "OpenTransaction", "check_topic", "is_secret_key"]


class _SettlingSink(KafkaSink):
    """The KafkaSink :meth:`KafkaAdmin.settle` builds to fence a sink's slots: it runs no
    batch, so it needs no pyspark (``connectors recover`` works where Spark is not)."""

    _spark_needed = False


@dataclass(frozen=True)
class OpenTransaction:
    """A partition held open by a transaction: its last stable offset is below its high
    watermark, so ``read_committed`` consumers stop there."""

    topic: str
    partition: int
    last_stable_offset: int
    high_watermark: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"


def check_topic(topic: str, what: str = "topic") -> str:
    """``topic`` if it is a valid Kafka topic name, else a
    :class:`~connectors.core.errors.ConfigurationError` that names it as ``what``."""
    return validate_topic(topic, what)


class KafkaAdmin:
    """One Kafka cluster and the KafkaSinks' internal topics in it.

    ``config``: librdkafka settings (``bootstrap.servers`` is ``bootstrap``); ``topics``:
    output topics to check for open transactions too; ``timeout``: seconds per request."""

    def __init__(self, bootstrap: str, config: dict[str, Any] | None = None,
                 topics: Sequence[str] = (), timeout: float = 30.0) -> None:
        self.config = KafkaConfig({**(config or {}), "bootstrap.servers": bootstrap})
        self.topics = list(topics)
        self.timeout = timeout
        self._admin: Admin | None = None

    def describe(self) -> str:
        """The cluster for humans: its bootstrap servers (no setting's value)."""
        return f"kafka {self.config.bootstrap}"

    def _client(self) -> Admin:
        if self._admin is None:
            self._admin = Admin(self.config, self.timeout, "operator")
        return self._admin

    def sink_ids(self) -> list[str]:
        """Every sink id with a ledger topic of the default name in the cluster."""
        try:
            names = self._client().client.list_topics(timeout=self.timeout).topics
        except Exception as exc:
            raise self._client().error(exc, "listing topics") from None
        return sorted(n[len(INTERNAL_TOPIC_PREFIX):-len(LEDGER_TOPIC_SUFFIX)] for n in names
                      if n.startswith(INTERNAL_TOPIC_PREFIX) and n.endswith(LEDGER_TOPIC_SUFFIX))

    def ledger(self, sink_id: str) -> Ledger:
        """The sink's ledger, read only (no lease taken); the caller closes it."""
        return KafkaLedger(self.config, default_ledger_topic(sink_id), sink_id=sink_id,
                           admin=self._client(), timeout=self.timeout, read_only=True)

    def _open_partitions(self, sink_id: str) -> list[OpenTransaction]:
        """Every checked partition with LSO < HWM, looked at once."""
        from confluent_kafka import Consumer, TopicPartition

        topics = [default_marker_topic(sink_id), default_ledger_topic(sink_id),
                  *self.topics]
        committed = Consumer({**self.config.consumer(), "isolation.level": "read_committed"})
        uncommitted = Consumer({**self.config.consumer(),
                                "isolation.level": "read_uncommitted"})
        found = []
        try:
            for topic in topics:
                info = self._client().topic(topic)
                for p in range(info.partitions if info else 0):
                    tp = TopicPartition(topic, p)
                    _, lso = committed.get_watermark_offsets(tp, self.timeout, cached=False)
                    _, hwm = uncommitted.get_watermark_offsets(tp, self.timeout, cached=False)
                    if lso < hwm:
                        found.append(OpenTransaction(topic, p, int(lso), int(hwm)))
        except Exception as exc:
            raise self._client().error(exc, "reading offsets") from None
        finally:
            committed.close()
            uncommitted.close()
        return found

    def open_transactions(self, sink_id: str) -> list[OpenTransaction]:
        """The partitions of the sink's topics (and the output topics given) that a
        transaction holds open. Commit and abort markers are written just after a commit
        returns, so the partitions are looked at twice, a second apart: listed are those
        open both times."""
        first = {str(p) for p in self._open_partitions(sink_id)}
        if not first:
            return []
        time.sleep(1.0)
        return [p for p in self._open_partitions(sink_id) if str(p) in first]

    def settle(self, sink_id: str, *, abort_undecided: bool,
               commit_decided: bool = False) -> int:
        """Fence every slot transactional id of the sink (``init_transactions``), which
        aborts what a dead task or driver left open; a live driver's task in flight then
        fails and Spark retries it. Nothing is done without ``abort_undecided`` (a
        KafkaSink has no decided, uncommitted transaction: ``commit_decided`` changes
        nothing). Returns how many transactional ids were fenced. The sink's
        :class:`~connectors.core.driver.sink_driver.SinkDriver` does it, as a run of its own."""
        if not abort_undecided:
            return 0
        sink = _SettlingSink(None, dict(self.config), sink_id=sink_id)
        try:
            # The steps a driver's start runs for a slot sink: fence every slot.
            _settled, metrics = sink.driver.settle([], commit_decided=commit_decided,
                                                   abort_undecided=True)
        finally:
            sink.close()
        return metrics.reconciled

    def still_open(self, sink_id: str) -> list[OpenTransaction]:
        """After :meth:`settle`: the partitions still held open once the brokers had up to
        ``timeout`` seconds to write the abort markers."""
        deadline = time.monotonic() + self.timeout
        left = self._open_partitions(sink_id)
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = self._open_partitions(sink_id)
        return left

    def close(self) -> None:
        """Release the admin client."""
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    def __repr__(self) -> str:
        return f"KafkaAdmin({self.config.bootstrap!r})"

