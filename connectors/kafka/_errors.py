"""One table from librdkafka errors to the library's exception tree.

===========================  ==========================================================
librdkafka says              the sink does
===========================  ==========================================================
authentication / SASL / SSL  :class:`ConfigurationError` naming the fix (never a secret)
authorization                :class:`ConfigurationError` naming the ACL to grant
fenced / invalid epoch       :class:`FencedError` (another owner took the slot)
unknown topic or partition   :class:`BadInputError`
record too large             :class:`BadInputError`
``retriable()``              :class:`TransientError`: retried with backoff
``txn_requires_abort()``     :class:`TransientError`: abort, redo the transaction
``fatal()``                  :class:`FatalError`: a new producer, or a clear failure
===========================  ==========================================================
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException

from connectors.core.errors import (
    BadInputError,
    ConfigurationError,
    ConnectorError,
    FatalError,
    FencedError,
    TransientError,
)
from connectors.kafka._config import redact_text

__all__ = ["AUTH_CODES", "FENCED_CODES", "kafka_error", "translate"]

AUTH_CODES = frozenset({
    KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError.UNSUPPORTED_SASL_MECHANISM, KafkaError.ILLEGAL_SASL_STATE, KafkaError._SSL,
})
AUTHZ_CODES = frozenset({
    KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
})
FENCED_CODES = frozenset({
    KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
})
UNKNOWN_TOPIC_CODES = frozenset({
    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION,
})
TOO_LARGE_CODES = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})
UNREACHABLE_CODES = frozenset({
    KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT,
})


def _grant(code: int, sink_id: object) -> str:
    """What to grant for an authorization error (docs/kafka.md section 7 lists them all)."""
    prefix = f"eos1|{sink_id}|" if sink_id else "eos1|<sink_id>|"
    if code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        return (f"Grant the sink's principal WRITE and DESCRIBE on TransactionalId prefix "
                f"{prefix!r} (kafka-acls --resource-pattern-type prefixed "
                f"--transactional-id '{prefix}' --operation Write --operation Describe)")
    if code == KafkaError.CLUSTER_AUTHORIZATION_FAILED:
        return ("Grant the sink's principal IDEMPOTENT_WRITE on the cluster (brokers before "
                "Kafka 3.0; later ones need only WRITE on its transactional ids)")
    return ("Grant the sink's principal WRITE and DESCRIBE on every topic it writes, and "
            "READ, WRITE and DESCRIBE on its internal topics (_connectors.<sink_id>.markers "
            "and .ledger); see docs/kafka.md, section 7")


def kafka_error(exc: BaseException) -> KafkaError | None:
    """The ``KafkaError`` inside a ``KafkaException`` (or the error itself)."""
    if isinstance(exc, KafkaError):
        return exc
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def translate(
    exc: BaseException | KafkaError, *, doing: str, secrets: list[str], bootstrap: str = "",
    **ids: Any,
) -> ConnectorError:
    """The library's error for a client error raised while ``doing`` something."""
    if isinstance(exc, ConnectorError):
        return exc
    err = kafka_error(exc) if isinstance(exc, BaseException) else exc
    if err is None:
        text = redact_text(f"{type(exc).__name__}: {exc}", secrets)
        return TransientError(f"{doing} failed: {text}", **ids)
    code, name = err.code(), err.name()
    text = redact_text(f"{name}: {err.str()}", secrets)
    where = f" (bootstrap.servers {bootstrap})" if bootstrap else ""
    if code in AUTH_CODES:
        return ConfigurationError(
            f"{doing} failed: the broker refused authentication{where} ({text}). Check "
            "security.protocol, sasl.mechanism, sasl.username and sasl.password (or the SSL "
            "settings) in the sink's config", **ids)
    if code in AUTHZ_CODES:
        return ConfigurationError(f"{doing} failed: not authorized ({text}). "
                                  f"{_grant(code, ids.get('sink_id'))}", **ids)
    if code in FENCED_CODES:
        return FencedError(
            f"{doing} failed: the producer was fenced ({text}): another producer with the "
            "same transactional id (a newer driver, a retried or speculative task) took "
            "over the slot", **ids)
    if code in UNKNOWN_TOPIC_CODES:
        return BadInputError(
            f"{doing} failed: unknown topic or partition ({text}). Create the topic, or "
            "pass create_topic=True", **ids)
    if code in TOO_LARGE_CODES:
        return BadInputError(
            f"{doing} failed: a record is larger than the broker accepts ({text}). Raise the "
            "topic's max.message.bytes (and message.max.bytes in the config), or write "
            "smaller values", **ids)
    if code == KafkaError.INVALID_TRANSACTION_TIMEOUT:
        return ConfigurationError(
            f"{doing} failed: transaction.timeout.ms is above the broker's "
            f"transaction.max.timeout.ms ({text}); lower it or raise the broker maximum",
            **ids)
    if code in UNREACHABLE_CODES:
        return TransientError(
            f"{doing} failed: no answer from the Kafka cluster{where} ({text}). Check "
            "bootstrap.servers, the network and security.protocol", **ids)
    if err.fatal():
        return FatalError(f"{doing} failed with a fatal producer error ({text})", **ids)
    return TransientError(f"{doing} failed ({text})", **ids)
