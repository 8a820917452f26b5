"""Spark session helper: the jars for Delta Lake and Kafka, and a session that uses them.

The pip-installed ``pyspark`` ships Spark's own jars but neither Delta Lake nor the Kafka
source/sink. :func:`resolve_jars` fetches those once with Maven into a local cache and
returns explicit jar paths for ``spark.jars``; :func:`session_builder` and
:func:`get_session` build a small-machine session with them::

    from connectors.spark import get_session

    spark = get_session("my-app")                        # local[2], Delta + Kafka
    spark.range(3).write.format("delta").save("/tmp/t")

Why not ``spark.jars.packages`` (Spark's Ivy resolver, which ``delta``'s own
``configure_spark_with_delta_pip`` uses)? It resolves on every JVM start, it puts the
whole transitive closure on the classpath, including older copies of jars that pyspark
already ships (Hadoop, Jackson, Parquet, Scala, SLF4J, ...), and one missing artifact fails
the session start. Here the closure is resolved once, pruned of everything pyspark already
has, and cached.

Cache layout, under ``$EOS_CACHE_DIR`` (default ``~/.cache/connectors``)::

    jars/
      .resolve.lock                      fcntl lock held while Maven runs
      .maven-repo/                       Maven's local repository, private to this cache
      delta-4.4.1-spark4.2.0_2.13/       one directory per component and version
        delta-spark_4.2_2.13-4.4.0.jar
        ...
        .complete.json                   completion stamp: the jars and what was resolved

A directory is published by an atomic rename with its stamp already inside, so a reader
never sees a half-written one; when the stamp is there no Maven process is started.

Maven is ``mvn`` on ``PATH`` (or ``$EOS_MVN``); the repository is Maven's default central
unless ``$EOS_MAVEN_REPO`` names another one. When an exact artifact is not published (a
pip release of delta-spark that has no Maven twin yet, or a mirror that lags), the newest
older release of the same line is used instead and a warning says so; the stamp records it.
A Delta jar is replaced only within its minor version (4.4.1 by 4.4.0); anything further is
refused with a ConfigurationError that names the fix. Each :func:`resolve_jars` call (so
each session start) prints one line per component to stderr: what is on the class path,
and "substituted X for Y" when a substitution happened; :func:`jar_report` (used by
``connectors doctor``) tells the same from the cache alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import json
import logging
import os
import re
import shutil
import site
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from xml.sax.saxutils import escape

import pyspark
from pyspark.sql import SparkSession

from connectors.core.errors import ConfigurationError

__all__ = ["JarChoice", "check_components", "get_session", "jar_report", "resolve_jars",
           "session_builder"]

logger = logging.getLogger(__name__)

#: Components :func:`resolve_jars` knows.
COMPONENTS: tuple[str, ...] = ("delta", "kafka")

_DEFAULT_CACHE = "~/.cache/connectors"
_STAMP = ".complete.json"
_LOCK = ".resolve.lock"
_MAVEN_REPO_LOCAL = ".maven-repo"
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"
_DEFAULT_REPO = "https://repo1.maven.org/maven2"
_MAVEN_TIMEOUT_S = 1200.0
_MAX_SUBSTITUTIONS = 6
_DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
_DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"

# Delta publishes one artifact per Spark minor (delta-spark_4.2_2.13) from 4.1 on; before
# that one artifact per Scala version (delta-spark_2.13). See delta/pip_utils.py.
_DELTA_FIRST_SPARK_SUFFIXED = (4, 1)

_LOCAL_CLUSTER = re.compile(r"^local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\]$")
_RELEASE = re.compile(r"^\d+(?:\.\d+)*$")
_COORD = r"([\w.\-]+(?::[\w.\-]+){3,4})"
# What Maven says about an artifact it cannot get, most specific first: in a chain
# "Failed to collect dependencies at A -> B: Failed to read artifact descriptor for B"
# the broken one is B.
_MISSING_PATTERNS = (
    *(
        re.compile(p + r"\s+" + _COORD)
        for p in (
            r"Failed to read artifact descriptor for",
            r"Could not find artifact",
            r"Failure to find",
            r"Could not transfer artifact",
        )
    ),
    # a miss remembered in the local repository from an earlier run
    re.compile(_COORD + r"\s+was not found in"),
)


@dataclass(frozen=True)
class _Artifact:
    group: str
    artifact: str
    version: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.artifact)

    def __str__(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"


@dataclass(frozen=True)
class _Plan:
    """What one component needs: Maven roots and the cache directory name.

    ``pinned_group``: artifacts of this group (the root's and its transitive ones) may be
    substituted only by a release of the same minor version as the root's.
    """

    component: str
    dirname: str
    roots: tuple[_Artifact, ...]
    pinned_group: str | None = None


@dataclass(frozen=True)
class JarChoice:
    """The jars :func:`resolve_jars` chose, or would choose, for one component.

    ``used`` are the root coordinates actually on the class path (``requested`` unless a
    substitution happened); ``substitutions`` are ``(group:artifact, requested version,
    used version)``; ``jars`` is the number of jar files, ``None`` while the component is
    not resolved yet (then ``note`` says what the first session will do).
    """

    component: str
    requested: tuple[str, ...]
    used: tuple[str, ...]
    substitutions: tuple[tuple[str, str, str], ...] = ()
    jars: int | None = None
    directory: str = ""
    note: str = ""

    def line(self) -> str:
        """One line: component, coordinates, any substitution, where the jars are."""
        text = f"{self.component}: {', '.join(self.used) or 'no jars'}"
        roots = {u.rsplit(":", 1)[0] for u in self.used}
        for key, wanted, got in self.substitutions:
            what = got if key in roots else f"{key}:{got}"
            text += f"; substituted {what} for {wanted}"
        if self.jars is not None:
            text += f" ({self.jars} jars in {self.directory})"
        if self.note:
            text += f" ({self.note})"
        return text


# --------------------------------------------------------------------------- versions


def _spark_version() -> str:
    return str(pyspark.__version__)


def _spark_home() -> Path:
    """Spark's home as the pyspark launcher uses it: ``$SPARK_HOME`` or pyspark's dir."""
    env = os.environ.get("SPARK_HOME")
    if env:
        return Path(env)
    return Path(pyspark.__file__).resolve().parent


def _artifact_id_of(jar_name: str) -> str:
    """``spark-core_2.13-4.2.0.jar`` -> ``spark-core_2.13``: the name before the version."""
    stem = jar_name[:-4] if jar_name.endswith(".jar") else jar_name
    match = re.search(r"-\d", stem)
    return stem[: match.start()] if match else stem


@lru_cache(maxsize=4)
def _provided_artifact_ids(jars_dir: Path) -> frozenset[str]:
    """Artifact ids of the jars Spark already ships: never fetched nor put on spark.jars."""
    try:
        names = os.listdir(jars_dir)
    except OSError:
        return frozenset()
    return frozenset(_artifact_id_of(n) for n in names if n.endswith(".jar"))


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


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version.split("-", maxsplit=1)[0])[:3])


def _delta_version() -> str:
    override = os.environ.get("EOS_DELTA_VERSION")
    if override:
        return override
    for dist in ("delta-spark", "delta_spark"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise ConfigurationError(
        "The 'delta' jars match the installed delta-spark Python package, which is not "
        "installed: pip install 'spark-exactly-once[delta]' (or delta-spark), set "
        "EOS_DELTA_VERSION to the Delta Lake version wanted, or leave 'delta' out of components."
    )


def _delta_artifact_id(delta_version: str, spark_version: str, scala: str) -> str:
    if _version_tuple(delta_version)[:2] >= _DELTA_FIRST_SPARK_SUFFIXED:
        spark_minor = ".".join(spark_version.split(".")[:2])
        return f"delta-spark_{spark_minor}_{scala}"
    return f"delta-spark_{scala}"


def _plan(component: str, spark_home: Path) -> _Plan:
    spark = _spark_version()
    scala = _scala_binary_version(spark_home / "jars")
    if component == "delta":
        delta = _delta_version()
        artifact = _Artifact("io.delta", _delta_artifact_id(delta, spark, scala), delta)
        return _Plan("delta", f"delta-{delta}-spark{spark}_{scala}", (artifact,),
                     pinned_group=artifact.group)
    if component == "kafka":
        artifact = _Artifact("org.apache.spark", f"spark-sql-kafka-0-10_{scala}", spark)
        return _Plan("kafka", f"kafka-{spark}_{scala}", (artifact,))
    raise ConfigurationError(
        f"Unknown Spark component {component!r}: choose from {', '.join(COMPONENTS)}."
    )


# --------------------------------------------------------------------------- public API


def resolve_jars(
    components: Iterable[str] = COMPONENTS, *, cache_dir: str | None = None
) -> list[str]:
    """Return local paths of the jars that ``components`` need beyond pyspark's own.

    ``"delta"`` is ``io.delta:delta-spark_<spark minor>_<scala>`` at the installed
    delta-spark Python package's version; ``"kafka"`` is
    ``org.apache.spark:spark-sql-kafka-0-10_<scala>`` at pyspark's version. Both come with
    their runtime dependencies less every artifact pyspark already ships. The first call
    for a version runs Maven (a minute or less, once per machine); every later call only
    reads the cache's stamp file. Safe to call from several processes at once. When an
    exact version is not in the Maven repository, the newest older release of the same
    line is used and a warning logged (the stamp's ``substituted`` records it); delete the
    component's directory to resolve again. A Delta jar (any ``io.delta`` artifact) is
    only ever replaced by a release of the same minor version (4.4.1 by 4.4.0, never by
    4.3.x): Delta's Python package and its jars must match.

    Every call prints one line per component to stderr: the coordinates used, any
    substitution ("substituted io.delta:delta-spark_4.2_2.13:4.4.0 for 4.4.1") and the
    cache directory (see :class:`JarChoice`; :func:`jar_report` tells the same without
    resolving anything).

    Args:
        components: any of ``"delta"`` and ``"kafka"``; a single string is one component.
        cache_dir: cache root instead of ``$EOS_CACHE_DIR`` or ``~/.cache/connectors``;
            jars go to ``<cache_dir>/jars/<component>-<version>/``.

    Returns:
        Absolute jar paths, without duplicates, ready for ``spark.jars``.

    Raises:
        ConfigurationError: unknown component, ``mvn`` missing, the download failed, or
            a Delta jar of the wanted minor version is not published; the message names
            the fix.

    .. example-needs: spark

    Example:
        >>> jars = resolve_jars(["kafka"])
        >>> sorted(p.rsplit("/", 1)[-1] for p in jars)
        [...'kafka-clients-...jar'...]
    """
    names = (components,) if isinstance(components, str) else tuple(components)
    if not names:
        return []
    spark_home = _spark_home()
    plans = [_plan(name, spark_home) for name in dict.fromkeys(names)]
    jars_root = _cache_root(cache_dir) / "jars"
    out: list[str] = []
    seen: set[str] = set()
    for plan in plans:
        paths, stamp = _resolve_plan(plan, jars_root, spark_home)
        choice = _choice(plan, jars_root / plan.dirname, stamp, len(paths))
        print(f"connectors.spark: jars for {choice.line()}", file=sys.stderr, flush=True)
        for path in paths:
            base = os.path.basename(path)
            if base not in seen:
                seen.add(base)
                out.append(path)
    return out


def jar_report(
    components: Iterable[str] = COMPONENTS, *, cache_dir: str | None = None
) -> list[JarChoice]:
    """What :func:`resolve_jars` would put on the class path, from its cache alone.

    Starts no JVM and no Maven, and reads no network: a component that is not cached yet
    is reported with the coordinates the first session will fetch; ``"delta"`` without
    delta-spark installed (and no ``EOS_DELTA_VERSION``) is reported as needing none. A
    cached Delta substitution across minor versions raises, as :func:`resolve_jars` would.

    Example (prints e.g. ``delta: io.delta:delta-spark_4.2_2.13:4.4.0; substituted 4.4.0
    for 4.4.1 (8 jars in ...)`` and ``kafka: ... (not resolved yet: ...)``)::

        for choice in jar_report():
            print(choice.line())
    """
    names = (components,) if isinstance(components, str) else tuple(components)
    spark_home = _spark_home()
    jars_root = _cache_root(cache_dir) / "jars"
    out: list[JarChoice] = []
    for name in dict.fromkeys(names):
        try:
            plan = _plan(name, spark_home)
        except ConfigurationError:
            if name != "delta":
                raise
            out.append(JarChoice("delta", (), (), note="delta-spark is not installed and "
                                 "EOS_DELTA_VERSION is not set: sessions get no Delta jars"))
            continue
        target = jars_root / plan.dirname
        stamp = _read_stamp(target)
        if stamp is None:
            out.append(JarChoice(
                plan.component, tuple(map(str, plan.roots)), tuple(map(str, plan.roots)),
                directory=str(target),
                note=f"not resolved yet: the first session fetches it with Maven into {target}"))
        else:
            _refuse_cross_minor(plan, target, stamp[1])
            out.append(_choice(plan, target, stamp[1], len(stamp[0])))
    return out


def _choice(plan: _Plan, target: Path, stamp: Mapping[str, object], jars: int) -> JarChoice:
    """The :class:`JarChoice` a completion stamp records."""
    substituted = _str_map(stamp.get("substituted"))
    wanted_from = _str_map(stamp.get("substituted_from"))
    roots = {r.key: r for r in plan.roots}
    subs = []
    for key, got in substituted.items():
        group, _, artifact = key.partition(":")
        root = roots.get((group, artifact))
        wanted = root.version if root is not None else wanted_from.get(key, "?")
        subs.append((key, wanted, got))
    used = tuple(
        str(_Artifact(r.group, r.artifact, substituted.get(f"{r.group}:{r.artifact}", r.version)))
        for r in plan.roots
    )
    return JarChoice(plan.component, tuple(map(str, plan.roots)), used, tuple(subs), jars,
                     str(target))


def _str_map(value: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _refuse_cross_minor(plan: _Plan, target: Path, stamp: Mapping[str, object]) -> None:
    """Raise if a cached stamp records a pinned artifact substituted by another minor."""
    if plan.pinned_group is None:
        return
    root = next(r for r in plan.roots if r.group == plan.pinned_group)
    for key, got in _str_map(stamp.get("substituted")).items():
        if key.partition(":")[0] != plan.pinned_group:
            continue
        if _version_tuple(got)[:2] != _version_tuple(root.version)[:2]:
            raise ConfigurationError(
                f"The cached {plan.component!r} jars in {target} use {key}:{got} for "
                f"{root}: another minor version, which is refused. "
                f"{_delta_fix(root, got)}; then delete {target} to resolve again."
            )


def session_builder(
    app_name: str = "connectors",
    *,
    master: str = "local[2]",
    components: Iterable[str] = COMPONENTS,
    conf: Mapping[str, str] | None = None,
) -> SparkSession.Builder:
    """Return a ``SparkSession.Builder`` with the jars and settings for ``components``.

    Settings, in order (later wins):

    * ``spark.jars`` from :func:`resolve_jars`;
    * with ``"delta"``: Delta's SQL extension and catalog, and
      ``spark.databricks.delta.snapshotPartitions=2``;
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
      instead of replacing them.

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
    settings = _session_conf(app_name, master, names, dict(conf or {}))
    logger.debug("Spark session settings: %s", settings)
    _ensure_python_exec()
    builder: SparkSession.Builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder


def get_session(
    app_name: str = "connectors",
    *,
    master: str = "local[2]",
    components: Iterable[str] = COMPONENTS,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Return ``session_builder(...).getOrCreate()``; same arguments.

    .. example-needs: spark

    Example:
        >>> spark = get_session("t", components=["delta"])
        >>> spark.range(2).write.format("delta").save(f"{path}/t")
        >>> spark.read.format("delta").load(f"{path}/t").count()
        2
    """
    names = (components,) if isinstance(components, str) else tuple(components)
    spark = session_builder(app_name, master=master, components=names, conf=conf).getOrCreate()
    check_components(spark, names)
    return spark


#: A class each component's jars provide, to tell whether they reached the driver.
_MARKER_CLASSES = {
    "delta": _DELTA_EXTENSION,
    "kafka": "org.apache.spark.sql.kafka010.KafkaSourceProvider",
}


def check_components(spark: SparkSession, components: Iterable[str] = COMPONENTS) -> None:
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


# --------------------------------------------------------------------------- session conf

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
        settings["spark.sql.extensions"] = _DELTA_EXTENSION
        settings["spark.sql.catalog.spark_catalog"] = _DELTA_CATALOG
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


def _ensure_python_exec() -> None:
    """Make Python workers run this interpreter unless the user chose one."""
    if not os.environ.get("PYSPARK_PYTHON"):
        os.environ["PYSPARK_PYTHON"] = sys.executable
        logger.debug("PYSPARK_PYTHON set to %s", sys.executable)


def _source_root_if_not_installed() -> str | None:
    """The directory holding the ``connectors`` package, unless it is a site directory."""
    root = Path(__file__).resolve().parents[2]  # connectors/spark/__init__.py
    sites = [*site.getsitepackages(), site.getusersitepackages()]
    installed = {Path(p).resolve() for p in sites if p}
    return None if root in installed else str(root)


# --------------------------------------------------------------------------- cache


def _cache_root(cache_dir: str | None) -> Path:
    raw = cache_dir or os.environ.get("EOS_CACHE_DIR") or _DEFAULT_CACHE
    return Path(raw).expanduser()


_Stamped = tuple[list[str], dict[str, object]]


def _read_stamp(target: Path) -> _Stamped | None:
    """The jars and stamp of a completed cache directory, ``None`` when it is not complete."""
    try:
        data = json.loads((target / _STAMP).read_text(encoding="utf-8"))
        names = [str(n) for n in data["jars"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    paths = [str(target / n) for n in names]
    if not all(os.path.isfile(p) for p in paths):
        logger.warning("Jar cache %s is incomplete; resolving again", target)
        return None
    return paths, data


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if needed) for the block."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+b")  # noqa: SIM115 (closed in the finally below)
    except OSError as exc:
        raise ConfigurationError(
            f"Cannot use the jar cache {path.parent}: {exc}. Point EOS_CACHE_DIR (or "
            "cache_dir=) at a writable directory."
        ) from exc
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("Waiting for another process resolving jars (lock %s)", path)
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield
    finally:
        handle.close()  # closing releases the lock


def _resolve_plan(plan: _Plan, jars_root: Path, spark_home: Path) -> _Stamped:
    target = jars_root / plan.dirname
    cached = _read_stamp(target)
    if cached is None:
        with _file_lock(jars_root / _LOCK):
            cached = _read_stamp(target)  # another process may have finished meanwhile
            if cached is None:
                return _fetch(plan, target, spark_home)
    _refuse_cross_minor(plan, target, cached[1])
    return cached


# --------------------------------------------------------------------------- maven


def _mvn_executable(plan: _Plan) -> str:
    configured = os.environ.get("EOS_MVN")
    found = shutil.which(configured or "mvn")
    if found is None:
        what = (
            f"EOS_MVN={configured!r} is not an executable"
            if configured
            else "Maven ('mvn') is not on PATH"
        )
        raise ConfigurationError(
            f"Cannot fetch the {plan.component!r} jars ({', '.join(map(str, plan.roots))}): "
            f"{what}. Install Maven (Debian/Ubuntu: apt-get install maven; macOS: brew "
            "install maven) or set EOS_MVN to the mvn executable; or leave "
            f"{plan.component!r} out of components and pass the jars yourself in spark.jars."
        )
    return found


def _fetch(plan: _Plan, target: Path, spark_home: Path) -> _Stamped:
    mvn = _mvn_executable(plan)
    jars_root = target.parent
    jars_root.mkdir(parents=True, exist_ok=True)
    provided = _provided_artifact_ids(spark_home / "jars")
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".{plan.dirname}.", dir=jars_root))
    try:
        out_dir = work / plan.dirname
        substitutions, originals = _run_maven(mvn, plan, work, out_dir, provided)
        jars = sorted(
            n
            for n in os.listdir(out_dir)
            if n.endswith(".jar") and _artifact_id_of(n) not in provided
        )
        for name in os.listdir(out_dir):
            if name not in jars:
                (out_dir / name).unlink()
        stamp: dict[str, object] = {
            "component": plan.component,
            "requested": [str(a) for a in plan.roots],
            "substituted": {f"{g}:{a}": v for (g, a), v in substitutions.items()},
            "substituted_from": {f"{g}:{a}": v for (g, a), v in originals.items()},
            "jars": jars,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (out_dir / _STAMP).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
        if target.exists():  # a directory without a valid stamp: a crashed earlier run
            shutil.rmtree(target)
        os.rename(out_dir, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    logger.info(
        "Resolved %s jars (%d files) into %s in %.1f s",
        plan.component,
        len(jars),
        target,
        time.monotonic() - started,
    )
    return [str(target / n) for n in jars], stamp


def _run_maven(
    mvn: str, plan: _Plan, work: Path, out_dir: Path, provided: frozenset[str]
) -> tuple[dict[tuple[str, str], str], dict[tuple[str, str], str]]:
    """Run Maven until it succeeds, swapping unpublished artifacts for older releases.

    Returns the substitutions (artifact -> version used) and the versions they replaced.
    """
    substitutions: dict[tuple[str, str], str] = {}
    originals: dict[tuple[str, str], str] = {}
    tried: dict[tuple[str, str], set[str]] = {}
    repo = os.environ.get("EOS_MAVEN_REPO")
    pom = work / "pom.xml"
    for _ in range(_MAX_SUBSTITUTIONS + 1):
        pom.write_text(_render_pom(plan.roots, substitutions, provided, repo), encoding="utf-8")
        shutil.rmtree(out_dir, ignore_errors=True)
        cmd = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(pom),
            f"{_DEPENDENCY_PLUGIN}:copy-dependencies",
            f"-DoutputDirectory={out_dir}",
            "-DincludeScope=runtime",
            # A private local repository: the excluded artifacts leave POM-only entries
            # behind, which break Spark's Ivy resolver (spark.jars.packages) when it finds
            # them in ~/.m2; and only this module's lock guards this one.
            f"-Dmaven.repo.local={work.parent / _MAVEN_REPO_LOCAL}",
        ]
        logger.info("Fetching %s jars with Maven: %s", plan.component, " ".join(cmd))
        try:
            proc = subprocess.run(
                cmd,
                cwd=work,
                capture_output=True,
                text=True,
                timeout=_MAVEN_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ConfigurationError(
                f"Maven did not finish fetching the {plan.component!r} jars within "
                f"{_MAVEN_TIMEOUT_S:.0f} s. Check network access to Maven Central (or "
                "EOS_MAVEN_REPO) and retry."
            ) from exc
        except OSError as exc:
            raise ConfigurationError(
                f"Cannot run Maven ({mvn}): {exc}. Install Maven or set EOS_MVN."
            ) from exc
        if proc.returncode == 0 and out_dir.is_dir():
            return substitutions, originals
        output = f"{proc.stdout}\n{proc.stderr}"
        missing = _missing_artifact(output)
        alternative = None
        if missing is not None:
            key = missing.key
            tried.setdefault(key, set()).add(missing.version)
            requested = next((r for r in plan.roots if r.key == key), None)
            pinned = requested is not None or missing.group == plan.pinned_group
            alternative = _older_release(
                missing,
                repo or _DEFAULT_REPO,
                exclude=tried[key],
                same_minor=pinned,
            )
            if alternative is None and missing.group == plan.pinned_group:
                raise _no_same_minor(plan, missing, repo or _DEFAULT_REPO, output)
        if missing is None or alternative is None:
            raise ConfigurationError(
                f"Maven could not fetch the {plan.component!r} jars "
                f"({', '.join(map(str, plan.roots))}). Check network access to Maven "
                "Central (or set EOS_MAVEN_REPO to a reachable mirror) and that Java and "
                f"Maven work (mvn -v). Maven said:\n{_tail(output)}"
            )
        logger.warning(
            "%s is not available from the Maven repository; using %s instead",
            missing,
            alternative,
        )
        originals.setdefault(missing.key, missing.version)
        substitutions[missing.key] = alternative.version
    raise ConfigurationError(
        f"Maven could not fetch the {plan.component!r} jars after {_MAX_SUBSTITUTIONS} "
        f"version substitutions ({substitutions}); check the Maven repository."
    )


def _missing_artifact(output: str) -> _Artifact | None:
    for pattern in _MISSING_PATTERNS:
        match = pattern.search(output)
        if match:
            parts = match.group(1).split(":")
            return _Artifact(parts[0], parts[1], parts[-1])
    return None


def _older_release(
    missing: _Artifact, repo: str, *, exclude: set[str], same_minor: bool
) -> _Artifact | None:
    """The newest published release below ``missing``: same major (and minor if asked)."""
    wanted = _version_tuple(missing.version)
    width = 2 if same_minor else 1
    candidates = [
        v
        for v in _published_releases(missing, repo) or []
        if v not in exclude
        and _version_tuple(v)[:width] == wanted[:width]
        and _version_tuple(v) < wanted
    ]
    if not candidates:
        return None
    best = max(candidates, key=_version_tuple)
    return _Artifact(missing.group, missing.artifact, best)


def _published_releases(artifact: _Artifact, repo: str) -> list[str] | None:
    """The release versions of ``artifact`` in ``repo``'s metadata; ``None`` if unreadable."""
    url = (
        f"{repo.rstrip('/')}/{artifact.group.replace('.', '/')}/{artifact.artifact}/"
        "maven-metadata.xml"
    )
    if not url.startswith(("https://", "http://")):
        return None
    try:
        with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 (http(s) only)
            root = ET.fromstring(response.read())  # noqa: S314 (Maven metadata we asked for)
    except (urllib.error.URLError, OSError, ET.ParseError) as exc:
        logger.debug("No version list for %s from %s: %s", artifact, url, exc)
        return None
    return [v for v in (e.text or "" for e in root.iter("version")) if _RELEASE.match(v)]


def _minor(version: str) -> str:
    return ".".join(map(str, _version_tuple(version)[:2]))


def _delta_fix(root: _Artifact, published: str | None) -> str:
    """What to do when no Delta jar of ``root``'s minor version can be had; ``published``
    is a release of ``root``'s artifact that the repository has, if any."""
    fix = "Delta's Python package and its jars must be the same minor version: "
    if published:
        fix += (
            f"install delta-spark {_minor(published)}.x, whose jars are published for this "
            f"Spark (pip install 'delta-spark=={published}'), or set "
            f"EOS_DELTA_VERSION={published}, or "
        )
    return fix + (
        f"set EOS_MAVEN_REPO to a repository that has {root.group}:{root.artifact}:"
        f"{_minor(root.version)}.x"
    )


def _no_same_minor(plan: _Plan, missing: _Artifact, repo: str, output: str) -> ConfigurationError:
    """The refusal when a pinned (Delta) artifact has no release of its own minor version."""
    root = next((r for r in plan.roots if r.group == plan.pinned_group), missing)
    published = _published_releases(missing, repo)
    if not published:
        spark_minor = ".".join(_spark_version().split(".")[:2])
        why = (
            f"{repo} has no {missing.group}:{missing.artifact} at all: no Delta Lake release "
            f"is published for Spark {spark_minor} (pyspark {_spark_version()}) there"
        )
        declared = _delta_declared_pyspark()
        if declared:
            why += f"; the installed delta-spark declares {declared}"
        fix = (
            "Use a pyspark version that delta-spark supports, set EOS_MAVEN_REPO to a "
            "repository that has the jar, or leave 'delta' out of components"
        )
    else:
        older = [v for v in published if _version_tuple(v) < _version_tuple(missing.version)]
        newest = max(older, key=_version_tuple) if older else None
        why = (
            f"{missing} is not in {repo}, nor is any other release of its minor version"
            + (f"; the newest older release, {newest}, is another minor version and is "
               "refused" if newest else "")
        )
        fix = _delta_fix(root, newest)
    return ConfigurationError(f"Cannot use the {plan.component!r} jars: {why}. {fix}. "
                              f"Maven said:\n{_tail(output)}")


def _delta_declared_pyspark() -> str | None:
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


def _render_pom(
    roots: tuple[_Artifact, ...],
    substitutions: Mapping[tuple[str, str], str],
    provided: frozenset[str],
    repo: str | None,
) -> str:
    """A throwaway POM whose runtime dependencies are what a component needs.

    Everything pyspark ships is excluded by artifact id with a wildcard group, which also
    prunes that artifact's own dependencies (pyspark brings those too). A substituted
    transitive artifact is excluded where it was and added as a direct dependency.
    """
    root_keys = {r.key for r in roots}
    excluded_ids = sorted(provided)
    extra_exclusions = sorted(k for k in substitutions if k not in root_keys)

    def exclusions() -> str:
        rows = [
            f"<exclusion><groupId>*</groupId><artifactId>{escape(a)}</artifactId></exclusion>"
            for a in excluded_ids
        ]
        rows += [
            f"<exclusion><groupId>{escape(g)}</groupId><artifactId>{escape(a)}</artifactId>"
            "</exclusion>"
            for g, a in extra_exclusions
        ]
        return "<exclusions>" + "".join(rows) + "</exclusions>" if rows else ""

    def dependency(group: str, artifact: str, version: str) -> str:
        return (
            f"<dependency><groupId>{escape(group)}</groupId>"
            f"<artifactId>{escape(artifact)}</artifactId><version>{escape(version)}</version>"
            f"{exclusions()}</dependency>"
        )

    deps = [dependency(r.group, r.artifact, substitutions.get(r.key, r.version)) for r in roots]
    deps += [dependency(g, a, substitutions[(g, a)]) for g, a in extra_exclusions]
    repositories = (
        "<repositories><repository><id>eos-maven-repo</id>"
        f"<url>{escape(repo)}</url></repository></repositories>"
        if repo
        else ""
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
        "<modelVersion>4.0.0</modelVersion>\n"
        "<groupId>connectors.jars</groupId><artifactId>resolve</artifactId>"
        "<version>0</version><packaging>pom</packaging>\n"
        f"{repositories}\n<dependencies>\n" + "\n".join(deps) + "\n</dependencies>\n</project>\n"
    )


def _tail(text: str, lines: int = 25) -> str:
    kept = [ln for ln in text.strip().splitlines() if ln.strip()]
    cleaned = [re.sub(r"\x1b\[[0-9;]*m", "", ln) for ln in kept[-lines:]]
    return "\n".join(cleaned)
