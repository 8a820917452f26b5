"""The secured side of the test services: PostgreSQL over TLS, Kafka over SASL_SSL with ACLs.

Beside the plain listeners the other tests use (nothing about them changes):

* PostgreSQL also accepts TLS (``ssl = on``, certificates of :mod:`integration.services.tls`).
  Two least-privilege roles may log in over TLS only (``hostssl``; ``hostnossl``
  rejects them): :data:`PG_CERT_ROLE` with its client certificate (``cert``
  authentication, the key encrypted: ``sslpassword``) and :data:`PG_TLS_ROLE` with
  ``scram-sha-256``. They hold exactly what docs/security.md lists for the sink: CONNECT
  on the database, USAGE and CREATE on schema :data:`PG_SCHEMA` (the sink creates its
  ledger tables there), and what each test grants on its own target tables.
* Kafka gets a ``SASL_SSL`` listener (SCRAM-SHA-512) and the KRaft
  ``StandardAuthorizer``. ``User:ANONYMOUS`` (the PLAINTEXT and controller listeners) is a
  super user, so the plain tests are unchanged. The SCRAM users are created when the
  storage is formatted (``--add-scram``) and upserted at every start (storage formatted
  before they existed). :data:`KAFKA_SINK_USER` holds exactly the ACLs docs/kafka.md
  section 7 lists, for sink ids beginning with :data:`SECURE_PREFIX` and output topics
  beginning with :data:`SECURE_TOPIC_PREFIX`; :data:`KAFKA_READER_USER` may read topics
  beginning with :data:`SECURE_INPUT_PREFIX` (Spark's Kafka source).

The ACLs and SCRAM upserts go through confluent-kafka's AdminClient over the PLAINTEXT
listener (imported only here, like moto for S3).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, Final

from integration.services.tls import CLIENT_CN, CLIENT_KEY_PASSWORD, TlsFiles

__all__ = [
    "ENV_KAFKA_SASL_BOOTSTRAP",
    "ENV_KAFKA_SASL_CONFIG",
    "ENV_KAFKA_SASL_READER_CONFIG",
    "ENV_POSTGRES_TLS_CONNINFO",
    "ENV_POSTGRES_TLS_SCRAM_CONNINFO",
    "KAFKA_READER_PASSWORD",
    "KAFKA_READER_USER",
    "KAFKA_SINK_PASSWORD",
    "KAFKA_SINK_USER",
    "PG_CERT_ROLE",
    "PG_SCHEMA",
    "PG_TLS_PASSWORD",
    "PG_TLS_ROLE",
    "SECRETS",
    "SECURE_INPUT_PREFIX",
    "SECURE_PREFIX",
    "SECURE_TOPIC_PREFIX",
    "env_lines",
    "kafka_format_args",
    "kafka_properties",
    "kafka_secure_setup",
    "pg_conf_lines",
    "pg_hba",
    "pg_setup_sql",
    "sink_acls",
]

ENV_POSTGRES_TLS_CONNINFO: Final = "EOS_POSTGRES_TLS_CONNINFO"
ENV_POSTGRES_TLS_SCRAM_CONNINFO: Final = "EOS_POSTGRES_TLS_SCRAM_CONNINFO"
ENV_KAFKA_SASL_BOOTSTRAP: Final = "EOS_KAFKA_SASL_BOOTSTRAP"
ENV_KAFKA_SASL_CONFIG: Final = "EOS_KAFKA_SASL_CONFIG"
ENV_KAFKA_SASL_READER_CONFIG: Final = "EOS_KAFKA_SASL_READER_CONFIG"

PG_CERT_ROLE: Final = CLIENT_CN
PG_TLS_ROLE: Final = "eos_tls"
PG_TLS_PASSWORD: Final = "eos-tls-role-pass-8Wm"
PG_SCHEMA: Final = "secure"

KAFKA_SINK_USER: Final = "eos_sink"
KAFKA_SINK_PASSWORD: Final = "eos-sink-scram-pass-5Tq"
KAFKA_READER_USER: Final = "eos_reader"
KAFKA_READER_PASSWORD: Final = "eos-reader-scram-pass-2Hv"
SCRAM_MECHANISM: Final = "SCRAM-SHA-512"
#: Sink ids the least-privilege Kafka user may run (transactional ids and internal topics).
SECURE_PREFIX: Final = "secure"
#: Output topics it may write.
SECURE_TOPIC_PREFIX: Final = "secure."
#: Input topics the reader may read.
SECURE_INPUT_PREFIX: Final = "secure-in."

#: Every secret of the secured services: no output of any test may contain one.
SECRETS: Final = (CLIENT_KEY_PASSWORD, PG_TLS_PASSWORD, KAFKA_SINK_PASSWORD,
                  KAFKA_READER_PASSWORD)


# ----------------------------------------------------------------------- PostgreSQL


def pg_conf_lines() -> list[str]:
    """``postgresql.conf`` lines: TLS on, with the files copied into the data directory."""
    return [
        "ssl = on",
        "ssl_cert_file = 'eos_server.pem'",
        "ssl_key_file = 'eos_server.key'",
        "ssl_ca_file = 'eos_ca.pem'",
        "ssl_min_protocol_version = 'TLSv1.2'",
        "password_encryption = 'scram-sha-256'",
    ]


def pg_install_files(tls: TlsFiles, data: Path) -> list[tuple[Path, Path, int]]:
    """(source, destination, mode) of the server's TLS files in its data directory."""
    return [(tls.server_cert, data / "eos_server.pem", 0o644),
            (tls.server_key, data / "eos_server.key", 0o600),
            (tls.ca, data / "eos_ca.pem", 0o644)]


