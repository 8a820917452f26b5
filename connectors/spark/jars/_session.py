"""The session: :func:`session_builder`, :func:`get_session` and :func:`check_components`.

The builder's settings come from :func:`_session_conf`: the jars of
:func:`connectors.spark.resolve_jars`, Delta's extension and catalog, small-machine
defaults, the Python workers' interpreter and path, ``local-cluster`` executor memory, and
the caller's ``conf`` last. They are logged (DEBUG) with the values of secret-looking keys
masked (:func:`_masked`).
"""

from __future__ import annotations

import logging
import os
import re
import site
import sys
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from connectors.core.errors import ConfigurationError
from connectors.spark._binding import refuse_connect_before_4
from connectors.spark._pyapi import delta_python_from_jars
from connectors.spark.jars._components import (
    DEFAULT_COMPONENTS,
    DELTA_EXTENSION,
    component_settings,
)
from connectors.spark.jars._resolve import resolve_jars

logger = logging.getLogger(__name__)

_LOCAL_CLUSTER = re.compile(r"^local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\]$")


def session_builder(
    app_name: str = "connectors",
    *,
    master: str = "local[2]",
    components: Iterable[str] = DEFAULT_COMPONENTS,
    conf: Mapping[str, str] | None = None,
    connect: bool = False,
) -> SparkSession.Builder:
    """Return a ``SparkSession.Builder`` with the jars and settings for ``components``.

    ``connect=True`` builds a Spark Connect client instead (``pyspark[connect]``): with a
    ``local[...]`` master, PySpark starts a local Connect server in a JVM of its own and
    every setting below applies to that server (its jars included); with a server's
    address (``master="sc://host:15002"``) the server's class path and static settings
    are the server's, and only ``conf`` is sent (runtime SQL settings). On pyspark 3.5 it
    raises :class:`ConfigurationError`: the sinks refuse Spark Connect there.

    Settings, in order (later wins):

    * ``spark.jars`` from :func:`resolve_jars` (with ``"delta"`` and no ``delta`` module
      importable, Delta's jar also goes on ``sys.path``: Delta's Python API ships in it;
      ``connectors.spark._pyapi``);
    * with ``"delta"``: Delta's SQL extension and catalog, and
      ``spark.databricks.delta.snapshotPartitions=2``; with ``"iceberg"``: Iceberg's SQL
      extension (the catalogs are yours to name in ``conf``: ``docs/iceberg.md``);
    * small-machine defaults: ``spark.sql.shuffle.partitions=2``, ``spark.ui.enabled=false``,
      ``spark.ui.showConsoleProgress=false`` (``spark.driver.memory`` is left alone);
    * for Python workers: ``PYSPARK_PYTHON`` is set to this interpreter when unset (Spark
      would otherwise start whatever ``python3`` is on ``PATH``), and when ``connectors``
      is not installed into site-packages its source root is added to
      ``spark.executorEnv.PYTHONPATH`` so executors can import it;
    * on ``local-cluster[N,cores,memMB]``: ``spark.executor.memory=<memMB>m`` so that an
      executor fits its worker;
    * ``conf``, last. ``spark.jars``, ``spark.sql.extensions`` and
      ``spark.executorEnv.PYTHONPATH`` given there are merged with the helper's values
      instead of replacing them. Anything else passes through as given, e.g. the
      ``spark.hadoop.fs.s3a.*`` settings of ``"s3"`` (:func:`get_session` has an example).

    The settings are logged at DEBUG level with the value of every key that names a
    secret, password, token or key (``fs.s3a.secret.key``, ``spark.ssl.keyPassword``, not
    ``spark.ssl.keyStoreType``) replaced by ``***``.

    ``local-cluster`` works with the pip-installed pyspark: the workers run inside the
    driver JVM, each executor in its own JVM launched from ``$SPARK_HOME/jars`` (pyspark's
    directory), and executor logs go to ``$SPARK_HOME/work/<app id>/``. Only one
    SparkContext lives in a process: when one already runs, ``getOrCreate()`` returns it
    and the jars and master given here do not apply.

    Example (``b.getOrCreate()`` then starts the session; ``integration/test_spark_session.py``
    runs a ``local-cluster`` one in a process of its own)::

        >>> b = session_builder("t", master="local-cluster[2,1,1024]", components=[],
        ...                     conf={"spark.sql.shuffle.partitions": "4"})
        >>> type(b).__name__
        'Builder'
    """
    names = (components,) if isinstance(components, str) else tuple(components)
    if connect:  # pyspark 3.5: refused here, where the client sees why
        refuse_connect_before_4()
    _ensure_python_exec()
    builder: SparkSession.Builder = SparkSession.builder
    if connect and master.startswith("sc://"):
        settings = dict(conf or {})
        builder = builder.remote(master)
    else:
        settings = _session_conf(app_name, master, names, dict(conf or {}))
        if connect:  # a local Connect server: the settings are its own
            builder = builder.remote(settings.pop("spark.master"))
    logger.debug("Spark session settings: %s", _masked(settings))
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder


