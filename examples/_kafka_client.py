"""Kafka client settings for the examples: from an environment variable, for both clients.

A secured cluster's settings hold a password: they are read from an environment variable
holding a JSON object of librdkafka properties (``--kafka-config-env VAR``), never from the
command line, which every user of the machine sees (``ps``). The sink (confluent-kafka,
librdkafka) takes them as they are; Spark's Kafka source runs Kafka's Java client, whose
properties are named differently: :func:`spark_source_options` translates the common ones.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

__all__ = ["config_from_env", "spark_source_options"]

_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
#: librdkafka properties with the same name and meaning in Kafka's Java client.
_SAME = ("bootstrap.servers", "security.protocol", "sasl.mechanism", "client.id")


def config_from_env(variable: str) -> dict[str, str]:
    """The JSON object of librdkafka properties in ``$variable`` (its text never shown)."""
    raw = os.environ.get(variable)
    if raw is None:
        raise SystemExit(f"--kafka-config-env {variable}: the variable is not set")
    try:
        config = json.loads(raw)
    except ValueError:
        raise SystemExit(f"${variable} is not a JSON object of librdkafka properties (its "
                         "text is not shown: it may hold a password)") from None
    if not isinstance(config, dict):
        raise SystemExit(f"${variable} must hold a JSON object, e.g. "
                         '{"bootstrap.servers": "host:9093", "security.protocol": "SASL_SSL"}')
    return {str(k): str(v) for k, v in config.items()}


def _jaas_value(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def spark_source_options(config: Mapping[str, str]) -> dict[str, str]:
    """Spark Kafka source options (``kafka.``-prefixed Java client properties) for the
    librdkafka ``config``: SASL user and password become ``sasl.jaas.config``, a PEM CA
    file ``ssl.ca.location`` a PEM truststore. Other properties are refused by name."""
    options: dict[str, str] = {}
    for key in _SAME:
        if key in config:
            options[f"kafka.{key}"] = config[key]
    mechanism = config.get("sasl.mechanism", "").upper()
    if "sasl.username" in config:
        module = _LOGIN_MODULES.get(mechanism)
        if module is None:
            raise SystemExit(f"sasl.mechanism {mechanism!r}: the examples translate PLAIN and "
                             "SCRAM-SHA-256/512 for Spark's Kafka source")
        options["kafka.sasl.jaas.config"] = (
            f"{module} required username={_jaas_value(config['sasl.username'])} "
            f"password={_jaas_value(config.get('sasl.password', ''))};")
    if "ssl.ca.location" in config:
        options["kafka.ssl.truststore.type"] = "PEM"
        options["kafka.ssl.truststore.location"] = config["ssl.ca.location"]
    unknown = sorted(set(config) - set(_SAME) - {"sasl.username", "sasl.password",
                                                 "ssl.ca.location"})
    if unknown:
        raise SystemExit(f"no Java client equivalent known to the examples for {unknown}: "
                         "give Spark's Kafka source its kafka.* options yourself")
    return options
