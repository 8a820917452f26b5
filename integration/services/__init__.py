"""Real PostgreSQL, Apache Kafka, an S3 API and MariaDB for the integration tests, without
Docker.

Standard library only, so ``scripts/services`` works before any pip install (the S3 part
needs ``moto[s3]``, flask and flask-cors for its server, and boto3, all of the ``[dev]``
extra, when it starts).

* PostgreSQL: a private cluster (``initdb``) under ``<state>/postgres``, run by a
  non-root user (``eos``, created with ``useradd`` when running as root), listening
  on 127.0.0.1 on a port chosen once and kept in ``<state>/state.json``;
  ``max_prepared_transactions = 64``. Role/password/database ``eos``/``eos``/``eos``
  (password auth over TCP, trust over the private unix socket). The server answers in
  German (``lc_messages = 'de_DE.UTF-8'``; the locale is generated when missing), so that
  the sinks' error tests prove they classify by SQLSTATE, never by English text. When the
  locale cannot be had, the reason is logged and kept (:func:`postgres_messages`).
* Kafka: the broker jars (``org.apache.kafka:kafka_2.13``) fetched once by Maven into
  ``${EOS_CACHE_DIR:-~/.cache/connectors}/kafka-<version>/libs``; one KRaft node in
  combined mode (broker + controller) under ``<state>/kafka``, run as
  ``java -cp 'libs/*' kafka.Kafka server.properties``. ``auto.create.topics.enable``
  is **false**: tests create their topics explicitly.
* S3: moto's server mode (``python -m moto.server``, the interpreter running this module)
  on 127.0.0.1 on a port chosen once and kept, run from ``<state>/s3`` (its log in
  ``<state>/s3/logs/moto.log``), with one bucket, :data:`S3_BUCKET`, created after it
  answers (idempotently, with boto3, region :data:`S3_REGION`). Any access key is accepted;
  the fixed test ones are :data:`S3_ACCESS_KEY` / :data:`S3_SECRET_KEY`. moto keeps its
  state in memory only, so **a restart (or stop) of s3 empties it**: the start re-creates
  the bucket, empty. (moto's request recorder, ``MOTO_ENABLE_RECORDING``, is no
  persistence: it logs every request, bodies included, and replays them; a replayed
  multipart upload gets a new upload id, so its later parts and its completion fail.)

* MariaDB: Debian 12's ``mariadbd`` (10.11; packages ``mariadb-server-core`` and
  ``mariadb-client-core``, installed when missing), ``mariadb-install-db`` into
  ``<state>/mariadb/data``, run by the service user (``mariadbd --user``) on 127.0.0.1 on a
  port chosen once and kept, its socket in ``<state>/mariadb/run``, TLS on the same port
  (the test CA's server certificate), InnoDB, ``local_infile``, utf8mb4, UTC, no binary
  log. Administration over the socket only (``unix_socket``: the OS user running this);
  the database ``eos``, the user ``eos``/``eos`` and the TLS-only user ``eos_tls`` hold
  only the sink's table privileges on ``eos.*`` (:mod:`.mariadb_cluster`). Prepared XA
  branches survive a disconnect, a SIGKILL and a restart.

``<state>`` is ``<repo>/.services`` (``$EOS_SERVICES_DIR`` overrides). When the
service user cannot reach that directory (for example a repository under ``/root``),
the PostgreSQL and MariaDB parts fall back to ``/tmp/eos-services-<uid>-<hash>/``.

Command line (``scripts/services`` wraps this)::

    python3 -m integration.services start [--only postgres|kafka|s3|mariadb]
    python3 -m integration.services stop [--only postgres|kafka|s3|mariadb]
    python3 -m integration.services restart [--only ...] [--mode fast|immediate] [--kill]
    python3 -m integration.services status [--only ...]

Secured listeners beside the plain ones (:mod:`integration.services.secured`, certificates by
:mod:`integration.services.tls` under ``<state>/tls``): PostgreSQL also over TLS, with the
least-privilege roles ``eos_cert`` (client certificate) and ``eos_tls``
(scram-sha-256), TLS only; Kafka with a ``SASL_SSL`` listener (SCRAM-SHA-512), the
``StandardAuthorizer`` (``User:ANONYMOUS``, the PLAINTEXT listener, is a super user) and
users holding exactly the sink's ACLs.

``start`` writes ``<repo>/.services.env`` (``EOS_POSTGRES_CONNINFO``,
``EOS_KAFKA_BOOTSTRAP``, ``EOS_S3_ENDPOINT``, ``EOS_S3_BUCKET``, ``EOS_S3_ACCESS_KEY``,
``EOS_S3_SECRET_KEY``, and the secured listeners' ``EOS_POSTGRES_TLS_CONNINFO``,
``EOS_POSTGRES_TLS_SCRAM_CONNINFO``, ``EOS_KAFKA_SASL_BOOTSTRAP``,
``EOS_KAFKA_SASL_CONFIG``, ``EOS_KAFKA_SASL_READER_CONFIG``, and MariaDB's
``EOS_MARIADB_URL``, ``EOS_MARIADB_HOST``, ``EOS_MARIADB_PORT``, ``EOS_MARIADB_USER``,
``EOS_MARIADB_PASSWORD``, ``EOS_MARIADB_DATABASE``, ``EOS_MARIADB_TLS_USER``,
``EOS_MARIADB_TLS_PASSWORD``, ``EOS_MARIADB_SSL_CA``); ``stop`` removes it once
nothing runs any more.

From tests: :func:`start_postgres`, :func:`stop_postgres`, :func:`restart_postgres`,
:func:`start_kafka`, :func:`stop_kafka`, :func:`restart_kafka`, :func:`start_s3`,
:func:`stop_s3`, :func:`restart_s3`, :func:`start_mariadb`, :func:`stop_mariadb`,
:func:`restart_mariadb`, :func:`status`.
"""