def get_session(
    app_name: str = "connectors",
    *,
    master: str = "local[2]",
    components: Iterable[str] = DEFAULT_COMPONENTS,
    conf: Mapping[str, str] | None = None,
    connect: bool = False,
) -> SparkSession:
    """Return ``session_builder(...).getOrCreate()``; same arguments (``connect=True``: a
    Spark Connect session, see :func:`session_builder`).

    ``conf`` is any Spark setting, applied last. With ``components=[..., "s3"]`` the
    session reads and writes ``s3a://`` paths; where and as whom is Hadoop's S3A settings,
    passed in ``conf`` (``spark.hadoop.`` + the Hadoop key). For an S3 API of your own
    (MinIO, Ceph, moto; the access and secret keys are masked in the log)::

        spark = get_session("app", components=["delta", "s3"], conf={
            "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
            "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
            "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
            "spark.hadoop.fs.s3a.access.key": access_key,
            "spark.hadoop.fs.s3a.secret.key": secret_key,
        })
        spark.range(3).write.format("delta").save("s3a://my-bucket/tables/t")

    .. example-needs: spark

    Example:
        >>> spark = get_session("t", components=["delta"])
        >>> spark.range(2).write.format("delta").save(f"{path}/t")
        >>> spark.read.format("delta").load(f"{path}/t").count()
        2
    """
    names = (components,) if isinstance(components, str) else tuple(components)
    builder = session_builder(app_name, master=master, components=names, conf=conf,
                              connect=connect)
    with warnings.catch_warnings():
        # A local Connect client also tries the server's static settings on its session
        # (they already apply to the server) and warns for each: not the user's concern.
        warnings.filterwarnings("ignore", message="Failed to set spark", category=UserWarning)
        spark = builder.getOrCreate()
    check_components(spark, names)
    return spark


#: A class each component's jars provide, to tell whether they reached the driver.
_MARKER_CLASSES = {
    "delta": DELTA_EXTENSION,
    "kafka": "org.apache.spark.sql.kafka010.KafkaSourceProvider",
    "s3": "org.apache.hadoop.fs.s3a.S3AFileSystem",
    "iceberg": "org.apache.iceberg.spark.SparkCatalog",
    "postgres-jdbc": "org.postgresql.Driver",
}


