"""Client plumbing shared by the driver and the tasks: admin calls and committed reads.

Every call has a bounded timeout; every client error is translated through
:func:`connectors.kafka._errors.translate`, so secrets never reach a message.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewPartitions,
    NewTopic,
)

from connectors.core.errors import ConfigurationError, ConnectorError, TransientError
from connectors.kafka._config import KafkaConfig
from connectors.kafka._errors import AUTH_CODES, UNKNOWN_TOPIC_CODES, kafka_error, translate
from connectors.kafka._pool import MarkerReaders, config_key

__all__ = ["Admin", "Record", "TopicInfo", "init_transactions", "read_committed"]

logger = logging.getLogger(__name__)

#: How long a reader waits for a partition the cluster does not know yet (seconds). The
#: sink's own topics are read right after the driver creates them or adds partitions: the
#: answer to ``CreateTopics`` comes from the controller, and a broker's metadata (which the
#: reader asks) follows a few milliseconds later.
UNKNOWN_PARTITION_WAIT = 10.0
#: Errors of a partition whose metadata has not reached the broker the reader asks yet.
_NOT_YET_CODES = UNKNOWN_TOPIC_CODES | {
    KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION,
}


@dataclass(frozen=True)
class Record:
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True)
class TopicInfo:
    name: str
    partitions: int


def _err(exc: BaseException, doing: str, config: KafkaConfig, **ids: Any) -> ConnectorError:
    return translate(exc, doing=doing, secrets=config.secrets, bootstrap=config.bootstrap, **ids)


def read_committed(
    config: KafkaConfig, topic: str, partition: int, *, tail: int | None = None,
    timeout: float = 30.0, reuse: bool = False, **ids: Any,
) -> list[Record]:
    """The committed records of one partition (``read_committed``), up to its end.

    ``tail``: read only the last ``tail`` offsets (records and control records).
    The end is the partition's last stable offset. Callers read partitions that only one
    transactional id writes, right after ``init_transactions`` of that id, which returns
    once the id's previous transaction is completed (its markers written): the last stable
    offset then equals the high watermark, and every committed record is read. (A slot's
    kept producer whose probe passed does not read: it knows the newest marker.)
    Raises (never returns "nothing") when the partition cannot be read. ``reuse``: take the
    consumer from this process's idle readers and keep it after a clean read.
    """
    doing = f"reading {topic}[{partition}]"
    deadline = time.monotonic() + timeout
    tp = TopicPartition(topic, partition)
    conf = config.consumer()
    key = config_key(conf) if reuse else ""
    consumer = MarkerReaders.take(key) if reuse else None
    if consumer is None:
        try:
            consumer = Consumer(conf)
        except KafkaException as exc:
            raise _err(exc, doing, config, **ids) from None
    clean = False
    try:
        low, stable = _watermarks(consumer, tp, deadline, doing, config, **ids)
        start = low if tail is None else max(low, stable - tail)
        if stable <= start:
            clean = True
            return []
        consumer.assign([TopicPartition(topic, partition, start)])
        records: list[Record] = []
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TransientError(
                    f"{doing}: did not reach offset {stable} in {timeout:.0f} s", **ids)
            msg = consumer.poll(min(remaining, 1.0))
            if msg is None:
                continue
            error = msg.error()
            if error is not None and error.code() in _UNUSED_GROUP_CODES:
                continue  # the reader's group is never used: no ACL on it is needed
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                raise _err(KafkaException(error), doing, config, **ids)
            # A kept reader must not take anything left from an earlier read (another
            # partition, or this one before its newest records) for this one's.
            if msg.topic() != topic or msg.partition() != partition:
                continue
            offset = int(msg.offset() or 0)
            if error is not None:  # end of the partition, at ``offset``
                if offset >= stable:
                    break
                continue
            if offset < start:
                continue
            records.append(Record(offset, msg.key(), msg.value()))
            if offset >= stable - 1:
                break
        clean = True
        return records
    finally:
        if reuse and clean:
            try:
                consumer.unassign()  # nothing fetched for this read reaches the next one
            except KafkaException:
                MarkerReaders.close(consumer)
            else:
                MarkerReaders.give_back(key, consumer)
        else:
            MarkerReaders.close(consumer)


#: What librdkafka reports when the principal may not use the reader's ``group.id``: it
#: looks the group's coordinator up although the reader only assigns partitions and never
#: commits, so the sink needs no ACL on any group.
_UNUSED_GROUP_CODES = frozenset({KafkaError.GROUP_AUTHORIZATION_FAILED})
#: A config the principal may not read (DESCRIBE_CONFIGS is optional, see ``Admin``).
_CONFIG_DENIED_CODES = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED,
                                  KafkaError.CLUSTER_AUTHORIZATION_FAILED})


def _backoff(until: float) -> Iterator[None]:
    """Yields at once, then again after pauses of 5 ms doubling up to 200 ms, as long as the
    next pause ends before ``until`` (``time.monotonic()``)."""
    delay = 0.005
    yield
    while time.monotonic() + delay < until:
        time.sleep(delay)
        delay = min(2 * delay, 0.2)
        yield


def _watermarks(
    consumer: Consumer, tp: TopicPartition, deadline: float, doing: str, config: KafkaConfig,
    **ids: Any,
) -> tuple[int, int]:
    """``(low, last stable offset)`` of ``tp``, waiting up to :data:`UNKNOWN_PARTITION_WAIT`
    for a partition the metadata does not show yet (the sink only reads its own topics,
    which exist: the driver creates them, or adds partitions, before anything reads them)."""
    started = time.monotonic()
    waited_until = min(deadline, started + UNKNOWN_PARTITION_WAIT)
    text = ""
    for _ in _backoff(waited_until):
        try:
            low, stable = consumer.get_watermark_offsets(
                tp, timeout=max(deadline - time.monotonic(), 0.001), cached=False)
            return int(low), int(stable)
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is None or err.code() not in _NOT_YET_CODES:
                raise _err(exc, doing, config, **ids) from None
            text = config.redact(f"{err.name()}: {err.str()}")
        # The client's own metadata may say the topic has fewer partitions (a kept reader,
        # from before the driver added some): it is not refreshed before minutes otherwise.
        with contextlib.suppress(KafkaException):
            consumer.list_topics(tp.topic, timeout=max(0.1, min(1.0, waited_until
                                                                - time.monotonic())))
    raise TransientError(
        f"{doing} failed: the cluster still does not know this partition after "
        f"{time.monotonic() - started:.1f} s ({text}). The sink creates its ledger and marker "
        "topics before it reads them: was the topic deleted meanwhile?", **ids)


def auth_failure(client: Any, errors: list[KafkaError]) -> KafkaException | None:
    """The authentication error a client reported through ``error_cb``, if any."""
    with contextlib.suppress(Exception):  # best effort: the caller has the original error
        client.poll(0.2)  # serves error_cb
    for err in errors:
        if err.code() in AUTH_CODES:
            return KafkaException(err)
    return None


def init_transactions(producer: Any, topic: str | None, timeout: float) -> None:
    """``producer.init_transactions(timeout)``, once the producer is connected to a broker it
    learned from the cluster's metadata.

    librdkafka (2.10 and later) drops its bootstrap connection as soon as the first metadata
    names the brokers. An ``init_transactions`` that starts in that gap finds no broker to
    ask for its transaction coordinator and tries again only when its 500 ms timer fires:
    measured on a local broker, a new producer's ``init_transactions`` took 55 ms or 507 ms,
    about half the time each. Two metadata requests for ``topic`` (``None``: every topic;
    pass one that exists, a metadata request may create a missing topic on brokers that
    auto-create) first make sure a learned broker's connection is up (the first request may
    be answered by the bootstrap connection, the second then waits for a learned broker):
    57 ms every time, 31 ms with ``reconnect.backoff.ms=50``, ~15 ms with 10 (the sink's
    default; new connections wait half of it, 11 ms at least). Errors are raised as by the
    client (``KafkaException``).
    """
    deadline = time.monotonic() + timeout
    for _ in range(2):
        producer.list_topics(topic, timeout=max(0.1, deadline - time.monotonic()))
    producer.init_transactions(max(0.1, deadline - time.monotonic()))


class Admin:
    """The driver's AdminClient, created lazily (sinks are pickled: no clients in ``__init__``)."""

    def __init__(self, config: KafkaConfig, timeout: float, sink_id: str) -> None:
        self.config = config
        self.timeout = timeout
        self.sink_id = sink_id
        self._denied: set[str] = set()
        self._client: AdminClient | None = None
        self._errors: list[KafkaError] = []

    @property
    def client(self) -> AdminClient:
        if self._client is None:
            # error_cb: a refused authentication shows there, while the failing call only
            # says "transport failure".
            conf: dict[str, Any] = {**self.config.admin(), "error_cb": self._errors.append}
            self._client = AdminClient(conf)
        return self._client

    def error(self, exc: BaseException, doing: str, **ids: Any) -> ConnectorError:
        return _err(auth_failure(self.client, self._errors) or exc, doing, self.config,
                    sink_id=self.sink_id, **ids)

    def topic(self, name: str) -> TopicInfo | None:
        """Partition count of ``name``, or ``None`` if the topic does not exist.

        Raises for an unreachable cluster or a refused authentication (list_topics is the
        first request of a driver run: it is where those show up).
        """
        doing = f"reading the metadata of topic {name!r}"
        try:
            meta = self.client.list_topics(topic=name, timeout=self.timeout)
        except KafkaException as exc:
            raise self.error(exc, doing) from None
        found = meta.topics.get(name)
        if found is None or found.error is not None:
            code = found.error.code() if found is not None and found.error else None
            if found is None or code in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                         KafkaError._UNKNOWN_TOPIC):
                return None
            raise self.error(KafkaException(found.error), doing)
        return TopicInfo(name, len(found.partitions))

    def create_topic(
        self, name: str, partitions: int, replication: int, config: dict[str, str]
    ) -> None:
        doing = f"creating topic {name!r}"
        new = NewTopic(name, num_partitions=partitions, replication_factor=replication,
                       config=config)
        try:
            self.client.create_topics([new], operation_timeout=self.timeout,
                                      request_timeout=self.timeout)[name].result()
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is not None and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                self._wait_visible(name, 1)  # another driver created it meanwhile
                return
            if err is not None and err.code() in _CONFIG_DENIED_CODES:
                settings = ", ".join(f"{k}={v}" for k, v in sorted(config.items()))
                raise ConfigurationError(
                    f"{doing} failed: not authorized ({err.name()}). Grant the sink's "
                    f"principal CREATE on topic {name!r} (an ACL on the topic, a prefix of "
                    "it, or the cluster), or pre-create it: "
                    f"{partitions} partition(s){', ' + settings if settings else ''}; the "
                    "sink then uses it as it is (docs/kafka.md, section 7)",
                    sink_id=self.sink_id) from None
            raise self.error(exc, doing) from None
        logger.info("sink %s: created topic %s (%d partitions, %s)", self.sink_id, name,
                    partitions, config)
        self._wait_visible(name, partitions)

    def add_partitions(self, name: str, total: int) -> None:
        try:
            self.client.create_partitions(
                [NewPartitions(name, total)], operation_timeout=self.timeout,
                request_timeout=self.timeout)[name].result()
        except KafkaException as exc:
            raise self.error(exc, f"adding partitions to {name!r}") from None
        self._wait_visible(name, total)

    def _wait_visible(self, name: str, partitions: int) -> None:
        """Wait (up to :data:`UNKNOWN_PARTITION_WAIT`) until the metadata shows ``partitions``
        partitions of ``name``, each with a leader: ``CreateTopics`` and ``CreatePartitions``
        answer once the controller decided, and the brokers learn it a little later. Readers
        wait for their partition themselves; this wait keeps the driver's next look at the
        topic (and the tasks it starts) from seeing it half-made."""
        for _ in _backoff(time.monotonic() + UNKNOWN_PARTITION_WAIT):
            with contextlib.suppress(KafkaException):
                meta = self.client.list_topics(topic=name, timeout=self.timeout)
                found = meta.topics.get(name)
                if found is not None and found.error is None and len(found.partitions) >= (
                    partitions
                ) and all(p.error is None and p.leader >= 0 for p in found.partitions.values()):
                    return
        logger.warning("sink %s: topic %s does not show %d partitions with leaders %.0f s "
                       "after it was created", self.sink_id, name, partitions,
                       UNKNOWN_PARTITION_WAIT)

    def topic_config(self, name: str) -> dict[str, str] | None:
        """The topic's config; None when the principal may not read it (no DESCRIBE_CONFIGS
        on the topic: the sink's checks that need it are then left to the broker)."""
        return self._configs(ConfigResource(ConfigResource.Type.TOPIC, name),
                             f"reading the config of topic {name!r}",
                             f"DESCRIBE_CONFIGS on topic {name!r}")

    def broker_config(self) -> tuple[dict[str, str] | None, int]:
        """One broker's config (None when the principal may not read it), and how many
        brokers the cluster has."""
        try:
            meta = self.client.list_topics(timeout=self.timeout)
        except KafkaException as exc:
            raise self.error(exc, "reading the cluster metadata") from None
        broker = str(next(iter(meta.brokers)))
        config = self._configs(ConfigResource(ConfigResource.Type.BROKER, broker),
                               "reading the broker config", "DESCRIBE_CONFIGS on the cluster")
        return config, len(meta.brokers)

    def _configs(self, resource: ConfigResource, doing: str, acl: str) -> dict[str, str] | None:
        try:
            result = self.client.describe_configs(
                [resource], request_timeout=self.timeout)[resource].result()
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is not None and err.code() in _CONFIG_DENIED_CODES:
                if acl not in self._denied:
                    self._denied.add(acl)
                    logger.warning(
                        "sink %s: %s: not authorized; going on without it (grant %s to have "
                        "the sink check its limits before writing, instead of the broker "
                        "refusing the batch)", self.sink_id, doing, acl)
                return None
            raise self.error(exc, doing) from None
        return {k: str(v.value) for k, v in result.items() if v.value is not None}

    def close(self) -> None:
        self._client = None
