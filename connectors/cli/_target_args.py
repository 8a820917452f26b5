"""The operator commands' target flags, and the targets they name.

:func:`add_target_args` adds the flags of every kind of target (``--postgres``,
``--mariadb``, ``--kafka``, ``--delta``, ``--iceberg`` and their settings) to a command;
:func:`targets` makes a :class:`~connectors.cli._targets.Target` of each kind named, in
the order of :data:`FACTORIES`; :func:`rebuilt` makes one kind again (``status --watch``
after a target failed). Connection strings and settings come through
:mod:`connectors.cli._inputs`: never a secret as an argument unless warned about.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from connectors.cli._inputs import (
    kafka_settings,
    mariadb_url,
    postgres_conninfo,
    storage_options,
)
from connectors.cli._targets import MariaDBTarget, PostgresTarget, Target
from connectors.core.errors import ConfigurationError

__all__ = ["FACTORIES", "TargetFactory", "add_target_args", "rebuilt", "targets"]

TargetFactory = Callable[[argparse.Namespace], Target | None]


def _postgres(args: argparse.Namespace) -> Target | None:
    conninfo = postgres_conninfo(args.postgres, env=args.postgres_env, file=args.postgres_file)
    return None if conninfo is None else PostgresTarget(conninfo,
                                                        ledger_table=args.ledger_table)


def _mariadb(args: argparse.Namespace) -> Target | None:
    url = mariadb_url(args.mariadb, env=args.mariadb_env, file=args.mariadb_file)
    return None if url is None else MariaDBTarget(url, ledger_table=args.mariadb_ledger_table)


def _kafka(args: argparse.Namespace) -> Target | None:
    from connectors.cli._kafka_target import KafkaTarget

    if not (args.kafka or args.kafka_config_env or args.kafka_config_file):
        return None
    config = kafka_settings(args.kafka_config, env=args.kafka_config_env,
                            file=args.kafka_config_file)
    bootstrap = args.kafka or str(config.pop("bootstrap.servers", "") or "")
    if not bootstrap:
        raise ConfigurationError("--kafka BOOTSTRAP is missing (nor do the Kafka settings "
                                 "have bootstrap.servers)")
    return KafkaTarget(bootstrap, config, topics=args.kafka_topic)


def _delta(args: argparse.Namespace) -> Target | None:
    from connectors.cli._delta_target import DeltaTarget

    if not args.delta:
        return None
    return DeltaTarget(args.delta, ledger_root=args.delta_ledger_root,
                       storage_options=storage_options(args.storage_option))


def _iceberg(args: argparse.Namespace) -> Target | None:
    from connectors.cli._iceberg_target import IcebergTarget

    if not args.iceberg:
        return None
    return IcebergTarget(args.iceberg, ledger_root=args.iceberg_ledger_root,
                         storage_options=storage_options(args.storage_option),
                         metadata_location=args.iceberg_metadata)


#: Every kind of target, by its ``Target.kind``: what makes one from the arguments
#: (``None``: the arguments name none of that kind).
FACTORIES: dict[str, TargetFactory] = {"postgres": _postgres, "mariadb": _mariadb,
                                       "kafka": _kafka, "delta": _delta, "iceberg": _iceberg}


def targets(args: argparse.Namespace) -> list[Target]:
    """A target of each kind the arguments name; at least one, else a usage error."""
    chosen = [target for factory in FACTORIES.values() if (target := factory(args)) is not None]
    if not chosen:
        raise ConfigurationError("name a target: --postgres CONNINFO (or --postgres-env VAR, "
                                 "--postgres-file FILE), --mariadb URL (or --mariadb-env VAR, "
                                 "--mariadb-file FILE), --kafka BOOTSTRAP, --delta PATH|URI "
                                 "or --iceberg PATH|URI")
    return chosen


def rebuilt(kind: str, args: argparse.Namespace) -> Target:
    """A fresh target of ``kind``, from the arguments that made one before."""
    target = FACTORIES[kind](args)
    assert target is not None  # it made one before, from the same arguments
    return target


def add_target_args(p: argparse.ArgumentParser) -> None:
    """The target flags, ``--sink-id`` and ``--json`` of an operator command."""
    g = p.add_argument_group("targets (one or more)")
    g.add_argument("--postgres", metavar="CONNINFO",
                   help="libpq connection string (a password here is visible to every user "
                   "of the machine: prefer --postgres-env, --postgres-file, PGPASSWORD or "
                   "~/.pgpass)")
    g.add_argument("--postgres-env", metavar="VAR",
                   help="read the libpq connection string from environment variable VAR")
    g.add_argument("--postgres-file", metavar="FILE",
                   help="read the libpq connection string from FILE")
    g.add_argument("--ledger-table", default="public.eos_ledger",
                   help="PostgreSQL ledger table (default public.eos_ledger)")
    g.add_argument("--mariadb", metavar="URL",
                   help="MariaDB address, mariadb://user:password@host:3306/database (a "
                   "password here is visible to every user of the machine: prefer "
                   "--mariadb-env or --mariadb-file)")
    g.add_argument("--mariadb-env", metavar="VAR",
                   help="read the MariaDB address from environment variable VAR")
    g.add_argument("--mariadb-file", metavar="FILE", help="read the MariaDB address from FILE")
    g.add_argument("--mariadb-ledger-table", metavar="[DATABASE.]TABLE", default=None,
                   help="MariaDB ledger table (default eos_ledger, in the address's "
                   "database)")
    g.add_argument("--kafka", metavar="BOOTSTRAP", help="Kafka bootstrap servers")
    g.add_argument("--kafka-config", action="append", default=[], metavar="KEY=VALUE",
                   help="extra librdkafka setting (e.g. security.protocol=SASL_SSL), "
                   "repeatable; secrets (sasl.password, ssl.key.password, ...) are refused: "
                   "use --kafka-config-file or --kafka-config-env")
    g.add_argument("--kafka-config-file", metavar="FILE",
                   help="librdkafka settings from FILE: a JSON object, or KEY=VALUE lines "
                   "(# comments), e.g. a client.properties; --kafka may then be left out "
                   "if it has bootstrap.servers")
    g.add_argument("--kafka-config-env", metavar="VAR",
                   help="librdkafka settings from environment variable VAR (same formats; "
                   "they win over the file's, and --kafka-config over both)")
    g.add_argument("--kafka-topic", action="append", default=[], metavar="TOPIC",
                   help="also check this output topic for open transactions (repeatable)")
    g.add_argument("--delta", metavar="PATH|URI",
                   help="Delta table: a local path, or an s3a://, s3://, gs:// or abfss:// URI "
                   "(the store's settings and credentials from the environment: AWS_*, "
                   "GOOGLE_*, AZURE_*)")
    g.add_argument("--delta-ledger-root", metavar="DIR|URI",
                   help="where the sinks' ledgers are, if not <table>/_connectors (the "
                   "parent of DeltaSink's ledger_path)")
    g.add_argument("--iceberg", metavar="PATH|URI",
                   help="Iceberg table's location (DESCRIBE TABLE EXTENDED's Location): a "
                   "local path, or an s3a://, s3://, gs:// or abfss:// URI (settings and "
                   "credentials from the environment, as --delta)")
    g.add_argument("--iceberg-metadata", metavar="PATH|URI",
                   help="the table's current metadata file, as its catalog names it (default: "
                   "version-hint.text's, else the newest under <location>/metadata)")
    g.add_argument("--iceberg-ledger-root", metavar="DIR|URI",
                   help="where the sinks' ledgers are, if not <location>/_connectors (the "
                   "parent of IcebergSink's ledger_path)")
    g.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a non-secret storage option for --delta and --iceberg (AWS_REGION, "
                   "AWS_ENDPOINT_URL, ...), repeatable; secrets (keys, tokens, passwords) "
                   "are refused: set their environment variables")
    p.add_argument("--sink-id", action="append", default=[], dest="sink_ids",
                   help="only this sink (repeatable; default: every sink the target knows)")
    p.add_argument("--json", action="store_true", help="JSON instead of tables")
