"""The slot's transactional producer: what the slot's transaction calls
(:class:`SlotProducer`), and which implementation a slot gets (:func:`owned_library`).

Two implementations: confluent-kafka's ``Producer`` (records enqueued by the ctypes
accelerator where verified, else ``Producer.produce_batch``: :mod:`._produce`), and
:class:`~connectors.kafka._owned.OwnedProducer`, a handle the library owns through
librdkafka's public C API, fed from the Arrow buffers.

``CONNECTORS_KAFKA_PRODUCER`` (read on the driver when the sink is built, and shipped to
the tasks with its options): ``auto`` (default) the owned handle where librdkafka loads and
passes its version and symbol check, else confluent-kafka's ``Producer`` with one WARNING
per process naming why; ``owned``; ``confluent`` (the path before the owned handle).
A config with Python callables (``error_cb``, ``oauth_cb``, ``stats_cb``, ``logger``,
...) or dict values, which ``rd_kafka_conf_set`` cannot carry, uses confluent-kafka's
``Producer`` (one log line per process).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, Protocol

from connectors.core.errors import ConfigurationError
from connectors.kafka._rdkafka_lib import Library, load

__all__ = ["PRODUCER_CHOICES", "PRODUCER_ENV", "SlotProducer", "owned_library",
           "requested_producer"]

logger = logging.getLogger(__name__)

#: The environment variable that picks the slot producer.
PRODUCER_ENV = "CONNECTORS_KAFKA_PRODUCER"
PRODUCER_CHOICES = ("auto", "owned", "confluent")

_LOGGED: set[str] = set()


class SlotProducer(Protocol):
    """The calls of a slot's transactional producer (confluent-kafka's ``Producer``
    signatures; errors raised as ``KafkaException``, a full queue as ``BufferError``)."""

    def init_transactions(self, timeout: float = ...) -> None: ...
    def begin_transaction(self) -> None: ...
    def commit_transaction(self, timeout: float = ...) -> None: ...
    def abort_transaction(self, timeout: float = ...) -> None: ...
    def poll(self, timeout: float = ...) -> int: ...
    def flush(self, timeout: float = ...) -> int: ...
    def list_topics(self, topic: str | None = ..., timeout: float = ...) -> Any: ...
    def produce(self, topic: str, value: Any = ..., key: Any = ..., partition: int = ...,
                *, headers: Any = ...) -> None: ...
    def __len__(self) -> int: ...


def requested_producer(environ: Mapping[str, str] | None = None) -> str:
    """The value of :data:`PRODUCER_ENV` (``auto`` when unset); raises
    ``ConfigurationError`` for any other value than :data:`PRODUCER_CHOICES`."""
    value = (os.environ if environ is None else environ).get(PRODUCER_ENV, "").strip().lower()
    if not value:
        return "auto"
    if value not in PRODUCER_CHOICES:
        raise ConfigurationError(f"{PRODUCER_ENV}={value!r}: expected one of "
                                 f"{', '.join(PRODUCER_CHOICES)}")
    return value


def _once(level: int, message: str, *args: Any) -> None:
    text = message % args
    if text not in _LOGGED:
        _LOGGED.add(text)
        logger.log(level, text)


def unsupported(config: Mapping[str, Any]) -> list[str]:
    """The config keys an owned handle cannot carry (callables, dicts); names only."""
    return sorted(str(k) for k, v in config.items()
                  if callable(v) or isinstance(v, Mapping | list | tuple | set))


def owned_library(requested: str, produce_mode: str,
                  config: Mapping[str, Any]) -> Library | None:
    """The librdkafka a slot's owned handle runs on, or ``None``: confluent-kafka's
    ``Producer``. ``requested``: the sink's :data:`PRODUCER_ENV` choice; ``produce_mode``:
    its ``batch_produce`` (``"public"`` and ``"record"`` name confluent-kafka's calls, so
    they keep them). ``owned`` with a librdkafka that does not load raises
    ``ConfigurationError``."""
    if requested == "confluent" or produce_mode != "auto":
        return None
    keys = unsupported(config)
    if keys:
        _once(logging.WARNING, "Kafka slot producers use confluent-kafka's Producer: the "
              "config sets %s, which a librdkafka handle of this library cannot carry "
              "(%s=owned needs plain values)", ", ".join(keys), PRODUCER_ENV)
        return None
    try:
        return load()
    except OSError as exc:
        if requested == "owned":
            raise ConfigurationError(f"{PRODUCER_ENV}=owned, but librdkafka cannot be "
                                     f"used: {exc}") from None
        _once(logging.WARNING, "Kafka slot producers use confluent-kafka's Producer "
              "instead of a librdkafka handle of their own: %s (set %s=confluent to "
              "silence this)", exc, PRODUCER_ENV)
        return None
