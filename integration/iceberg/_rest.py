"""An Iceberg REST catalog server for the tests, from Maven Central alone (no Docker).

Apache Iceberg publishes the REST catalog server its own tests use (``RESTCatalogServer``,
the ``apache/iceberg-rest-fixture`` image's program) as
``org.apache.iceberg:iceberg-open-api:<v>:test-fixtures``; the servlet and adapter it serves
are in ``iceberg-core:<v>:tests``. With Jetty 12 (ee10), a JDBC driver for its backing
catalog (SQLite, a file of the test's own) and the Hadoop client jars pyspark ships (its
default ``HadoopFileIO``), it runs as a plain ``java -cp`` process. The jars are resolved
once per machine with Maven into ``$EOS_CACHE_DIR/jars/iceberg-rest-fixture-<v>/`` (a
directory published by rename, with its stamp inside, as ``connectors.spark``'s jars are).

The server is a REST catalog as Iceberg specifies it: Spark's ``type=rest`` client and
pyiceberg's ``RestCatalog`` talk to it over HTTP; it keeps the catalog in SQLite (Iceberg's
``JdbcCatalog``) and the tables under the warehouse directory given.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["REST_ICEBERG", "rest_catalog_server", "rest_jars"]

#: The newest ``iceberg-open-api`` release on Maven Central (checked 2026-11-30: 1.7.0 to
#: 1.11.0; 1.12.0 published no ``iceberg-open-api``). The REST protocol is what Spark's
#: Iceberg 1.12 client and the server share.
REST_ICEBERG = "1.11.0"
#: Jetty 12.1 (ee10 servlets, ``jetty-compression-*``), which RESTCatalogServer 1.11 uses.
JETTY = "12.1.5"
SQLITE_JDBC = "3.50.3.0"
SLF4J = "2.0.17"

_DEPENDENCIES = [
    ("org.apache.iceberg", "iceberg-open-api", REST_ICEBERG, "test-fixtures"),
    ("org.apache.iceberg", "iceberg-core", REST_ICEBERG, None),
    ("org.apache.iceberg", "iceberg-core", REST_ICEBERG, "tests"),
    ("org.eclipse.jetty.ee10", "jetty-ee10-servlet", JETTY, None),
    ("org.eclipse.jetty.compression", "jetty-compression-server", JETTY, None),
    ("org.eclipse.jetty.compression", "jetty-compression-gzip", JETTY, None),
    ("org.xerial", "sqlite-jdbc", SQLITE_JDBC, None),
    ("org.slf4j", "slf4j-simple", SLF4J, None),
]
_STAMP = ".complete.json"


def _pom() -> str:
    deps = "".join(
        f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version>"
        + (f"<classifier>{c}</classifier>" if c else "") + "</dependency>"
        for g, a, v, c in _DEPENDENCIES)
    return ('<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0'
            '</modelVersion><groupId>connectors.tests</groupId><artifactId>rest-fixture'
            f'</artifactId><version>1</version><dependencies>{deps}</dependencies></project>')


def rest_jars() -> list[Path]:
    """The server's jars (resolved with Maven on first use), and pyspark's Hadoop client."""
    from connectors.spark.jars._cache import _file_lock, cache_root
    from connectors.spark.jars._components import pyspark_home

    jars_root = cache_root(None) / "jars"
    target = jars_root / f"iceberg-rest-fixture-{REST_ICEBERG}"
    if not (target / _STAMP).exists():
        with _file_lock(jars_root / ".resolve.lock"):  # one Maven at a time in the cache
            _fetch(target)
    names = json.loads((target / _STAMP).read_text(encoding="utf-8"))["jars"]
    spark_jars = pyspark_home() / "jars"
    hadoop = sorted(spark_jars.glob("hadoop-client-api-*.jar")) + sorted(
        spark_jars.glob("hadoop-client-runtime-*.jar"))
    return [target / n for n in names] + hadoop


def _fetch(target: Path) -> None:
    """Maven's copy of the server's jars into ``target`` (under the cache's lock)."""
    if (target / _STAMP).exists():  # another process finished meanwhile
        return
    mvn = shutil.which(os.environ.get("EOS_MVN") or "mvn")
    if mvn is None:
        raise RuntimeError("Maven ('mvn') is not on PATH: the REST catalog server's jars "
                           "come from Maven Central")
    work = Path(tempfile.mkdtemp(prefix=".iceberg-rest-fixture.", dir=target.parent))
    try:
        (work / "pom.xml").write_text(_pom(), encoding="utf-8")
        out = work / target.name
        proc = subprocess.run(
            [mvn, "-q", "-B", f"-Dmaven.repo.local={target.parent / '.maven-repo'}",
             "org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies",
             f"-DoutputDirectory={out}", "-DincludeScope=runtime"],
            cwd=work, capture_output=True, text=True, timeout=900, check=False)
        if proc.returncode != 0:
            raise RuntimeError("Maven could not fetch the REST catalog server's jars:\n"
                               + (proc.stdout + proc.stderr)[-3000:])
        names = sorted(p.name for p in out.glob("*.jar"))
        (out / _STAMP).write_text(json.dumps({"jars": names}) + "\n", encoding="utf-8")
        shutil.rmtree(target, ignore_errors=True)  # a crashed earlier run's, unstamped
        os.rename(out, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _ready(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/v1/config", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


@contextmanager
def rest_catalog_server(root: Path, port: int, *, timeout: float = 60.0) -> Iterator[str]:
    """Run the REST catalog server on ``port`` (its catalog in ``root/catalog.db``, its
    tables under ``root/warehouse``) for the block; yields its URI. Stopped after it
    (SIGTERM, then SIGKILL; SIGTERM too if the test process dies), its log in
    ``root/server.log``. Jetty listens on every interface of the machine (the server has
    no host setting); the tests reach it on 127.0.0.1 only."""
    from integration.support._standalone import _die_with_parent

    root.mkdir(parents=True, exist_ok=True)
    classpath = os.pathsep.join(map(str, rest_jars()))
    java = shutil.which("java", path=os.path.join(os.environ["JAVA_HOME"], "bin")) \
        if os.environ.get("JAVA_HOME") else shutil.which("java")
    if java is None:
        raise RuntimeError("no java on PATH (nor in $JAVA_HOME)")
    env = {**os.environ, "CATALOG_REST_PORT": str(port),
           "CATALOG_WAREHOUSE": str(root / "warehouse"),
           "CATALOG_URI": f"jdbc:sqlite:{root / 'catalog.db'}"}
    uri = f"http://127.0.0.1:{port}"
    with open(root / "server.log", "wb") as log:
        proc = subprocess.Popen(
            [java, "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp", classpath,
             "org.apache.iceberg.rest.RESTCatalogServer"],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root,
            preexec_fn=_die_with_parent)
        try:
            deadline = time.monotonic() + timeout
            while not _ready(uri):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the REST catalog server did not start:\n"
                                       + (root / "server.log").read_text(errors="replace")[-3000:])
                time.sleep(0.2)
            yield uri
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
