"""The jars a component needs: :func:`resolve_jars`, :func:`jar_report`, :class:`JarChoice`.

:func:`resolve_jars` plans each component (:mod:`connectors.spark.jars._components`), answers
from the cache or runs Maven once (:mod:`connectors.spark.jars._cache`), and prints what it
chose; :func:`jar_report` tells the same from the cache alone.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from connectors.core.errors import ConfigurationError
from connectors.spark.jars._cache import cache_root, read_stamp, resolve_plan
from connectors.spark.jars._components import (
    DEFAULT_COMPONENTS,
    Artifact,
    Plan,
    component_plan,
    pyspark_home,
)
from connectors.spark.jars._releases import refuse_cross_minor, str_map

logger = logging.getLogger(__name__)


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


def resolve_jars(
    components: Iterable[str] = DEFAULT_COMPONENTS, *, cache_dir: str | None = None
) -> list[str]:
    """Return local paths of the jars that ``components`` need beyond pyspark's own.

    ``"delta"`` is ``io.delta:delta-spark_<spark minor>_<scala>`` at the installed
    delta-spark Python package's version (none installed: the Delta release for the running
    Spark, ``_components.DELTA_FOR_SPARK``); ``"kafka"`` is
    ``org.apache.spark:spark-sql-kafka-0-10_<scala>`` at pyspark's version; ``"s3"`` (the
    ``s3a://`` file system; never a default) is ``org.apache.hadoop:hadoop-aws`` at exactly
    the Hadoop version pyspark ships (``jars/hadoop-client-api-<version>.jar``), with the
    AWS SDK v2 ``bundle`` its POM names (650 MB and more). Each comes with its runtime
    dependencies less every artifact pyspark already ships (and, for ``"s3"``, less every
    other ``org.apache.hadoop`` artifact). The first call for a version runs Maven (a
    minute or less, once per machine; ``"s3"``: the bundle's download); every later call
    only reads the cache's stamp file. Safe to call from several processes at once. When an
    exact version is not in the Maven repository, the newest older release of the same
    line is used and a warning logged (the stamp's ``substituted`` records it); delete the
    component's directory to resolve again. A Delta jar (any ``io.delta`` artifact) is
    only ever replaced by a release of the same minor version (4.4.1 by 4.4.0, never by
    4.3.x): Delta's Python package and its jars must match. A Hadoop jar is never replaced.

    Every call prints one line per component to stderr: the coordinates used, any
    substitution ("substituted io.delta:delta-spark_4.2_2.13:4.4.0 for 4.4.1") and the
    cache directory (see :class:`JarChoice`; :func:`jar_report` tells the same without
    resolving anything).

    Args:
        components: any of ``"delta"``, ``"kafka"``, ``"s3"``, ``"iceberg"`` (Iceberg's
            Spark runtime) and ``"postgres-jdbc"`` (``org.postgresql:postgresql``, for an
            Iceberg JDBC catalog on PostgreSQL) (default: ``"delta"`` and ``"kafka"``); a
            single string is one component.
        cache_dir: cache root instead of ``$EOS_CACHE_DIR`` or ``~/.cache/connectors``;
            jars go to ``<cache_dir>/jars/<component>-<version>/``.

    Returns:
        Absolute jar paths, without duplicates, ready for ``spark.jars``.

    Raises:
        ConfigurationError: unknown component, ``mvn`` missing, the download failed, a
            Delta jar of the wanted minor version is not published, or (``"s3"``) pyspark's
            Hadoop version is unknown or its hadoop-aws is not published; the message
            names the fix.

    .. example-needs: spark

    Example:
        >>> jars = resolve_jars(["kafka"])
        >>> sorted(p.rsplit("/", 1)[-1] for p in jars)
        [...'kafka-clients-...jar'...]
    """
    names = (components,) if isinstance(components, str) else tuple(components)
    if not names:
        return []
    spark_home = pyspark_home()
    plans = [component_plan(name, spark_home) for name in dict.fromkeys(names)]
    jars_root = cache_root(cache_dir) / "jars"
    out: list[str] = []
    seen: set[str] = set()
    for plan in plans:
        paths, stamp = resolve_plan(plan, jars_root, spark_home)
        choice = _choice(plan, jars_root / plan.dirname, stamp, len(paths))
        print(f"connectors.spark: jars for {choice.line()}", file=sys.stderr, flush=True)
        for path in paths:
            base = os.path.basename(path)
            if base not in seen:
                seen.add(base)
                out.append(path)
    return out


def jar_report(
    components: Iterable[str] = DEFAULT_COMPONENTS, *, cache_dir: str | None = None
) -> list[JarChoice]:
    """What :func:`resolve_jars` would put on the class path, from its cache alone.

    Starts no JVM and no Maven, and reads no network: a component that is not cached yet
    is reported with the coordinates the first session will fetch (``"delta"`` without
    delta-spark installed: the Delta release for the running Spark); ``"delta"`` on a Spark
    without a known Delta release (and no ``EOS_DELTA_VERSION``) is reported as such. A
    cached Delta substitution across minor versions raises, as :func:`resolve_jars` would.

    Example (prints e.g. ``delta: io.delta:delta-spark_4.2_2.13:4.4.0; substituted 4.4.0
    for 4.4.1 (8 jars in ...)`` and ``kafka: ... (not resolved yet: ...)``)::

        for choice in jar_report():
            print(choice.line())
    """
    names = (components,) if isinstance(components, str) else tuple(components)
    spark_home = pyspark_home()
    jars_root = cache_root(cache_dir) / "jars"
    out: list[JarChoice] = []
    for name in dict.fromkeys(names):
        try:
            plan = component_plan(name, spark_home)
        except ConfigurationError:
            if name != "delta":
                raise
            out.append(JarChoice("delta", (), (), note=(
                "no Delta Lake release is known for this Spark, and neither delta-spark nor "
                "EOS_DELTA_VERSION names one: sessions with 'delta' are refused")))
            continue
        target = jars_root / plan.dirname
        stamp = read_stamp(target)
        if stamp is None:
            session = ("first session" if name in DEFAULT_COMPONENTS
                       else f"first session with {name!r} in components")
            out.append(JarChoice(
                plan.component, tuple(map(str, plan.roots)), tuple(map(str, plan.roots)),
                directory=str(target),
                note=f"not resolved yet: the {session} fetches it with Maven into {target}"))
        else:
            refuse_cross_minor(plan, target, stamp[1])
            out.append(_choice(plan, target, stamp[1], len(stamp[0])))
    return out


def _choice(plan: Plan, target: Path, stamp: Mapping[str, object], jars: int) -> JarChoice:
    """The :class:`JarChoice` a completion stamp records."""
    substituted = str_map(stamp.get("substituted"))
    wanted_from = str_map(stamp.get("substituted_from"))
    roots = {r.key: r for r in plan.roots}
    subs = []
    for key, got in substituted.items():
        group, _, artifact = key.partition(":")
        root = roots.get((group, artifact))
        wanted = root.version if root is not None else wanted_from.get(key, "?")
        subs.append((key, wanted, got))
    used = tuple(
        str(Artifact(r.group, r.artifact, substituted.get(f"{r.group}:{r.artifact}", r.version)))
        for r in plan.roots
    )
    return JarChoice(plan.component, tuple(map(str, plan.roots)), used, tuple(subs), jars,
                     str(target))