def check_components(
    spark: SparkSession, components: Iterable[str] = DEFAULT_COMPONENTS
) -> None:
    """Raise :class:`ConfigurationError` if ``spark``'s JVM lacks a component's classes.

    PySpark keeps its JVM after ``SparkSession.stop()``: a later session in the same
    process gets the first one's class path, and its ``spark.jars`` silently never reach
    the driver (Delta and Kafka then fail later with "data source not found").
    """
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:  # Spark Connect: the server's class path is not ours to check
        return
    utils = jvm.org.apache.spark.util.Utils
    missing = [c for c in components
               if c in _MARKER_CLASSES and not utils.classIsLoadable(_MARKER_CLASSES[c])]
    if missing:
        raise ConfigurationError(
            f"this Spark driver JVM has no {' and no '.join(missing)} classes: it was started "
            "before connectors.spark added their jars (an earlier SparkSession in this "
            "process, even stopped, keeps its JVM and class path). Call get_session() "
            "before creating any other SparkSession, in a new Python process, or start "
            "Spark with spark.jars set to connectors.spark.resolve_jars(...)"
        )


_MERGED_KEYS = {
    "spark.jars": ",",
    "spark.sql.extensions": ",",
    "spark.executorEnv.PYTHONPATH": os.pathsep,
}


def _session_conf(
    app_name: str, master: str, components: tuple[str, ...], user: dict[str, str]
) -> dict[str, str]:
    """Every setting :func:`session_builder` applies, as one ordered dict."""
    settings: dict[str, str] = {"spark.app.name": app_name, "spark.master": master}
    jars = resolve_jars(components)
    if jars:
        settings["spark.jars"] = ",".join(jars)
    if "delta" in components:
        delta_python_from_jars(jars)  # DeltaSink's `delta` module, when not pip-installed
    settings.update(component_settings(components))
    if "delta" in components:
        settings["spark.databricks.delta.snapshotPartitions"] = "2"
    settings["spark.sql.shuffle.partitions"] = "2"
    settings["spark.ui.enabled"] = "false"
    settings["spark.ui.showConsoleProgress"] = "false"
    source_root = _source_root_if_not_installed()
    if source_root is not None:
        settings["spark.executorEnv.PYTHONPATH"] = source_root
    cluster = _LOCAL_CLUSTER.match(master.strip())
    if cluster is not None:
        settings["spark.executor.memory"] = f"{cluster.group(3)}m"
    for key, value in user.items():
        sep = _MERGED_KEYS.get(key)
        if sep is not None and settings.get(key) and value:
            ours = settings[key].split(sep)
            theirs = [v for v in value.split(sep) if v and v not in ours]
            settings[key] = sep.join(ours + theirs)
        else:
            settings[key] = value
    return settings


#: Words of a setting's key (split at ``.``, ``-``, ``_``) whose value is not logged; with
#: ``jaas`` and ``passphrase``, Kafka's secret settings given as Spark confs
#: (``spark.kafka.clusters.<c>.kafka.sasl.jaas.config``) are masked too.
_SECRET_WORDS = ("secret", "password", "passwd", "passphrase", "token", "jaas")


def is_secret_conf(key: str) -> bool:
    """Whether ``key`` names a secret: a word containing secret, password, passphrase,
    token or jaas, or a word that is or ends in ``key`` (``access.key``, ``apikey``; not
    ``keystore.type``)."""
    words = re.split(r"[^a-z0-9]+", key.lower())
    return any(w.endswith("key") or any(s in w for s in _SECRET_WORDS) for w in words)


def _masked(settings: Mapping[str, str]) -> dict[str, str]:
    """``settings`` with the value of every secret-looking key replaced by ``***``."""
    return {k: "***" if is_secret_conf(k) else v for k, v in settings.items()}


def _ensure_python_exec() -> None:
    """Make Python workers run this interpreter unless the user chose one."""
    if not os.environ.get("PYSPARK_PYTHON"):
        os.environ["PYSPARK_PYTHON"] = sys.executable
        logger.debug("PYSPARK_PYTHON set to %s", sys.executable)


def _source_root_if_not_installed() -> str | None:
    """The directory holding the ``connectors`` package, unless it is a site directory."""
    root = Path(__file__).resolve().parents[3]  # connectors/spark/jars/_session.py
    sites = [*site.getsitepackages(), site.getusersitepackages()]
    installed = {Path(p).resolve() for p in sites if p}
    return None if root in installed else str(root)
