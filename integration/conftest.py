"""pytest configuration for the integration tests (real PostgreSQL, Kafka and Spark).

Service fixtures live in ``integration/support/_fixtures_services.py`` and are re-exported here:
``postgres_conninfo``, ``kafka_bootstrap``, ``s3_service`` (session-scoped),
``native_postgres``, ``native_kafka`` and ``native_s3`` (restart hooks). See that module
for how services are found or started. MariaDB's, ``mariadb_url`` and ``native_mariadb``,
are in ``integration/support/_fixtures_mariadb.py``.

Add further fixtures (e.g. Spark) below the re-export block; extend ``pytest_configure``
instead of defining a second one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from integration.support._standalone import StandaloneCluster

# The fixtures import ``integration.services``: make the repository root importable even
# under ``--import-mode=importlib`` or when pytest is run from another directory.
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

# Every Spark JVM of these tests (the in-process session below and each driver subprocess,
# which inherits the environment) compiles with C1 only and collects with the serial GC:
# they live for seconds to a minute on 2 cores, where C2's compile threads and the parallel
# GC's workers cost more than they give back. Measured on the CI machine, one Delta driver
# run of four batches: 50.7 s -> 35.5 s (2 runs each). What the JVM computes is unchanged.
# A PYSPARK_SUBMIT_ARGS of your own wins.
# With $EOS_CDS_ARCHIVE (scripts/test builds it), every driver also maps one AppCDS archive
# of Spark's classes (integration/support/_cds.py).
from integration.support._cds import driver_flags  # noqa: E402

os.environ.setdefault(
    "PYSPARK_SUBMIT_ARGS", f'--driver-java-options "{driver_flags()}" pyspark-shell'
)

from integration.support._file_order import longest_files_first  # noqa: E402
from integration.support._fixtures_mariadb import mariadb_url, native_mariadb  # noqa: E402
from integration.support._fixtures_secured import kafka_sasl, pg_tls, secrets_env  # noqa: E402
from integration.support._fixtures_services import (  # noqa: E402
    docker_compose_file,
    eos_services,
    kafka_bootstrap,
    native_kafka,
    native_postgres,
    native_s3,
    postgres_conninfo,
    private_services,
    register_markers,
    s3_service,
)

__all__ = [
    "cluster",
    "docker_compose_file",
    "eos_services",
    "kafka_bootstrap",
    "kafka_sasl",
    "mariadb_url",
    "native_kafka",
    "native_mariadb",
    "native_postgres",
    "native_s3",
    "pg_tls",
    "postgres_conninfo",
    "private_services",
    "s3_service",
    "secrets_env",
    "spark",
]


def pytest_configure(config: pytest.Config) -> None:
    register_markers(config)


@pytest.fixture(autouse=True)
def _one_local_connect_server_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test marked ``connect_local`` starts drivers whose PySpark launches a local Spark
    Connect server: PySpark binds it to port 15002, always, and its client connects there.
    Two at once (one per pytest-xdist worker) fail with a BindException, so these tests
    take a host-wide lock for their duration (the other worker runs other tests meanwhile)."""
    if request.node.get_closest_marker("connect_local") is None:
        yield
        return
    import fcntl

    with open(LOCAL_CONNECT_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


#: The lock of :func:`_one_local_connect_server_at_a_time` (one per host, as the port is).
LOCAL_CONNECT_LOCK = Path(os.environ.get("TMPDIR", "/tmp")) / "eos-local-spark-connect-15002.lock"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The tests of the S3 API (-m s3 selects them) ...
    for item in items:
        if "s3_service" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.s3)
        # ... and those of the secured listeners (TLS, SASL_SSL, -m secured)
        if {"pg_tls", "kafka_sasl"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.secured)
    longest_files_first(items)


def s3_hadoop_confs() -> dict[str, str]:
    """The S3 service's ``spark.hadoop.fs.s3a.*`` confs from ``.services.env``'s variables
    (none when it does not run: the tests that need it fail or skip by its fixture)."""
    endpoint = os.environ.get("EOS_S3_ENDPOINT")
    if not endpoint:
        return {}
    return {
        "spark.hadoop.fs.s3a.endpoint": endpoint,
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
        "spark.hadoop.fs.s3a.access.key": os.environ.get("EOS_S3_ACCESS_KEY", ""),
        "spark.hadoop.fs.s3a.secret.key": os.environ.get("EOS_S3_SECRET_KEY", ""),
    }


@pytest.fixture(scope="session")
def spark(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[SparkSession]:
    """The one in-process SparkSession of the integration tests, with the Delta and Kafka
    jars. One per pytest process: PySpark keeps its JVM after ``stop()``, and a later
    session's ``spark.jars`` no longer reach the driver's class path, so every in-process
    test shares this one (tests that need another master run a driver subprocess)."""
    from connectors.spark import get_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = {
        "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("warehouse")),
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
        "spark.executorEnv.PYTHONPATH": _REPO_ROOT,
    }
    # With a test of the S3 API in this session: the s3 jars (650 MB, fetched once) and the
    # service's confs, as a user passes them. The version lanes select no such test.
    components = ["delta", "kafka"]
    if any(item.get_closest_marker("s3") for item in request.session.items):
        components.append("s3")
        conf.update(s3_hadoop_confs())
    # With an in-process Iceberg test (the conformance kit) on a Spark Iceberg publishes a
    # runtime for: its jar and SQL extension, which only a new session can take.
    if any(item.get_closest_marker("iceberg_session") for item in request.session.items):
        components.append("iceberg")
    session = get_session(
        "connectors-integration", master="local[2]", components=components, conf=conf
    )
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A real Spark standalone cluster whose two workers have different hosts (Spark only
    speculates onto another host); stopped, and checked gone, after the module."""
    from integration.support._standalone import processes_under, standalone_cluster

    root = tmp_path_factory.mktemp("standalone")
    with standalone_cluster(root) as running:
        yield running
    left = processes_under(root)
    assert not left, "processes of the standalone cluster outlived it:\n" + "\n".join(left)