from __future__ import annotations

from integration.services.cli import main
from integration.services.config import (
    ENV_KAFKA,
    ENV_MARIADB_SSL_CA,
    ENV_MARIADB_TLS_PASSWORD,
    ENV_MARIADB_TLS_USER,
    ENV_MARIADB_URL,
    ENV_POSTGRES,
    ENV_S3_ACCESS_KEY,
    ENV_S3_BUCKET,
    ENV_S3_ENDPOINT,
    ENV_S3_SECRET_KEY,
    MARIADB_DATABASE,
    MARIADB_PASSWORD,
    MARIADB_TLS_PASSWORD,
    MARIADB_TLS_USER,
    MARIADB_USER,
    REPO_ROOT,
    S3_ACCESS_KEY,
    S3_BUCKET,
    S3_REGION,
    S3_SECRET_KEY,
    KafkaInfo,
    MariaDBInfo,
    PgStopMode,
    PostgresInfo,
    S3Info,
    ServiceError,
    ServiceName,
    Status,
    cache_dir,
    env_file,
    kafka_version,
    service_timeout,
    state_dir,
)
from integration.services.control import read_env_file, start, status, stop
from integration.services.kafka import restart_kafka, start_kafka, stop_kafka
from integration.services.kafka_cluster import kafka_metadata_ok
from integration.services.kafka_jars import kafka_libs
from integration.services.mariadb import (
    mariadb_answers,
    restart_mariadb,
    start_mariadb,
    stop_mariadb,
)
from integration.services.postgres import (
    postgres_messages,
    restart_postgres,
    start_postgres,
    stop_postgres,
)
from integration.services.s3 import restart_s3, s3_answers, start_s3, stop_s3

__all__ = [
    "ENV_KAFKA",
    "ENV_MARIADB_SSL_CA",
    "ENV_MARIADB_TLS_PASSWORD",
    "ENV_MARIADB_TLS_USER",
    "ENV_MARIADB_URL",
    "ENV_POSTGRES",
    "ENV_S3_ACCESS_KEY",
    "ENV_S3_BUCKET",
    "ENV_S3_ENDPOINT",
    "ENV_S3_SECRET_KEY",
    "MARIADB_DATABASE",
    "MARIADB_PASSWORD",
    "MARIADB_TLS_PASSWORD",
    "MARIADB_TLS_USER",
    "MARIADB_USER",
    "REPO_ROOT",
    "S3_ACCESS_KEY",
    "S3_BUCKET",
    "S3_REGION",
    "S3_SECRET_KEY",
    "KafkaInfo",
    "MariaDBInfo",
    "PgStopMode",
    "PostgresInfo",
    "S3Info",
    "ServiceError",
    "ServiceName",
    "Status",
    "cache_dir",
    "env_file",
    "kafka_libs",
    "kafka_metadata_ok",
    "kafka_version",
    "main",
    "mariadb_answers",
    "postgres_messages",
    "read_env_file",
    "restart_kafka",
    "restart_mariadb",
    "restart_postgres",
    "restart_s3",
    "s3_answers",
    "service_timeout",
    "start",
    "start_kafka",
    "start_mariadb",
    "start_postgres",
    "start_s3",
    "state_dir",
    "status",
    "stop",
    "stop_kafka",
    "stop_mariadb",
    "stop_postgres",
    "stop_s3",
]
