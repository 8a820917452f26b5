"""Configuration of the Kafka sink: validated once, secrets kept out of every string.

The user's ``config`` is a librdkafka configuration dict. The sink owns three keys
(``transactional.id``, ``enable.idempotence``, ``acks``): a transactional producer per slot
needs exactly these values, so passing them is refused rather than silently overridden.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from connectors.core.errors import ConfigurationError
from connectors.kafka._redact import MASK, is_secret_key, redact_text
from connectors.kafka._slot_producer import PRODUCER_CHOICES, requested_producer

__all__ = [
    "DEFAULT_TRANSACTION_TIMEOUT_MS",
    "INTERNAL_TOPIC_PREFIX",
    "LEDGER_TOPIC_SUFFIX",
    "MARKER_TOPIC_SUFFIX",
    "OWNED_KEYS",
    "KafkaConfig",
    "KafkaOptions",
    "default_ledger_topic",
    "default_marker_topic",
    "is_secret_key",
    "redact_text",
]

#: A sink's internal topics, by default ``_connectors.<sink_id>.ledger`` and
#: ``_connectors.<sink_id>.markers`` (the operator tools find sinks by these names).
INTERNAL_TOPIC_PREFIX, LEDGER_TOPIC_SUFFIX, MARKER_TOPIC_SUFFIX = (
    "_connectors.", ".ledger", ".markers")


def default_ledger_topic(sink_id: str) -> str:
    """The default ledger topic of ``sink_id``."""
    return f"{INTERNAL_TOPIC_PREFIX}{sink_id}{LEDGER_TOPIC_SUFFIX}"


def default_marker_topic(sink_id: str) -> str:
    """The default marker topic of ``sink_id``."""
    return f"{INTERNAL_TOPIC_PREFIX}{sink_id}{MARKER_TOPIC_SUFFIX}"

#: Keys the sink sets on every producer it creates; refused in the user's config.
OWNED_KEYS = ("transactional.id", "enable.idempotence", "acks", "request.required.acks")
#: librdkafka's default. A slot's transaction lives from its task's first record to its
#: commit (plus, in barrier mode, the wait for the slowest slot): the sink warns when a
#: measured transaction reaches 80% of it, and refuses a value above the broker's
#: ``transaction.max.timeout.ms``.
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
#: Fraction of ``transaction.timeout.ms`` at which a transaction's duration is warned about.
TIMEOUT_WARN_RATIO = 0.8
#: Producer-only librdkafka properties, left out of the consumer and admin configs that
#: the sink derives from the same dict (librdkafka warns about them there).
_PRODUCER_ONLY = re.compile(
    r"^(linger\.ms|queue\.buffering\..*|batch\.size|batch\.num\.messages|compression\..*|"
    r"message\.timeout\.ms|delivery\.timeout\.ms|transaction\.timeout\.ms|retries|"
    r"message\.send\.max\.retries|partitioner|sticky\..*|queuing\.strategy|"
    r"enable\.gapless\.guarantee|message\.copy\.max\.bytes|request\.timeout\.ms|"
    r"produce\.offset\.report|dr_cb|dr_msg_cb|on_delivery|delivery\.report\.only\.error)$"
)
#: Sensible defaults for a slot's producer (the user's config wins). ``partitioner``: a
#: keyed record without a ``partition`` goes where Spark's Kafka writer (Kafka's Java
#: producer: murmur2 of the key) would put it, not where librdkafka's default (CRC32) would.
_PRODUCER_DEFAULTS: dict[str, Any] = {
    "partitioner": "murmur2_random",
    "linger.ms": 20,
    "batch.size": 1_000_000,
    "queue.buffering.max.messages": 500_000,
    "queue.buffering.max.kbytes": 1_048_576,
    # librdkafka (default 100) also spaces new connections by half of it (11 ms at least),
    # which a new slot producer waits once (_io.init_transactions): 10 ms let its
    # init_transactions take ~15 ms instead of ~30 ms with 50 (Kafka's Java client default).
    # Reconnects after a failure still back off exponentially up to reconnect.backoff.max.ms.
    "reconnect.backoff.ms": 10,
}


class KafkaConfig(Mapping[str, Any]):
    """A librdkafka config dict whose secret values never show in ``str``/``repr``.

    What is secret: :func:`~connectors.kafka._redact.is_secret_key`. :meth:`redact` masks
    the secrets in any text: every message and log line of the sink that could quote a
    client's words goes through it.

    Example::

        >>> config = KafkaConfig({"bootstrap.servers": "b:9092", "sasl.password": "s3cret"})
        >>> config
        KafkaConfig({'bootstrap.servers': 'b:9092', 'sasl.password': '***'})
        >>> config.redact("SASL authentication with s3cret failed")
        'SASL authentication with *** failed'
    """

    __slots__ = ("_data",)

    def __init__(self, config: Mapping[str, Any]) -> None:
        if not isinstance(config, Mapping):
            raise ConfigurationError(
                "config must be a dict of librdkafka properties, e.g. "
                "{'bootstrap.servers': 'localhost:9092'}"
            )
        data: dict[str, Any] = {}
        for key, value in config.items():
            if not isinstance(key, str):
                raise ConfigurationError(f"config keys must be strings, got {type(key).__name__}")
            if callable(value):
                raise ConfigurationError(
                    f"config[{key!r}] is a callable: callbacks cannot travel to Spark "
                    "executors; the sink handles delivery reports and errors itself"
                )
            data[key] = value
        owned = [k for k in OWNED_KEYS if k in data]
        if owned:
            raise ConfigurationError(
                f"config sets {', '.join(owned)}, which the sink owns: every slot's producer "
                "is transactional (transactional.id derived from sink_id and slot, "
                "enable.idempotence=true, acks=all). Remove these keys"
            )
        if not str(data.get("bootstrap.servers", "")).strip():
            raise ConfigurationError(
                "config needs 'bootstrap.servers', e.g. {'bootstrap.servers': 'host:9092'}"
            )
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def with_default(self, key: str, value: Any) -> KafkaConfig:
        """This config with ``key`` set to ``value``, unless it sets ``key`` itself.

        Example::

            >>> KafkaConfig({"bootstrap.servers": "b:9092"}).with_default("linger.ms", 5)
            KafkaConfig({'bootstrap.servers': 'b:9092', 'linger.ms': 5})
        """
        if key in self._data:
            return self
        return KafkaConfig({**self._data, key: value})

    def __iter__(self) -> Any:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    @property
    def secrets(self) -> list[str]:
        """The secret values (for masking them in error texts)."""
        return [str(v) for k, v in self._data.items() if is_secret_key(k) and v]

    def redacted(self) -> dict[str, Any]:
        """The config with every secret value replaced by ``***``."""
        return {k: (MASK if is_secret_key(k) else v) for k, v in self._data.items()}

    def redact(self, text: str) -> str:
        """``text`` with this config's secrets, and any secret key's value, masked."""
        return redact_text(text, self.secrets)

    def __repr__(self) -> str:
        return f"KafkaConfig({self.redacted()!r})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KafkaConfig) and other._data == self._data

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, str(v)) for k, v in self._data.items())))

    # ---- derived configs (they hold the secrets: only for the client constructors) ----
    def producer(self, transactional_id: str, transaction_timeout_ms: int) -> dict[str, Any]:
        conf = {**_PRODUCER_DEFAULTS, **self._data}
        conf.update({
            "transactional.id": transactional_id,
            "enable.idempotence": True,
            "acks": "all",
            "transaction.timeout.ms": transaction_timeout_ms,
        })
        # librdkafka requires message.timeout.ms <= transaction.timeout.ms.
        if int(conf.get("message.timeout.ms", 300_000)) > transaction_timeout_ms:
            conf["message.timeout.ms"] = transaction_timeout_ms
        return conf

    def partitioner(self) -> tuple[str | None, int]:
        """The slot producers' ``partitioner`` (``None`` when ``default.topic.config`` may
        override it) and ``topic.metadata.refresh.interval.ms``, for batch produce's own
        placement of keyed records (:mod:`connectors.kafka._placement`)."""
        conf = self.producer("-", DEFAULT_TRANSACTION_TIMEOUT_MS)  # as every slot's
        name = None if "default.topic.config" in conf else conf.get("partitioner")
        try:
            refresh = int(conf.get("topic.metadata.refresh.interval.ms", 300_000))
        except (TypeError, ValueError):
            refresh = 300_000
        return (str(name) if name is not None else None), refresh

    def queue_limit(self) -> int:
        """The slot producers' ``queue.buffering.max.messages`` (batch produce waits for
        room for a whole call: :mod:`connectors.kafka._batch`)."""
        conf = self.producer("-", DEFAULT_TRANSACTION_TIMEOUT_MS)
        try:
            return max(1, int(conf.get("queue.buffering.max.messages", 100_000)))
        except (TypeError, ValueError):
            return 100_000

    def consumer(self) -> dict[str, Any]:
        conf = {k: v for k, v in self._data.items() if not _PRODUCER_ONLY.match(k)}
        conf.update({
            "group.id": "connectors-reader",  # never joins: partitions are assigned
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            # A read ends at the partition's end: librdkafka reports it with the answer to
            # a fetch past the last record, which the broker holds this long (10 ms: a
            # marker read took ~12 ms; 1 ms: ~3 ms).
            "fetch.wait.max.ms": 1,
        })
        return conf

    def admin(self) -> dict[str, Any]:
        drop = re.compile(r"^(group\.id|isolation\.level|auto\.offset\.reset|enable\..*)$")
        return {
            k: v for k, v in self._data.items()
            if not _PRODUCER_ONLY.match(k) and not drop.match(k)
        }

    @property
    def bootstrap(self) -> str:
        return str(self._data["bootstrap.servers"])


_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")


def validate_topic(topic: object, what: str = "topic") -> str:
    if not isinstance(topic, str) or not _TOPIC.fullmatch(topic) or topic in (".", ".."):
        raise ConfigurationError(
            f"{what} {topic!r} is not a valid Kafka topic name: 1-249 characters of "
            "A-Z, a-z, 0-9, '.', '_' and '-'"
        )
    return topic


@dataclass(frozen=True)
class KafkaOptions:
    """Validated options of :class:`~connectors.kafka.KafkaSink`."""

    topic: str | None
    marker_topic: str
    ledger_topic: str
    create_topic: bool = False
    topic_partitions: int = 1
    replication_factor: int = -1
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS
    operation_timeout_s: float = 30.0
    reuse_producers: bool = True
    #: ``True``: the ctypes accelerator where verified, else ``Producer.produce_batch``;
    #: ``"public"``: ``produce_batch`` only; ``False``: one ``produce()`` per record.
    batch_produce: bool | str = True
    #: The slot producer (``CONNECTORS_KAFKA_PRODUCER`` where the sink is built):
    #: ``"auto"``, ``"owned"`` or ``"confluent"`` (:mod:`connectors.kafka._slot_producer`).
    producer: str = field(default_factory=requested_producer)

    @property
    def produce_mode(self) -> str:
        """``batch_produce`` as ``"auto"``, ``"public"`` or ``"record"``."""
        if self.batch_produce is True:
            return "auto"
        return "record" if self.batch_produce is False else str(self.batch_produce)

    def __post_init__(self) -> None:
        if self.topic is not None:
            validate_topic(self.topic)
        validate_topic(self.marker_topic, "marker_topic")
        validate_topic(self.ledger_topic, "ledger_topic")
        if self.marker_topic == self.ledger_topic or self.topic in (
            self.marker_topic, self.ledger_topic
        ):
            raise ConfigurationError(
                "topic, marker_topic and ledger_topic must be three different topics"
            )
        t = self.transaction_timeout_ms
        if isinstance(t, bool) or not isinstance(t, int) or t < 1000:
            raise ConfigurationError(
                "transaction.timeout.ms must be an int >= 1000 (milliseconds)"
            )
        if not isinstance(self.topic_partitions, int) or self.topic_partitions < 1:
            raise ConfigurationError("topic_partitions must be an int >= 1")
        if not isinstance(self.replication_factor, int) or self.replication_factor == 0:
            raise ConfigurationError("replication_factor must be -1 (broker default) or >= 1")
        if self.operation_timeout_s <= 0:
            raise ConfigurationError("operation_timeout_s must be > 0")
        if self.producer not in PRODUCER_CHOICES:
            raise ConfigurationError(f"producer must be one of {PRODUCER_CHOICES}, not "
                                     f"{self.producer!r}")
        if not isinstance(self.batch_produce, bool) and self.batch_produce not in (
            "public",
        ):
            raise ConfigurationError(
                f"batch_produce must be True (the ctypes accelerator where verified, else "
                f"Producer.produce_batch), 'public' (Producer.produce_batch only) or False "
                f"(one produce() per record), not {self.batch_produce!r}")
