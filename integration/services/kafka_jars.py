"""Kafka's broker jars, fetched once by Maven, and the Java that runs them."""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import time
from pathlib import Path

from integration.services.config import (
    DEFAULT_KAFKA_VERSION,
    DEPENDENCY_PLUGIN,
    LOG4J_VERSION,
    SLF4J_VERSION,
    ServiceError,
    cache_dir,
    kafka_version,
)
from integration.services.process import _apt_install, _log_excerpt, _run

log = logging.getLogger("connectors.services")


# ---------------------------------------------------------------------------- Kafka

def _java() -> str:
    def find() -> str | None:
        home = os.environ.get("JAVA_HOME", "").strip()
        if home and (Path(home) / "bin" / "java").exists():
            return str(Path(home) / "bin" / "java")
        return shutil.which("java")

    java = find()
    if java is None:
        _apt_install(
            ["openjdk-17-jre-headless"], "Java (17 or newer) is needed for Kafka and was not found"
        )
        java = find()
    if java is None:
        raise ServiceError(
            "Java 17+ not found: install a JRE (apt-get install -y openjdk-17-jre-headless)"
            " or set JAVA_HOME"
        )
    out = _run([java, "-version"], timeout=60).stdout
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):
        major = int(match.group(2))
    if major < 17:
        raise ServiceError(
            f"Kafka 4 needs Java 17 or newer; {java} is {out.splitlines()[0] if out else '?'}"
        )
    return java


def _mvn() -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        _apt_install(["maven"], "Maven is needed once to fetch the Kafka jars and was not found")
        mvn = shutil.which("mvn")
    if mvn is None:
        raise ServiceError("Maven (mvn) not found; install it (apt-get install -y maven)")
    return mvn


def _kafka_pom(version: str) -> str:
    deps = [
        ("org.apache.kafka", "kafka_2.13", version),
        ("org.slf4j", "slf4j-api", SLF4J_VERSION),
        ("org.apache.logging.log4j", "log4j-api", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-slf4j2-impl", LOG4J_VERSION),
    ]
    body = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in deps
    )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
        "  <modelVersion>4.0.0</modelVersion>\n"
        "  <groupId>connectors.integration</groupId>\n"
        f"  <artifactId>kafka-broker-{version}</artifactId>\n"
        "  <version>1</version>\n"
        "  <packaging>pom</packaging>\n"
        f"  <dependencies>\n{body}\n  </dependencies>\n"
        "</project>\n"
    )


def kafka_libs(version: str | None = None) -> Path:
    """The broker's classpath directory, fetched with Maven on first use."""
    version = version or kafka_version()
    home = cache_dir() / f"kafka-{version}"
    libs = home / "libs"
    marker = home / "libs.complete"

    def ready() -> bool:
        return marker.exists() and any(libs.glob(f"kafka_2.13-{version}.jar"))

    if ready():
        return libs
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        if ready():
            return libs
        mvn = _mvn()
        (home / "pom.xml").write_text(_kafka_pom(version))
        staging = home / "libs.partial"
        shutil.rmtree(staging, ignore_errors=True)
        mvn_log = home / "maven.log"
        argv = [
            mvn,
            "-B",
            "-ntp",
            "-f",
            str(home / "pom.xml"),
            f"-Dmaven.repo.local={cache_dir() / 'maven-repo'}",
            f"{DEPENDENCY_PLUGIN}:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={staging}",
        ]
        log.info("fetching Kafka %s jars with Maven into %s (one-time) ...", version, libs)
        started = time.monotonic()
        proc = _run(argv, timeout=900, check=False)
        mvn_log.write_text(proc.stdout)
        if proc.returncode != 0:
            missing = re.findall(r"Could not (?:find|resolve) artifact ([^\s]+)", proc.stdout)
            hint = (
                f" (missing on the repository: {', '.join(sorted(set(missing)))})"
                if missing
                else ""
            )
            raise ServiceError(
                f"Maven could not fetch Kafka {version}{hint}. Check the network to Maven Central, "
                "or pick another release with EOS_KAFKA_VERSION "
                f"(default {DEFAULT_KAFKA_VERSION}).\n"
                f"{_log_excerpt(mvn_log, 30)}"
            )
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
        marker.write_text(f"{time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
        count = len(list(libs.glob("*.jar")))
        log.info("fetched %d jars in %.1fs", count, time.monotonic() - started)
        return libs
