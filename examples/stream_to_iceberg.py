"""A real Structured Streaming job into an Apache Iceberg table, exactly once, with ``IcebergSink``.

The same replayable sources as ``examples/stream_to_delta.py`` (``files``: one JSON file per
micro-batch, ``Trigger.AvailableNow``; ``rate``: ``--rows-per-batch`` rows per batch, the
first ``--batches`` batches written). The table ``--table`` (default ``lake.db.events``) is
in the Iceberg catalog ``lake``: a Hadoop catalog on ``--warehouse`` (a local directory or
``s3a://bucket/prefix``), or with ``--jdbc-uri`` a JDBC catalog (``jdbc:postgresql://...``,
``--jdbc-user``; the password from ``$ICEBERG_JDBC_PASSWORD``, set on the running session,
never on the JVM's command line; PostgreSQL's driver from the ``postgres-jdbc`` jars) whose
data files go to ``--warehouse``, or with ``--rest-uri`` a REST catalog
(``http://host:8181``). ``--mode overwrite --dynamic`` replaces the partitions of each
batch (``--partition-by``).

Run it, kill it (``CONNECTORS_TEST_MODE=1`` with ``CONNECTORS_CRASH_AT`` arms a crash
point), run it again with the same ``--checkpoint``: every input row is in the table exactly
once. ``python -m examples.stream_to_iceberg -h``.
"""

from __future__ import annotations

import argparse
import logging
import os

from pyspark.sql import SparkSession

from connectors.iceberg import IcebergSink
from examples._runner import (
    conf_items,
    job_parser,
    parse_job_args,
    rate_as_input_rows,
    run_timed,
    stream,
)

__all__ = ["build_session", "catalog_conf", "catalog_secrets", "main", "run"]

logger = logging.getLogger("examples.stream_to_iceberg")  # not __name__ ("__main__" under -m)


def catalog_conf(warehouse: str, *, jdbc_uri: str = "", jdbc_user: str = "",
                 rest_uri: str = "", catalog: str = "lake") -> dict[str, str]:
    """The Spark confs of an Iceberg catalog named ``catalog``: Hadoop on ``warehouse``,
    JDBC at ``jdbc_uri`` or REST at ``rest_uri``. No secret: the JDBC password is
    :func:`catalog_secrets`'s."""
    prefix = f"spark.sql.catalog.{catalog}"
    conf = {prefix: "org.apache.iceberg.spark.SparkCatalog", f"{prefix}.warehouse": warehouse}
    if jdbc_uri:
        conf.update({f"{prefix}.type": "jdbc", f"{prefix}.uri": jdbc_uri,
                     f"{prefix}.jdbc.user": jdbc_user,
                     f"{prefix}.jdbc.schema-version": "V1"})
    elif rest_uri:
        conf.update({f"{prefix}.type": "rest", f"{prefix}.uri": rest_uri})
    else:
        conf[f"{prefix}.type"] = "hadoop"
    return conf


def catalog_secrets(*, jdbc_uri: str = "", catalog: str = "lake") -> dict[str, str]:
    """The catalog's secret confs (a JDBC catalog's password, from
    ``$ICEBERG_JDBC_PASSWORD``): set on the running session (``spark.conf.set``), since
    PySpark passes a builder's confs to the JVM on its command line, which ``ps`` shows.
    Iceberg reads a catalog's confs when the catalog is first used."""
    password = os.environ.get("ICEBERG_JDBC_PASSWORD", "")
    if not jdbc_uri or not password:
        return {}
    return {f"spark.sql.catalog.{catalog}.jdbc.password": password}


def build_session(master: str, conf: list[str], catalog: dict[str, str], *,
                  connect: bool = False, s3: bool = False,
                  secrets: dict[str, str] | None = None) -> SparkSession:
    """A small-machine session with Iceberg's runtime jar (``connectors.spark``) and the
    catalog ``catalog``; ``s3``: also S3A's jars; a JDBC catalog on PostgreSQL: its
    driver's jar. ``secrets`` are set on the running session (never on the command line)."""
    from connectors.spark import session_builder

    settings = {
        "spark.app.name": "connectors-stream-to-iceberg",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.streaming.stopTimeout": "30s",
        **catalog,
        **conf_items(conf),
    }
    components = ["iceberg", "s3"] if s3 else ["iceberg"]
    if any(k.endswith(".uri") and v.startswith("jdbc:postgresql:") for k, v in catalog.items()):
        components.append("postgres-jdbc")
    spark = session_builder("connectors-stream-to-iceberg", master=master,
                            components=components, conf=settings, connect=connect).getOrCreate()
    for key, value in (secrets or {}).items():
        spark.conf.set(key, value)
    return spark


def run(args: argparse.Namespace) -> int:
    partition_by = [c for c in args.partition_by.split(",") if c]
    sink = IcebergSink(args.table, sink_id=args.sink_id, mode=args.mode, create_table=True,
                       partition_by=partition_by or None,
                       partition_overwrite_mode="dynamic" if args.dynamic else None,
                       query_name=args.query_name or None)
    logger.info("writing %s", sink)
    catalog = catalog_conf(args.warehouse, jdbc_uri=args.jdbc_uri, jdbc_user=args.jdbc_user,
                           rest_uri=args.rest_uri)
    spark = build_session(args.master, args.conf, catalog, connect=args.connect,
                          s3=args.warehouse.startswith("s3a://"),
                          secrets=catalog_secrets(jdbc_uri=args.jdbc_uri))
    namespace = args.table.rsplit(".", 1)[0]
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {namespace}")
    return stream(spark, args, sink, rate=rate_as_input_rows)


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--warehouse", required=True, help="the catalog's warehouse")
    parser.add_argument("--table", default="lake.db.events")
    parser.add_argument("--sink-id", default="events-iceberg")
    parser.add_argument("--mode", default="append", choices=["append", "overwrite"])
    parser.add_argument("--dynamic", action="store_true",
                        help="with --mode overwrite: replace the batch's partitions only")
    parser.add_argument("--partition-by", default="", help="partition columns, comma-separated")
    parser.add_argument("--jdbc-uri", default="", help="a JDBC catalog instead of Hadoop")
    parser.add_argument("--jdbc-user", default="")
    parser.add_argument("--rest-uri", default="", help="a REST catalog instead of Hadoop")
    args = parse_job_args(parser, argv)
    return run_timed(run, args, logger)


if __name__ == "__main__":
    raise SystemExit(main())
