"""What a component needs: the installed Spark and Delta versions, and the Maven roots.

A :class:`Plan` names a component's root coordinates and its cache directory; it is built
from the installed pyspark (its version, Scala version and ``jars/`` directory), for Delta
from ``$EOS_DELTA_VERSION``, the installed delta-spark Python package or else the Spark
minor's release (:data:`DELTA_FOR_SPARK`), and for S3 from the Hadoop version pyspark ships
(its ``jars/hadoop-client-api-<version>.jar``). Nothing here touches the network or the
cache.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pyspark

from connectors.core.errors import ConfigurationError

logger = logging.getLogger(__name__)

#: Components :func:`connectors.spark.resolve_jars` knows.
COMPONENTS: tuple[str, ...] = ("delta", "kafka", "s3", "iceberg", "postgres-jdbc")
#: What a session gets when no ``components`` are named. ``"s3"`` is asked for by name: its
#: AWS SDK bundle is 650 MB and more.
DEFAULT_COMPONENTS: tuple[str, ...] = ("delta", "kafka")

_HADOOP_CLIENT_API = re.compile(r"hadoop-client-api-(\d+\.\d+\.\d+[\w.\-]*)\.jar")
_HADOOP_GROUP = "org.apache.hadoop"

# Delta publishes one artifact per Spark minor (delta-spark_4.2_2.13) from 4.1 on; before
# that one artifact per Scala version (delta-spark_2.13). See delta/pip_utils.py.
_DELTA_FIRST_SPARK_SUFFIXED = (4, 1)
#: Delta Lake's SQL extension and catalog: a session with Delta's jars also needs them set.
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"


#: Iceberg's SQL extension (MERGE INTO, the ``CALL`` procedures): a session with Iceberg's
#: jars also needs it set (beside Delta's when both are named). Catalogs are the user's:
#: ``spark.sql.catalog.<name>`` (``docs/iceberg.md``).
ICEBERG_EXTENSION = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"


def component_settings(components: tuple[str, ...]) -> dict[str, str]:
    """The Spark settings ``components`` need beyond their jars (Delta's extension and
    catalog, Iceberg's extension; none for the others)."""
    extensions = [ext for name, ext in (("delta", DELTA_EXTENSION),
                                        ("iceberg", ICEBERG_EXTENSION)) if name in components]
    settings = {"spark.sql.extensions": ",".join(extensions)} if extensions else {}
    if "delta" in components:
        settings["spark.sql.catalog.spark_catalog"] = DELTA_CATALOG
    return settings


@dataclass(frozen=True)
class Artifact:
    group: str
    artifact: str
    version: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.artifact)

    def __str__(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"


@dataclass(frozen=True)
class Plan:
    """What one component needs: Maven roots and the cache directory name.

    ``pinned_group``: artifacts of this group (the root's and its transitive ones) may be
    substituted only by a release of the same minor version as the root's; with
    ``pinned_exact``, not at all.
    ``excluded``: ``(group, artifact)`` pairs (``*`` allowed) pruned from the roots'
    dependencies, beyond what pyspark ships.
    ``spark_version``: the pyspark version the plan was made for.
    """

    component: str
    dirname: str
    roots: tuple[Artifact, ...]
    pinned_group: str | None = None
    pinned_exact: bool = False
    excluded: tuple[tuple[str, str], ...] = ()
    spark_version: str = ""


def _spark_version() -> str:
    return str(pyspark.__version__)


def pyspark_home() -> Path:
    """Spark's home as the pyspark launcher uses it: ``$SPARK_HOME`` or pyspark's dir."""
    env = os.environ.get("SPARK_HOME")
    if env:
        return Path(env)
    return Path(pyspark.__file__).resolve().parent


def artifact_id_of(jar_name: str) -> str:
    """``spark-core_2.13-4.2.0.jar`` -> ``spark-core_2.13``: the name before the version."""
    stem = jar_name[:-4] if jar_name.endswith(".jar") else jar_name
    match = re.search(r"-\d", stem)
    return stem[: match.start()] if match else stem


@lru_cache(maxsize=4)
def provided_artifact_ids(jars_dir: Path) -> frozenset[str]:
    """Artifact ids of the jars Spark already ships: never fetched nor put on spark.jars."""
    try:
        names = os.listdir(jars_dir)
    except OSError:
        return frozenset()
    return frozenset(artifact_id_of(n) for n in names if n.endswith(".jar"))


def _scala_binary_version(jars_dir: Path) -> str:
    try:
        names = os.listdir(jars_dir)
    except OSError:
        names = []
    for name in names:
        match = re.fullmatch(r"scala-library-(\d+)\.(\d+)\.\d+.*\.jar", name)
        if match:
            return f"{match.group(1)}.{match.group(2)}"
    return "2.13"  # every Spark 4 build


def _hadoop_version(jars_dir: Path) -> str:
    """The Hadoop version pyspark ships: ``jars/hadoop-client-api-<version>.jar``."""
    try:
        names = os.listdir(jars_dir)
    except OSError:
        names = []
    found = sorted({m.group(1) for m in map(_HADOOP_CLIENT_API.fullmatch, names) if m})
    if len(found) == 1:
        return found[0]
    what = (f"several ({', '.join(f'hadoop-client-api-{v}.jar' for v in found)})" if found
            else "no hadoop-client-api-<version>.jar")
    raise ConfigurationError(
        f"The 's3' jars (org.apache.hadoop:hadoop-aws) must be exactly the Hadoop version "
        f"Spark ships, and {jars_dir} has {what}, so that version is unknown. Use the "
        "pip-installed pyspark (unset SPARK_HOME) or a Spark build with Hadoop, or leave 's3' "
        "out of components and put the hadoop-aws jar of your Hadoop version and the AWS SDK "
        "bundle its POM names in spark.jars."
    )


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version.split("-", maxsplit=1)[0])[:3])


