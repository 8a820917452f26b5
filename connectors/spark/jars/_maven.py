"""Maven: the throwaway POM, the ``mvn`` run, and what its output says is missing.

:func:`run_maven` writes a POM whose runtime dependencies are a component's roots less
everything pyspark ships, runs ``maven-dependency-plugin:copy-dependencies`` into a
directory, and when an artifact is not published swaps it for the release that
:mod:`connectors.spark.jars._releases` picks, then runs Maven again.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from xml.sax.saxutils import escape

from connectors.core.errors import ConfigurationError
from connectors.spark.jars._components import Artifact, Plan
from connectors.spark.jars._releases import no_exact, no_same_minor, older_release

logger = logging.getLogger(__name__)

_MAVEN_REPO_LOCAL = ".maven-repo"
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"
_DEFAULT_REPO = "https://repo1.maven.org/maven2"
_MAVEN_TIMEOUT_S = 1200.0
_MAX_SUBSTITUTIONS = 6

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


def mvn_executable(plan: Plan) -> str:
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


def run_maven(
    mvn: str, plan: Plan, work: Path, out_dir: Path, provided: frozenset[str]
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
        pom.write_text(_render_pom(plan.roots, substitutions, provided, repo, plan.excluded),
                       encoding="utf-8")
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
            # them in ~/.m2; and only this package's lock guards this one.
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
        if missing is not None and plan.pinned_exact and missing.group == plan.pinned_group:
            raise no_exact(plan, missing, repo or _DEFAULT_REPO, _tail(output))
        if missing is not None:
            key = missing.key
            tried.setdefault(key, set()).add(missing.version)
            requested = next((r for r in plan.roots if r.key == key), None)
            pinned = requested is not None or missing.group == plan.pinned_group
            alternative = older_release(
                missing,
                repo or _DEFAULT_REPO,
                exclude=tried[key],
                same_minor=pinned,
            )
            if alternative is None and missing.group == plan.pinned_group:
                raise no_same_minor(plan, missing, repo or _DEFAULT_REPO, _tail(output))
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


def _missing_artifact(output: str) -> Artifact | None:
    for pattern in _MISSING_PATTERNS:
        match = pattern.search(output)
        if match:
            parts = match.group(1).split(":")
            return Artifact(parts[0], parts[1], parts[-1])
    return None


def _render_pom(
    roots: tuple[Artifact, ...],
    substitutions: Mapping[tuple[str, str], str],
    provided: frozenset[str],
    repo: str | None,
    excluded: tuple[tuple[str, str], ...] = (),
) -> str:
    """A throwaway POM whose runtime dependencies are what a component needs.

    Everything pyspark ships is excluded by artifact id with a wildcard group, which also
    prunes that artifact's own dependencies (pyspark brings those too); so is each of the
    plan's ``excluded`` pairs. A substituted transitive artifact is excluded where it was
    and added as a direct dependency.
    """
    root_keys = {r.key for r in roots}
    excluded_ids = sorted(provided)
    extra_exclusions = sorted({*excluded, *(k for k in substitutions if k not in root_keys)})

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
    deps += [dependency(g, a, substitutions[(g, a)])
             for g, a in extra_exclusions if (g, a) in substitutions]
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
