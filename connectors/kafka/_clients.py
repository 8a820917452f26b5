"""The clients of :class:`~connectors.kafka.KafkaSink` and what they are made from: its
config (which :meth:`KafkaClients.check_broker` may tune once), its options, the driver's
admin client (created lazily, never shipped to the tasks), slot producers, committed marker
reads, and the translation of client errors (secrets never reach a message).

Every other collaborator of the sink receives this one object as a constructor argument.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from confluent_kafka import Producer

from connectors.core.errors import ConfigurationError, ConnectorError
from connectors.core.templates.tasks import SlotMarker
from connectors.kafka._config import KafkaConfig, KafkaOptions
from connectors.kafka._errors import translate
from connectors.kafka._io import Admin, read_committed
from connectors.kafka._pool import config_key
from connectors.kafka._task_slot import DENSE_MAX_BROKERS, MARKER_TAIL, marker_key

__all__ = ["KafkaClients"]

logger = logging.getLogger(__name__)


class KafkaClients:
    """One sink's config, options and clients (see the module docstring)."""

    def __init__(self, config: KafkaConfig, options: KafkaOptions, *, sink_id: str) -> None:
        self.config = config
        self.options = options
        self.sink_id = sink_id
        self._admin: Admin | None = None
        self._checked_broker = False

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_admin"] = None  # driver clients never travel to executors
        return state

    @property
    def timeout(self) -> float:
        """Seconds for one client operation."""
        return self.options.operation_timeout_s

    def error(self, exc: BaseException, doing: str, **ids: Any) -> ConnectorError:
        """``exc`` as the library's error, secrets redacted."""
        return translate(exc, doing=doing, secrets=self.config.secrets,
                         bootstrap=self.config.bootstrap, sink_id=self.sink_id, **ids)

    def admin(self) -> Admin:
        """Driver: the admin client (made on first use)."""
        if self._admin is None:
            self._admin = Admin(self.config, self.timeout, self.sink_id)
        return self._admin

    def producer(self, transactional_id: str, **extra: Any) -> Producer:
        """A new transactional producer (``extra``: callbacks and settings on top)."""
        conf = self.config.producer(transactional_id, self.options.transaction_timeout_ms)
        conf.update(extra)
        return Producer(conf)

    def producer_config(self, transactional_id: str) -> dict[str, Any]:
        """A slot producer's librdkafka config (secrets included: only for the client)."""
        return self.config.producer(transactional_id, self.options.transaction_timeout_ms)

    def pool_key(self, transactional_id: str) -> str:
        """The key of the slot's kept producer in this process (:mod:`._pool`)."""
        conf = self.config.producer(transactional_id, self.options.transaction_timeout_ms)
        return config_key(conf, transactional_id)

    def last_marker(self, slot: int, batch_id: int | None = None) -> SlotMarker | None:
        """The newest committed marker of ``slot`` (its partition of the marker topic)."""
        tail: int | None = MARKER_TAIL
        while True:
            records = read_committed(self.config, self.options.marker_topic, slot, tail=tail,
                                     timeout=self.options.operation_timeout_s,
                                     reuse=self.options.reuse_producers,
                                     sink_id=self.sink_id, batch_id=batch_id)
            for record in reversed(records):
                if record.key != marker_key(slot) or record.value is None:
                    continue
                marker = SlotMarker.from_json(json.loads(record.value))
                if marker.sink_id == self.sink_id and marker.slot == slot:
                    return marker
            if tail is None:
                return None
            tail = None  # nothing in the tail: read the whole (compacted) partition

    def check_broker(self) -> None:
        """Driver, once: ``transaction.timeout.ms`` must not exceed the broker's maximum. On
        a cluster of at most :data:`DENSE_MAX_BROKERS` brokers, the clients the sink starts
        from now on connect to every broker at once (``enable.sparse.connections=false``,
        unless the config sets it): a new slot producer is ready in ~5 ms instead of ~17 ms."""
        if self._checked_broker:
            return
        broker, brokers = self.admin().broker_config()
        if brokers <= DENSE_MAX_BROKERS:
            self.config = self.config.with_default("enable.sparse.connections", False)
        # Unreadable (no DESCRIBE_CONFIGS on the cluster): not checked here; a value above
        # the broker's maximum then fails the producers' start (INVALID_TRANSACTION_TIMEOUT,
        # a ConfigurationError naming it too).
        limit = (None if broker is None
                 else int(broker.get("transaction.max.timeout.ms", 900_000)))
        mine = self.options.transaction_timeout_ms
        if limit is not None and mine > limit:
            raise ConfigurationError(
                f"transaction.timeout.ms={mine} is above the broker's transaction.max.timeout.ms"
                f"={limit}: every slot's producer would fail to start. Lower "
                f"transaction.timeout.ms to at most {limit}, or raise the broker maximum",
                sink_id=self.sink_id)
        self._checked_broker = True

    def close(self) -> None:
        """Driver: drop the admin client."""
        if self._admin is not None:
            self._admin.close()
            self._admin = None
