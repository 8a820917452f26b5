"""Version choice: the published release used when an exact one is missing, and the refusals.

When Maven cannot get an artifact, :func:`older_release` picks the newest older release
from the repository's ``maven-metadata.xml``: same major version, and same minor version
for the component's pinned group (Delta's jars must match delta-spark's minor version).
:func:`no_same_minor` and :func:`refuse_cross_minor` build the errors that refuse a
Delta jar of another minor version, each naming the fix (:func:`_delta_fix`). An exactly
pinned group (Hadoop's, for ``"s3"``) takes no other release at all: :func:`no_exact`.
"""

from __future__ import annotations

import logging
import re
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path

from connectors.core.errors import ConfigurationError
from connectors.spark.jars._components import (
    Artifact,
    Plan,
    delta_declared_pyspark,
    minor_version,
    version_tuple,
)

__all__ = ["no_exact", "no_same_minor", "older_release"]

logger = logging.getLogger(__name__)

_RELEASE = re.compile(r"^\d+(?:\.\d+)*$")


def older_release(
    missing: Artifact, repo: str, *, exclude: set[str], same_minor: bool
) -> Artifact | None:
    """The newest published release below ``missing``: same major (and minor if asked)."""
    wanted = version_tuple(missing.version)
    width = 2 if same_minor else 1
    candidates = [
        v
        for v in _published_releases(missing, repo) or []
        if v not in exclude
        and version_tuple(v)[:width] == wanted[:width]
        and version_tuple(v) < wanted
    ]
    if not candidates:
        return None
    best = max(candidates, key=version_tuple)
    return Artifact(missing.group, missing.artifact, best)


def _published_releases(artifact: Artifact, repo: str) -> list[str] | None:
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


def _delta_fix(root: Artifact, published: str | None) -> str:
    """What to do when no Delta jar of ``root``'s minor version can be had; ``published``
    is a release of ``root``'s artifact that the repository has, if any."""
    fix = "Delta's Python package and its jars must be the same minor version: "
    if published:
        fix += (
            f"install delta-spark {minor_version(published)}.x, whose jars are published for this "
            f"Spark (pip install 'delta-spark=={published}'), or set "
            f"EOS_DELTA_VERSION={published}, or "
        )
    return fix + (
        f"set EOS_MAVEN_REPO to a repository that has {root.group}:{root.artifact}:"
        f"{minor_version(root.version)}.x"
    )


def no_same_minor(
    plan: Plan, missing: Artifact, repo: str, maven_said: str
) -> ConfigurationError:
    """The refusal when a pinned (Delta) artifact has no release of its own minor version.

    ``maven_said``: the tail of Maven's output, quoted at the end of the message.
    """
    root = next((r for r in plan.roots if r.group == plan.pinned_group), missing)
    published = _published_releases(missing, repo)
    if not published:
        spark = plan.spark_version
        spark_minor = ".".join(spark.split(".")[:2])
        why = (
            f"{repo} has no {missing.group}:{missing.artifact} at all: no Delta Lake release "
            f"is published for Spark {spark_minor} (pyspark {spark}) there"
        )
        declared = delta_declared_pyspark()
        if declared:
            why += f"; the installed delta-spark declares {declared}"
        fix = (
            "Use a pyspark version that delta-spark supports, set EOS_MAVEN_REPO to a "
            "repository that has the jar, or leave 'delta' out of components"
        )
    else:
        older = [v for v in published if version_tuple(v) < version_tuple(missing.version)]
        newest = max(older, key=version_tuple) if older else None
        why = (
            f"{missing} is not in {repo}, nor is any other release of its minor version"
            + (f"; the newest older release, {newest}, is another minor version and is "
               "refused" if newest else "")
        )
        fix = _delta_fix(root, newest)
    return ConfigurationError(f"Cannot use the {plan.component!r} jars: {why}. {fix}. "
                              f"Maven said:\n{maven_said}")


def _exact_why(plan: Plan) -> str:
    root = next(r for r in plan.roots if r.group == plan.pinned_group)
    return (
        f"{plan.pinned_group} artifacts must be exactly the version pyspark ships "
        f"({root.version}, its hadoop-client-api and hadoop-client-runtime jars): another "
        "release is refused, as hadoop-aws of one version with hadoop-common of another "
        "fails at run time"
    )


def no_exact(plan: Plan, missing: Artifact, repo: str, maven_said: str) -> ConfigurationError:
    """The refusal when an exactly pinned (Hadoop) artifact is not in the repository.

    ``maven_said``: the tail of Maven's output, quoted at the end of the message.
    """
    return ConfigurationError(
        f"Cannot use the {plan.component!r} jars: {missing} is not in {repo}; "
        f"{_exact_why(plan)}. Set EOS_MAVEN_REPO to a repository that has {missing}, use a "
        f"pyspark whose Hadoop version has a published {missing.artifact}, or leave "
        f"{plan.component!r} out of components and pass the jars yourself in spark.jars. "
        f"Maven said:\n{maven_said}"
    )


def str_map(value: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def refuse_cross_minor(plan: Plan, target: Path, stamp: Mapping[str, object]) -> None:
    """Raise if a cached stamp records a pinned artifact substituted by another minor
    (by any other release, for an exactly pinned group)."""
    if plan.pinned_group is None:
        return
    root = next(r for r in plan.roots if r.group == plan.pinned_group)
    for key, got in str_map(stamp.get("substituted")).items():
        if key.partition(":")[0] != plan.pinned_group:
            continue
        if plan.pinned_exact:
            raise ConfigurationError(
                f"The cached {plan.component!r} jars in {target} use {key}:{got} for "
                f"{root}: {_exact_why(plan)}. Delete {target} to resolve again."
            )
        if version_tuple(got)[:2] != version_tuple(root.version)[:2]:
            raise ConfigurationError(
                f"The cached {plan.component!r} jars in {target} use {key}:{got} for "
                f"{root}: another minor version, which is refused. "
                f"{_delta_fix(root, got)}; then delete {target} to resolve again."
            )