def pg_hba() -> str:
    """``pg_hba.conf``: the secured roles over TLS only, everyone else as before."""
    lines = ["# Written by integration/services/ on every start; do not edit.",
             "local all all trust"]
    for net in ("127.0.0.1/32", "::1/128"):
        lines += [
            f"hostssl all {PG_CERT_ROLE} {net} cert",
            f"hostssl all {PG_TLS_ROLE} {net} scram-sha-256",
            f"hostnossl all {PG_CERT_ROLE},{PG_TLS_ROLE} {net} reject",
            f"host all all {net} scram-sha-256",
        ]
    return "\n".join(lines) + "\n"


def pg_setup_sql(database: str) -> list[str]:
    """Idempotent SQL (as the superuser) creating the roles and their schema."""
    return [
        "DO $$ BEGIN "
        f"IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{PG_CERT_ROLE}') THEN "
        f"CREATE ROLE {PG_CERT_ROLE} LOGIN; END IF; "
        f"IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{PG_TLS_ROLE}') THEN "
        f"CREATE ROLE {PG_TLS_ROLE} LOGIN; END IF; END $$",
        f"ALTER ROLE {PG_TLS_ROLE} PASSWORD '{PG_TLS_PASSWORD}'",
        f"CREATE SCHEMA IF NOT EXISTS {PG_SCHEMA}",
        f"GRANT CONNECT ON DATABASE {database} TO {PG_CERT_ROLE}, {PG_TLS_ROLE}",
        f"GRANT USAGE, CREATE ON SCHEMA {PG_SCHEMA} TO {PG_CERT_ROLE}, {PG_TLS_ROLE}",
    ]


def pg_tls_conninfo(host: str, port: int, database: str, tls: TlsFiles) -> str:
    """The client-certificate role's conninfo (``sslmode=verify-full``)."""
    return (f"host={host} port={port} dbname={database} "
            f"user={PG_CERT_ROLE} sslmode=verify-full sslrootcert={tls.ca} "
            f"sslcert={tls.client_cert} sslkey={tls.client_key} "
            f"sslpassword={CLIENT_KEY_PASSWORD}")


def pg_scram_conninfo(host: str, port: int, database: str, tls: TlsFiles) -> str:
    """The scram-sha-256 role's conninfo, over TLS with the server verified."""
    return (f"host={host} port={port} dbname={database} user={PG_TLS_ROLE} "
            f"password={PG_TLS_PASSWORD} sslmode=verify-full sslrootcert={tls.ca}")


# ---------------------------------------------------------------------------- Kafka


def kafka_properties(tls: TlsFiles, sasl_port: int, host: str) -> dict[str, str]:
    """``server.properties`` additions: the SASL_SSL listener, SCRAM and the authorizer.

    ``listeners``, ``advertised.listeners`` and ``listener.security.protocol.map`` are
    returned as the SASL_SSL parts to append to the plain ones.
    """
    return {
        "listeners+": f"SASL_SSL://{host}:{sasl_port}",
        "advertised.listeners+": f"SASL_SSL://{host}:{sasl_port}",
        "listener.security.protocol.map+": "SASL_SSL:SASL_SSL",
        "sasl.enabled.mechanisms": SCRAM_MECHANISM,
        f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(tls.kafka_keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls.ca),
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",
        "allow.everyone.if.no.acl.found": "false",
    }


def _scram_users() -> list[tuple[str, str]]:
    return [(KAFKA_SINK_USER, KAFKA_SINK_PASSWORD), (KAFKA_READER_USER, KAFKA_READER_PASSWORD)]


def kafka_format_args() -> list[str]:
    """``StorageTool format`` arguments creating the SCRAM users with the storage."""
    args: list[str] = []
    for user, password in _scram_users():
        args += ["--add-scram", f"{SCRAM_MECHANISM}=[name={user},password={password}]"]
    return args