def minor_version(version: str) -> str:
    return ".".join(map(str, version_tuple(version)[:2]))


#: Without delta-spark installed (pyspark is the user's; the ``delta`` extra brings no
#: delta-spark): the Delta Lake release for each Spark minor, the newest one whose Maven jar
#: exists for it (checked on Maven Central: ``delta-spark_4.0_2.13`` .. ``_4.2_2.13`` at
#: 4.4.0; Spark 3.5's line is 3.3, Scala 2.12, one artifact ``delta-spark_2.12``, its
#: Python API in the jar too). A Spark minor missing here has no Delta release yet.
DELTA_FOR_SPARK: dict[tuple[int, ...], str] = {
    (3, 5): "3.3.3",
    (4, 0): "4.4.0",
    (4, 1): "4.4.0",
    (4, 2): "4.4.0",
}


def _delta_version() -> str:
    """The Delta release: ``$EOS_DELTA_VERSION``, else the installed delta-spark's, else
    :data:`DELTA_FOR_SPARK`'s for the running Spark."""
    override = os.environ.get("EOS_DELTA_VERSION")
    if override:
        return override
    for dist in ("delta-spark", "delta_spark"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    spark = _spark_version()
    release = DELTA_FOR_SPARK.get(version_tuple(spark)[:2])
    if release is not None:
        return release
    known = ", ".join(f"{a}.{b}" for a, b in sorted(DELTA_FOR_SPARK))
    raise ConfigurationError(
        f"No Delta Lake release is known for Spark {spark} (known: Spark {known}). Set "
        "EOS_DELTA_VERSION to a Delta Lake release built for it, install the delta-spark "
        "that supports it, or leave 'delta' out of components."
    )


def delta_declared_pyspark() -> str | None:
    """The pyspark requirement the installed delta-spark declares (its metadata)."""
    for dist in ("delta-spark", "delta_spark"):
        try:
            requires = importlib.metadata.requires(dist) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for req in requires:
            if req.replace("_", "-").lower().startswith("pyspark"):
                return req
    return None


#: The Iceberg release for each Spark minor: the newest whose runtime jar
#: (``iceberg-spark-runtime-<minor>_<scala>``) is on Maven Central (checked 2026-11-30:
#: 3.5_2.12 to 1.12.0, 4.0_2.13 to 1.11.0, 4.1_2.13 to 1.12.0). Spark 4.2 and 4.3 have none
#: yet (4.2 made ``View`` a class: a 4.1 jar fails there with IncompatibleClassChangeError).
ICEBERG_FOR_SPARK: dict[tuple[int, ...], str] = {
    (3, 5): "1.12.0",
    (4, 0): "1.11.0",
    (4, 1): "1.12.0",
}


#: PostgreSQL's JDBC driver (``org.postgresql:postgresql``, the newest 42.7.x on Maven Central
#: when checked, 2026-11-30): for an Iceberg JDBC catalog on PostgreSQL
#: (``spark.sql.catalog.<c>.uri=jdbc:postgresql://...``) or Spark's JDBC source. One jar and
#: ``checker-qual``; it does not depend on the Spark version.
POSTGRES_JDBC_VERSION = "42.7.14"


def iceberg_version(spark: str) -> str:
    """The Iceberg release for Spark ``spark``: ``$EOS_ICEBERG_VERSION``, else
    :data:`ICEBERG_FOR_SPARK`'s; a Spark minor without a runtime jar is refused by name."""
    override = os.environ.get("EOS_ICEBERG_VERSION")
    if override:
        return override
    release = ICEBERG_FOR_SPARK.get(version_tuple(spark)[:2])
    if release is not None:
        return release
    known = ", ".join(f"{a}.{b}" for a, b in sorted(ICEBERG_FOR_SPARK))
    raise ConfigurationError(
        f"Apache Iceberg publishes no Spark runtime for Spark {minor_version(spark)} "
        f"(iceberg-spark-runtime-{minor_version(spark)}_2.13 is not on Maven Central; runtimes "
        f"exist for Spark {known}). Run the Iceberg job on one of those Spark versions, or, "
        "once Iceberg publishes a runtime for this one, set EOS_ICEBERG_VERSION to its release."
    )


def unavailable(component: str) -> str | None:
    """Why ``component`` has no release for the running Spark (Iceberg on Spark 4.2 and 4.3),
    or ``None``: not a fault of the set-up, only a component this Spark cannot use."""
    if component == "iceberg":
        try:
            iceberg_version(_spark_version())
        except ConfigurationError as exc:
            return str(exc)
    return None


def _delta_artifact_id(delta_version: str, spark_version: str, scala: str) -> str:
    if version_tuple(delta_version)[:2] >= _DELTA_FIRST_SPARK_SUFFIXED:
        spark_minor = ".".join(spark_version.split(".")[:2])
        return f"delta-spark_{spark_minor}_{scala}"
    return f"delta-spark_{scala}"


def component_plan(component: str, spark_home: Path) -> Plan:
    spark = _spark_version()
    scala = _scala_binary_version(spark_home / "jars")
    if component == "delta":
        delta = _delta_version()
        artifact = Artifact("io.delta", _delta_artifact_id(delta, spark, scala), delta)
        return Plan("delta", f"delta-{delta}-spark{spark}_{scala}", (artifact,),
                     pinned_group=artifact.group, spark_version=spark)
    if component == "kafka":
        artifact = Artifact("org.apache.spark", f"spark-sql-kafka-0-10_{scala}", spark)
        return Plan("kafka", f"kafka-{spark}_{scala}", (artifact,), spark_version=spark)
    if component == "s3":
        # hadoop-aws must match pyspark's hadoop-client-api/runtime to the patch version;
        # those stand in for hadoop-common & co, so no Hadoop artifact but the root is taken.
        hadoop = _hadoop_version(spark_home / "jars")
        artifact = Artifact(_HADOOP_GROUP, "hadoop-aws", hadoop)
        return Plan("s3", f"s3-{hadoop}-spark{spark}", (artifact,), pinned_group=_HADOOP_GROUP,
                     pinned_exact=True, excluded=((_HADOOP_GROUP, "*"),), spark_version=spark)
    if component == "iceberg":
        iceberg = iceberg_version(spark)
        artifact = Artifact("org.apache.iceberg",
                            f"iceberg-spark-runtime-{minor_version(spark)}_{scala}", iceberg)
        # One shaded jar: its POM names no dependency a Spark session needs.
        return Plan("iceberg", f"iceberg-{iceberg}-spark{spark}_{scala}", (artifact,),
                     pinned_group=artifact.group, pinned_exact=True, spark_version=spark)
    if component == "postgres-jdbc":
        artifact = Artifact("org.postgresql", "postgresql", POSTGRES_JDBC_VERSION)
        return Plan("postgres-jdbc", f"postgres-jdbc-{POSTGRES_JDBC_VERSION}", (artifact,),
                     pinned_group=artifact.group, pinned_exact=True, spark_version=spark)
    raise ConfigurationError(
        f"Unknown Spark component {component!r}: choose from {', '.join(COMPONENTS)}."
    )