def sink_acls(user: str, sink_prefix: str, topic_prefix: str) -> list[tuple[str, str, str]]:
    """(resource type, prefix or name, operation) of the sink's ACLs, as docs/kafka.md
    section 7 lists them: prefixed for sink ids ``sink_prefix*`` and topics
    ``topic_prefix*``. The cluster's resource name is ``kafka-cluster``."""
    del user
    internal = f"_connectors.{sink_prefix}"
    return [
        ("TOPIC", topic_prefix, "WRITE"),
        ("TOPIC", topic_prefix, "DESCRIBE"),
        ("TOPIC", internal, "WRITE"),
        ("TOPIC", internal, "DESCRIBE"),
        ("TOPIC", internal, "READ"),
        ("TOPIC", internal, "CREATE"),
        ("TRANSACTIONAL_ID", f"eos1|{sink_prefix}", "WRITE"),
        ("TRANSACTIONAL_ID", f"eos1|{sink_prefix}", "DESCRIBE"),
    ]


def reader_acls() -> list[tuple[str, str, str]]:
    """Spark's Kafka source: read and describe the input topics."""
    return [("TOPIC", SECURE_INPUT_PREFIX, "READ"), ("TOPIC", SECURE_INPUT_PREFIX, "DESCRIBE")]


def acl_bindings(user: str, acls: list[tuple[str, str, str]]) -> list[Any]:
    """confluent-kafka ``AclBinding``s allowing ``user`` each of ``acls`` (prefixed, except
    for the cluster)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    bindings = []
    for rtype, name, op in acls:
        pattern = (ResourcePatternType.LITERAL if rtype == "CLUSTER"
                   else ResourcePatternType.PREFIXED)
        kind = ResourceType.BROKER if rtype == "CLUSTER" else ResourceType[rtype]
        bindings.append(AclBinding(kind, name, pattern, f"User:{user}", "*",
                                   AclOperation[op], AclPermissionType.ALLOW))
    return bindings


def add_users(bootstrap: str, users: list[tuple[str, str]], bindings: list[Any],
              timeout: float = 60.0) -> None:
    """Upsert SCRAM-SHA-512 ``(user, password)``s and create ACL ``bindings`` (from
    :func:`acl_bindings`), idempotently, over the PLAINTEXT (super user) listener."""
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    upserts = [UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), password.encode())
        for user, password in users]
    for future in admin.alter_user_scram_credentials(
            upserts, request_timeout=timeout).values():
        future.result()
    if bindings:
        for future in admin.create_acls(bindings, request_timeout=timeout).values():
            future.result()


def kafka_secure_setup(bootstrap: str, timeout: float = 60.0) -> None:
    """The services' SCRAM users and their ACLs (idempotent)."""
    bindings = acl_bindings(KAFKA_SINK_USER,
                            sink_acls(KAFKA_SINK_USER, SECURE_PREFIX, SECURE_TOPIC_PREFIX))
    bindings += acl_bindings(KAFKA_READER_USER, reader_acls())
    add_users(bootstrap, _scram_users(), bindings, timeout)


def kafka_client_config(host: str, sasl_port: int, tls: TlsFiles, user: str,
                        password: str) -> dict[str, str]:
    """librdkafka settings of one SCRAM user over SASL_SSL."""
    return {
        "bootstrap.servers": f"{host}:{sasl_port}",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": SCRAM_MECHANISM,
        "sasl.username": user,
        "sasl.password": password,
        "ssl.ca.location": str(tls.ca),
    }


# ------------------------------------------------------------------------ env file


def env_lines(pg: tuple[str, int, str] | None, kafka: tuple[str, int] | None,
              tls: TlsFiles) -> list[str]:
    """``.services.env`` lines of the secured listeners (shell-quoted values)."""
    lines: list[str] = []
    if pg is not None:
        host, port, database = pg
        lines.append(f"{ENV_POSTGRES_TLS_CONNINFO}="
                     + shlex.quote(pg_tls_conninfo(host, port, database, tls)))
        lines.append(f"{ENV_POSTGRES_TLS_SCRAM_CONNINFO}="
                     + shlex.quote(pg_scram_conninfo(host, port, database, tls)))
    if kafka is not None:
        host, sasl_port = kafka
        lines.append(f"{ENV_KAFKA_SASL_BOOTSTRAP}={host}:{sasl_port}")
        for env, user, password in (
            (ENV_KAFKA_SASL_CONFIG, KAFKA_SINK_USER, KAFKA_SINK_PASSWORD),
            (ENV_KAFKA_SASL_READER_CONFIG, KAFKA_READER_USER, KAFKA_READER_PASSWORD),
        ):
            config = kafka_client_config(host, sasl_port, tls, user, password)
            lines.append(f"{env}=" + shlex.quote(json.dumps(config, sort_keys=True)))
    return lines
