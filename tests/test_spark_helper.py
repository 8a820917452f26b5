"""Unit tests of connectors.spark: no JVM is started and no network is used.

Maven is replaced by a small shell script (``EOS_MVN``) where a test needs one.
"""

from __future__ import annotations

import importlib.metadata
import io
import json
import os
import site
import stat
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pyspark
import pytest

import connectors.spark as cs
from connectors.core.errors import ConfigurationError
from connectors.spark.jars import _components, _maven, _releases, _session

REPO_ROOT = Path(__file__).resolve().parent.parent
SPARK = pyspark.__version__
SCALA = _components._scala_binary_version(_components.pyspark_home() / "jars")  # 2.12 on 3.5
KAFKA_DIR = f"kafka-{SPARK}_{SCALA}"
FAKE_JARS = ["/jars/a.jar", "/jars/b.jar"]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("EOS_MVN", "EOS_MAVEN_REPO", "EOS_DELTA_VERSION", "SPARK_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("EOS_CACHE_DIR", str(tmp_path / "cache"))
    # session_builder may set PYSPARK_PYTHON; monkeypatch restores whatever was there.
    monkeypatch.setenv("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON", sys.executable))


@pytest.fixture
def fake_jars(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    calls: list[tuple[Any, ...]] = []

    def fake(components: Any = cs.COMPONENTS, *, cache_dir: str | None = None) -> list[str]:
        calls.append(tuple(components))
        return list(FAKE_JARS) if tuple(components) else []

    monkeypatch.setattr(_session, "resolve_jars", fake)
    return calls


def options(builder: Any) -> dict[str, str]:
    return {k: str(v) for k, v in builder._options.items()}


# ------------------------------------------------------------------ public names

SPARK_ALL = sorted(["JarChoice", "SavepointStop", "StopReport", "await_termination",
                    "check_components", "configure", "get_session", "jar_report",
                    "last_metrics", "register", "resolve_jars", "session_builder",
                    "spark_conf", "stop_gracefully", "stop_on_sigterm", "stop_with_savepoint",
                    "submit_args"])


def test_spark_all_is_pinned_and_every_name_resolves_from_its_home() -> None:
    assert sorted(cs.__all__) == SPARK_ALL
    namespace: dict[str, object] = {}
    exec("from connectors.spark import *", namespace)
    namespace.pop("__builtins__")
    assert sorted(namespace) == SPARK_ALL
    homes = {"JarChoice": "jars._resolve", "jar_report": "jars._resolve",
             "resolve_jars": "jars._resolve", "check_components": "jars._session",
             "get_session": "jars._session", "session_builder": "jars._session",
             "last_metrics": "_binding", "register": "_source", "StopReport": "_stop",
             "await_termination": "_stop", "stop_gracefully": "_stop",
             "stop_on_sigterm": "_stop", "configure": "jars._submit",
             "SavepointStop": "_stop_savepoint", "stop_with_savepoint": "_stop_savepoint",
             "spark_conf": "jars._submit", "submit_args": "jars._submit"}
    for name, home in homes.items():
        assert getattr(cs, name).__module__ == f"connectors.spark.{home}"
    # not in __all__; connectors doctor uses them
    assert cs.COMPONENTS == ("delta", "kafka", "s3", "iceberg", "postgres-jdbc")
    assert cs.DEFAULT_COMPONENTS == ("delta", "kafka")  # "s3" (650 MB and more) by name only
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        cs.nothing_here  # noqa: B018


def test_importing_connectors_spark_does_not_import_pyspark() -> None:
    """The resolver loads on first use: ``connectors.spark.frames`` users do not pay for it.
    The pyspark guard (``_require``) loads with the package: it imports pyspark only when
    a public name is first used."""
    code = ("import sys, connectors.spark; print(sorted(m for m in sys.modules "
            "if m.startswith(('pyspark', 'connectors.spark'))))")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "['connectors.spark', 'connectors.spark._require']"


# ------------------------------------------------------------------ session_builder


def test_builder_sets_jars_delta_and_small_machine_defaults(fake_jars: list[Any]) -> None:
    opts = options(cs.session_builder("my-app"))
    assert fake_jars == [("delta", "kafka")]
    assert opts["spark.app.name"] == "my-app"
    assert opts["spark.master"] == "local[2]"
    assert opts["spark.jars"] == ",".join(FAKE_JARS)
    assert opts["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert (
        opts["spark.sql.catalog.spark_catalog"] == "org.apache.spark.sql.delta.catalog.DeltaCatalog"
    )
    assert opts["spark.sql.shuffle.partitions"] == "2"
    assert opts["spark.ui.enabled"] == "false"
    assert "spark.driver.memory" not in opts
    assert "spark.executor.memory" not in opts


def test_builder_without_delta_has_no_delta_settings(fake_jars: list[Any]) -> None:
    opts = options(cs.session_builder(components=["kafka"]))
    assert fake_jars == [("kafka",)]
    assert "spark.sql.extensions" not in opts
    assert "spark.sql.catalog.spark_catalog" not in opts
    assert opts["spark.jars"] == ",".join(FAKE_JARS)


def test_builder_without_components_sets_no_jars(fake_jars: list[Any]) -> None:
    opts = options(cs.session_builder(components=()))
    assert "spark.jars" not in opts


def test_a_single_string_is_one_component(fake_jars: list[Any]) -> None:
    cs.session_builder(components="kafka")
    assert fake_jars == [("kafka",)]


def test_user_conf_comes_last_and_list_keys_merge(fake_jars: list[Any]) -> None:
    opts = options(
        cs.session_builder(
            conf={
                "spark.sql.shuffle.partitions": "7",
                "spark.ui.enabled": "true",
                "spark.jars": "/mine/x.jar,/jars/a.jar",
                "spark.sql.extensions": "com.example.Ext",
                "spark.driver.memory": "3g",
            }
        )
    )
    assert opts["spark.sql.shuffle.partitions"] == "7"
    assert opts["spark.ui.enabled"] == "true"
    assert opts["spark.driver.memory"] == "3g"
    assert opts["spark.jars"].split(",") == [*FAKE_JARS, "/mine/x.jar"]
    assert opts["spark.sql.extensions"] == (
        "io.delta.sql.DeltaSparkSessionExtension,com.example.Ext"
    )


def test_local_cluster_sizes_executors_to_the_worker(fake_jars: list[Any]) -> None:
    opts = options(cs.session_builder(master="local-cluster[2, 1, 768]"))
    assert opts["spark.master"] == "local-cluster[2, 1, 768]"
    assert opts["spark.executor.memory"] == "768m"
    opts = options(
        cs.session_builder(master="local-cluster[2,1,1024]", conf={"spark.executor.memory": "512m"})
    )
    assert opts["spark.executor.memory"] == "512m"


def test_s3a_settings_pass_through_and_secrets_are_not_logged(
    fake_jars: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    conf = {
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
        "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.access.key": "AKIA-ACCESS-1",
        "spark.hadoop.fs.s3a.secret.key": "SECRET-2",
        "spark.hadoop.fs.s3a.session.token": "TOKEN-3",
        "spark.ssl.keyPassword": "PASSWORD-4",
        "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net": "AZURE-5",
        "spark.executorEnv.AWS_SECRET_ACCESS_KEY": "ENV-6",
        "spark.authenticate.secret": "SECRET-7",
        "spark.hadoop.fs.s3a.apikey": "APIKEY-8",
        "spark.kafka.clusters.c1.kafka.sasl.jaas.config": "JAAS-9",
        "spark.kafka.clusters.c1.ssl.truststore.password": "TRUST-10",
        "spark.kafka.clusters.c1.kafka.sasl.oauthbearer.assertion.private.key.passphrase":
            "PASSPHRASE-11",
        "spark.ssl.keyStoreType": "JKS",
        "spark.ssl.keystore.type": "PKCS12",
    }
    with caplog.at_level("DEBUG", logger="connectors.spark.jars._session"):
        opts = options(cs.session_builder(components=["delta", "s3"], conf=conf))
    assert fake_jars == [("delta", "s3")]
    for key, value in conf.items():
        assert opts[key] == value  # every setting reaches Spark as given
    (record,) = [r for r in caplog.records if "Spark session settings" in r.getMessage()]
    logged = record.getMessage()
    for secret in ("AKIA-ACCESS-1", "SECRET-2", "TOKEN-3", "PASSWORD-4", "AZURE-5", "ENV-6",
                   "SECRET-7", "APIKEY-8", "JAAS-9", "TRUST-10", "PASSPHRASE-11"):
        assert secret not in caplog.text
    assert "'spark.hadoop.fs.s3a.secret.key': '***'" in logged
    assert "'spark.hadoop.fs.s3a.access.key': '***'" in logged
    for shown in ("'spark.hadoop.fs.s3a.endpoint': 'http://127.0.0.1:9000'",
                  "'spark.ssl.keyStoreType': 'JKS'", "'spark.ssl.keystore.type': 'PKCS12'",
                  "'spark.sql.shuffle.partitions': '2'", "'spark.jars': '/jars/a.jar,/jars/b.jar'"):
        assert shown in logged


def test_connect_server_settings_are_masked_too(
    fake_jars: list[Any], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pyspark, "__version__", "4.2.0")  # Connect: refused on 3.5 (below)
    with caplog.at_level("DEBUG", logger="connectors.spark.jars._session"):
        cs.session_builder(master="sc://localhost:15002", connect=True,
                           conf={"spark.hadoop.fs.s3a.secret.key": "SECRET-9"})
    assert "Spark session settings" in caplog.text
    assert "SECRET-9" not in caplog.text


def test_a_connect_session_on_spark_35_is_refused_where_the_client_sees_it(
    fake_jars: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sinks refuse Spark Connect on 3.5, and there a foreachBatch worker's error reaches
    only the server's log: the session helper refuses first, in the client."""
    monkeypatch.setattr(pyspark, "__version__", "3.5.3")
    for master in ("local[2]", "sc://localhost:15002"):
        with pytest.raises(ConfigurationError, match=r"Spark 4\.0 or newer under Spark "
                           r"Connect, and this is pyspark 3\.5\.3.*classic PySpark"):
            cs.session_builder(master=master, components=["delta"], connect=True)
    cs.session_builder(master="local[2]", components=["delta"])  # classic: as before
    assert fake_jars == [("delta",)]


def test_check_components_knows_the_s3a_file_system() -> None:
    loadable = {"io.delta.sql.DeltaSparkSessionExtension"}
    asked: list[str] = []

    def class_is_loadable(name: str) -> bool:
        asked.append(name)
        return name in loadable

    utils = type("Utils", (), {"classIsLoadable": staticmethod(class_is_loadable)})
    jvm = type("Jvm", (), {})()
    jvm.org = type("P", (), {"apache": type("P", (), {"spark": type("P", (), {
        "util": type("P", (), {"Utils": utils})})})})
    spark: Any = type("Spark", (), {"_jvm": jvm})()
    with pytest.raises(ConfigurationError, match="no s3 classes"):
        cs.check_components(spark, ["delta", "s3"])
    assert asked[-1] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    loadable.add("org.apache.hadoop.fs.s3a.S3AFileSystem")
    cs.check_components(spark, ["delta", "s3"])


def test_python_exec_defaults_to_this_interpreter(
    fake_jars: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON")
    cs.session_builder()
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/other/python")
    cs.session_builder()
    assert os.environ["PYSPARK_PYTHON"] == "/opt/other/python"


def test_executor_pythonpath_has_the_source_root_unless_installed(
    fake_jars: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(site, "getsitepackages", lambda: ["/nowhere/site-packages"])
    monkeypatch.setattr(site, "getusersitepackages", lambda: "/nowhere/user")
    opts = options(cs.session_builder(conf={"spark.executorEnv.PYTHONPATH": "/extra"}))
    assert opts["spark.executorEnv.PYTHONPATH"] == os.pathsep.join([str(REPO_ROOT), "/extra"])

    monkeypatch.setattr(site, "getsitepackages", lambda: [str(REPO_ROOT)])
    opts = options(cs.session_builder())
    assert "spark.executorEnv.PYTHONPATH" not in opts


# ------------------------------------------------------------------ resolve_jars


def test_unknown_component_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="Unknown Spark component 'hbase'"):
        cs.resolve_jars(["hbase"])


def test_no_components_no_jars() -> None:
    assert cs.resolve_jars([]) == []


def test_missing_mvn_names_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(ConfigurationError) as info:
        cs.resolve_jars(["kafka"], cache_dir=str(tmp_path / "c"))
    message = str(info.value)
    assert "'mvn'" in message
    assert "apt-get install maven" in message
    assert "EOS_MVN" in message
    assert f"spark-sql-kafka-0-10_{SCALA}:{SPARK}" in message


def test_bad_eos_mvn_names_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EOS_MVN", str(tmp_path / "no-such-mvn"))
    with pytest.raises(ConfigurationError, match="EOS_MVN="):
        cs.resolve_jars(["kafka"], cache_dir=str(tmp_path / "c"))


def _write_cache(root: Path, dirname: str, jars: list[str]) -> Path:
    target = root / "jars" / dirname
    target.mkdir(parents=True)
    for name in jars:
        (target / name).write_bytes(b"jar")
    (target / ".complete.json").write_text(json.dumps({"jars": jars}))
    return target


def test_stamped_cache_is_used_without_maven(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # any Maven call would fail
    target = _write_cache(tmp_path, KAFKA_DIR, ["kafka-clients-3.9.2.jar", "x-1.jar"])
    jars = cs.resolve_jars("kafka", cache_dir=str(tmp_path))
    assert jars == [str(target / "kafka-clients-3.9.2.jar"), str(target / "x-1.jar")]


def test_cache_dir_defaults_to_eos_cache_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setenv("EOS_CACHE_DIR", str(tmp_path / "env-cache"))
    target = _write_cache(tmp_path / "env-cache", KAFKA_DIR, ["k-1.jar"])
    assert cs.resolve_jars(["kafka"]) == [str(target / "k-1.jar")]


def test_incomplete_cache_is_resolved_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    target = _write_cache(tmp_path, KAFKA_DIR, ["k-1.jar"])
    (target / "k-1.jar").unlink()
    with pytest.raises(ConfigurationError, match="'mvn'"):
        cs.resolve_jars(["kafka"], cache_dir=str(tmp_path))


FAKE_MVN = r"""#!/bin/sh
# Stands in for Maven: records the call, fails like Maven for a version listed in
# $FAKE_MVN_MISSING, else "downloads" $FAKE_MVN_JARS into -DoutputDirectory.
for a in "$@"; do
  case "$a" in
    -DoutputDirectory=*) out="${a#-DoutputDirectory=}" ;;
    -f) pomnext=1; continue ;;
  esac
  if [ -n "$pomnext" ]; then pom="$a"; pomnext=; fi
done
echo call >> "$FAKE_MVN_LOG"
cp "$pom" "$FAKE_MVN_LOG.pom"
for v in $FAKE_MVN_MISSING; do
  if grep -q "<version>${v#*@}</version>" "$pom"; then
    echo "[ERROR] Failed to execute goal on project resolve: Could not resolve dependencies" \
      "for project connectors.jars:resolve:pom:0: Could not find artifact" \
      "${v%@*}:jar:${v#*@} in central (https://repo.maven.apache.org/maven2) -> [Help 1]"
    exit 1
  fi
done
sleep "${FAKE_MVN_SLEEP:-0}"
mkdir -p "$out"
for j in $FAKE_MVN_JARS; do echo jar > "$out/$j"; done
"""


@pytest.fixture
def fake_mvn(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    script = tmp_path / "bin" / "mvn"
    script.parent.mkdir()
    script.write_text(FAKE_MVN)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "mvn.log"
    monkeypatch.setenv("EOS_MVN", str(script))
    monkeypatch.setenv("FAKE_MVN_LOG", str(log))
    monkeypatch.setenv(
        "FAKE_MVN_JARS",
        f"kafka-clients-3.9.2.jar spark-sql-kafka-0-10_{SCALA}-{SPARK}.jar slf4j-api-2.0.17.jar",
    )
    monkeypatch.setenv("FAKE_MVN_MISSING", "")
    return log


def test_fetch_drops_what_pyspark_ships_and_writes_a_stamp(fake_mvn: Path, tmp_path: Path) -> None:
    jars = cs.resolve_jars(["kafka"], cache_dir=str(tmp_path / "c"))
    target = tmp_path / "c" / "jars" / KAFKA_DIR
    assert jars == [
        str(target / "kafka-clients-3.9.2.jar"),
        str(target / f"spark-sql-kafka-0-10_{SCALA}-{SPARK}.jar"),
    ]  # slf4j-api is in pyspark/jars
    stamp = json.loads((target / ".complete.json").read_text())
    assert stamp["requested"] == [f"org.apache.spark:spark-sql-kafka-0-10_{SCALA}:{SPARK}"]
    assert stamp["substituted"] == {}
    assert sorted(os.listdir(target)) == sorted([".complete.json", *map(os.path.basename, jars)])
    # The generated POM excludes pyspark's artifacts by id, with any group.
    pom = ET.parse(f"{fake_mvn}.pom").getroot()
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    excluded = {
        e.findtext("m:artifactId", namespaces=ns)
        for e in pom.iterfind(".//m:exclusion", ns)
        if e.findtext("m:groupId", namespaces=ns) == "*"
    }
    assert {"slf4j-api", "scala-library", f"spark-core_{SCALA}"} <= excluded
    # Second call: the stamp answers, Maven is not run again.
    assert cs.resolve_jars(["kafka"], cache_dir=str(tmp_path / "c")) == jars
    assert fake_mvn.read_text().count("call") == 1


@pytest.fixture
def spark_42(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plan as pyspark 4.2.0 would, whatever pyspark runs the tests (CI runs several)."""
    monkeypatch.setattr(_components, "_spark_version", lambda: "4.2.0")
    monkeypatch.setattr(_components, "_scala_binary_version", lambda jars: "2.13")


def test_an_unpublished_version_falls_back_to_the_newest_older_release(
    fake_mvn: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark_42: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("EOS_DELTA_VERSION", "4.4.1")
    monkeypatch.setenv("FAKE_MVN_MISSING", "io.delta:delta-spark_4.2_2.13@4.4.1")
    monkeypatch.setenv("FAKE_MVN_JARS", "delta-spark_4.2_2.13-4.4.0.jar delta-storage-4.4.0.jar")
    asked: list[str] = []
    _serve_metadata(monkeypatch, asked, ["4.3.1", "4.4.0", "4.4.1", "4.4.2-rc1", "4.5.0"])

    jars = cs.resolve_jars(["delta"], cache_dir=str(tmp_path / "c"))

    assert asked == [
        "https://repo1.maven.org/maven2/io/delta/delta-spark_4.2_2.13/maven-metadata.xml"
    ]
    assert [os.path.basename(j) for j in jars] == [
        "delta-spark_4.2_2.13-4.4.0.jar",
        "delta-storage-4.4.0.jar",
    ]
    target = Path(jars[0]).parent
    assert target.name == "delta-4.4.1-spark4.2.0_2.13"
    stamp = json.loads((target / ".complete.json").read_text())
    assert stamp["substituted"] == {"io.delta:delta-spark_4.2_2.13": "4.4.0"}
    assert stamp["substituted_from"] == {"io.delta:delta-spark_4.2_2.13": "4.4.1"}
    assert fake_mvn.read_text().count("call") == 2
    # The choice is printed, one line per component, the substitution named.
    assert capsys.readouterr().err.splitlines() == [
        "connectors.spark: jars for delta: io.delta:delta-spark_4.2_2.13:4.4.0; substituted "
        f"4.4.0 for 4.4.1 (2 jars in {target})"
    ]
    # ... again when the cache answers, and jar_report tells the same without Maven.
    cs.resolve_jars(["delta"], cache_dir=str(tmp_path / "c"))
    assert "substituted 4.4.0 for 4.4.1" in capsys.readouterr().err
    (choice,) = cs.jar_report(["delta"], cache_dir=str(tmp_path / "c"))
    assert choice.used == ("io.delta:delta-spark_4.2_2.13:4.4.0",)
    assert choice.requested == ("io.delta:delta-spark_4.2_2.13:4.4.1",)
    assert choice.substitutions == (("io.delta:delta-spark_4.2_2.13", "4.4.1", "4.4.0"),)
    assert fake_mvn.read_text().count("call") == 2


def test_a_delta_jar_from_another_minor_version_is_refused_naming_the_fix(
    fake_mvn: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark_42: None
) -> None:
    monkeypatch.setenv("EOS_DELTA_VERSION", "4.4.1")
    monkeypatch.setenv("FAKE_MVN_MISSING", "io.delta:delta-spark_4.2_2.13@4.4.1")
    _serve_metadata(monkeypatch, [], ["4.3.1", "4.4.1"])  # nothing older in 4.4
    with pytest.raises(ConfigurationError) as info:
        cs.resolve_jars(["delta"], cache_dir=str(tmp_path / "c"))
    message = str(info.value)
    assert "io.delta:delta-spark_4.2_2.13:4.4.1 is not in https://repo1.maven.org/maven2" in (
        message)
    assert "4.3.1, is another minor version and is refused" in message
    assert "install delta-spark 4.3.x, whose jars are published for this Spark" in message
    assert "EOS_DELTA_VERSION=4.3.1" in message
    assert "EOS_MAVEN_REPO to a repository that has io.delta:delta-spark_4.2_2.13:4.4.x" in (
        message)
    assert "Could not find artifact io.delta:delta-spark_4.2_2.13:jar:4.4.1" in message
    assert fake_mvn.read_text().count("call") == 1  # 4.3.1 was never tried
    assert not (tmp_path / "c" / "jars" / "delta-4.4.1-spark4.2.0_2.13").exists()


def test_a_transitive_delta_jar_is_pinned_to_the_minor_version_too(
    fake_mvn: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark_42: None
) -> None:
    monkeypatch.setenv("EOS_DELTA_VERSION", "4.4.1")
    monkeypatch.setenv("FAKE_MVN_MISSING", "io.delta:delta-storage@4.4.1")
    _serve_metadata(monkeypatch, [], ["4.3.0", "4.4.1"])
    with pytest.raises(ConfigurationError) as info:
        cs.resolve_jars(["delta"], cache_dir=str(tmp_path / "c"))
    assert "io.delta:delta-storage:4.4.1 is not in" in str(info.value)
    assert "4.3.0, is another minor version and is refused" in str(info.value)


def test_no_delta_jar_for_this_spark_minor_says_so(
    fake_mvn: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_components, "_spark_version", lambda: "4.3.0")
    monkeypatch.setattr(_components, "_scala_binary_version", lambda jars: "2.13")
    monkeypatch.setenv("EOS_DELTA_VERSION", "4.4.1")
    monkeypatch.setenv("FAKE_MVN_MISSING", "io.delta:delta-spark_4.3_2.13@4.4.1")

    def not_found(url: str, timeout: float = 0) -> io.BytesIO:
        raise urllib.error.HTTPError(url, 404, "Not Found", {}, None)  # type: ignore[arg-type]

    monkeypatch.setattr(urllib.request, "urlopen", not_found)
    with pytest.raises(ConfigurationError) as info:
        cs.resolve_jars(["delta"], cache_dir=str(tmp_path / "c"))
    message = str(info.value)
    assert "no io.delta:delta-spark_4.3_2.13 at all" in message
    assert "no Delta Lake release is published for Spark 4.3 (pyspark 4.3.0)" in message
    assert "leave 'delta' out of components" in message


def test_a_cached_cross_minor_delta_substitution_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spark_42: None
) -> None:
    """A cache written before the refusal existed (or by hand) is not used either."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setenv("EOS_DELTA_VERSION", "4.4.1")
    target = _write_cache(tmp_path, "delta-4.4.1-spark4.2.0_2.13",
                          ["delta-spark_4.2_2.13-4.4.0.jar", "delta-storage-4.3.0.jar"])
    stamp = json.loads((target / ".complete.json").read_text())
    stamp["substituted"] = {"io.delta:delta-spark_4.2_2.13": "4.4.0",
                            "io.delta:delta-storage": "4.3.0"}
    (target / ".complete.json").write_text(json.dumps(stamp))
    for call in (cs.resolve_jars, cs.jar_report):
        with pytest.raises(ConfigurationError) as info:
            call(["delta"], cache_dir=str(tmp_path))
        assert "io.delta:delta-storage:4.3.0" in str(info.value)
        assert "another minor version, which is refused" in str(info.value)
        assert "EOS_DELTA_VERSION=4.3.0" in str(info.value)
        assert f"delete {target} to resolve again" in str(info.value)


def test_the_jars_are_printed_at_session_start(
    fake_mvn: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    opts = options(cs.session_builder(components=["kafka"]))
    target = tmp_path / "cache" / "jars" / KAFKA_DIR  # EOS_CACHE_DIR of _clean_env
    assert opts["spark.jars"].split(",") == [
        str(target / "kafka-clients-3.9.2.jar"),
        str(target / f"spark-sql-kafka-0-10_{SCALA}-{SPARK}.jar"),
    ]
    assert capsys.readouterr().err.splitlines() == [
        f"connectors.spark: jars for kafka: org.apache.spark:spark-sql-kafka-0-10_{SCALA}:{SPARK} "
        f"(2 jars in {target})"
    ]


def test_jar_report_needs_no_maven_and_no_delta_spark(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # any Maven call would fail

    def not_installed(dist: str) -> str:
        raise importlib.metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    delta, kafka = cs.jar_report(cache_dir=str(tmp_path))
    # no delta-spark (the delta extra brings none): the Delta release for this Spark minor
    # (none known for the newest lane's Spark: the part below)
    release = _components.DELTA_FOR_SPARK.get(_components.version_tuple(SPARK)[:2])
    artifact = release and _components._delta_artifact_id(release, SPARK, SCALA)
    assert delta.used == ((f"io.delta:{artifact}:{release}",) if release else ())
    assert delta.jars is None
    # a Spark minor without a Delta release (4.3 today): said, and a session is refused
    monkeypatch.setattr(_components, "_spark_version", lambda: "4.3.0")
    delta, _ = cs.jar_report(cache_dir=str(tmp_path))
    assert delta.used == () and delta.jars is None
    assert delta.line() == (
        "delta: no jars (no Delta Lake release is known for this Spark, and neither "
        "delta-spark nor EOS_DELTA_VERSION names one: sessions with 'delta' are refused)")
    with pytest.raises(ConfigurationError, match=r"No Delta Lake release is known for Spark "
                       r"4\.3\.0 \(known: Spark 3\.5, 4\.0, 4\.1, 4\.2\)\. Set EOS_DELTA_VERSION"):
        _components.component_plan("delta", _components.pyspark_home())
    monkeypatch.setattr(_components, "_spark_version", lambda: SPARK)
    coords = f"org.apache.spark:spark-sql-kafka-0-10_{SCALA}:{SPARK}"
    assert kafka.used == (coords,) and kafka.jars is None
    assert kafka.line().startswith(f"kafka: {coords} (not resolved yet: the first session "
                                   "fetches it with Maven into ")
    _write_cache(tmp_path, KAFKA_DIR, ["k-1.jar", "k-2.jar"])
    (kafka,) = cs.jar_report("kafka", cache_dir=str(tmp_path))
    assert kafka.line() == f"kafka: {coords} (2 jars in {tmp_path / 'jars' / KAFKA_DIR})"


def test_a_transitive_substitution_is_printed_with_its_coordinates() -> None:
    choice = cs.JarChoice(
        "kafka", ("org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0",),
        ("org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0",),
        (("org.apache.spark:spark-token-provider-kafka-0-10_2.13", "4.2.0", "4.0.0"),), 5, "/c")
    assert choice.line() == (
        "kafka: org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0; substituted "
        "org.apache.spark:spark-token-provider-kafka-0-10_2.13:4.0.0 for 4.2.0 (5 jars in /c)")


def _serve_metadata(monkeypatch: pytest.MonkeyPatch, asked: list[str], versions: list[str]) -> None:
    listed = "".join(f"<version>{v}</version>" for v in versions)
    body = f"<metadata><versioning><versions>{listed}</versions></versioning></metadata>"

    def urlopen(url: str, timeout: float = 0) -> io.BytesIO:
        asked.append(url)
        return io.BytesIO(body.encode())

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)


def test_two_processes_resolving_at_once_run_maven_once(fake_mvn: Path, tmp_path: Path) -> None:
    env = dict(os.environ, FAKE_MVN_SLEEP="1", PYTHONPATH=str(REPO_ROOT))
    code = textwrap.dedent(
        f"""
        import json
        from connectors.spark import resolve_jars
        print(json.dumps(resolve_jars(["kafka"], cache_dir={str(tmp_path / "c")!r})))
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    first, second = (json.loads(o) for o in outs)
    assert first == second
    assert len(first) == 2
    assert fake_mvn.read_text().count("call") == 1


# ------------------------------------------------------------------ internals


@pytest.mark.parametrize(
    ("jar", "artifact_id"),
    [
        ("spark-core_2.13-4.2.0.jar", "spark-core_2.13"),
        ("zstd-jni-1.5.7-7.jar", "zstd-jni"),
        ("jline-3.29.0-jdk8.jar", "jline"),
        ("RoaringBitmap-1.6.10.jar", "RoaringBitmap"),
        ("hive-exec-2.3.10-core.jar", "hive-exec"),
        ("py4j-0.10.9.9.jar", "py4j"),
    ],
)
def test_artifact_id_of_jar_names(jar: str, artifact_id: str) -> None:
    assert _components.artifact_id_of(jar) == artifact_id


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (
            "Could not resolve dependencies for project connectors.jars:resolve:pom:0: "
            "Could not find artifact io.delta:delta-spark_4.2_2.13:jar:4.4.1 in central",
            "io.delta:delta-spark_4.2_2.13:4.4.1",
        ),
        (
            "Failed to collect dependencies at org.apache.spark:spark-sql-kafka-0-10_2.13:jar:"
            "4.2.0 -> org.apache.spark:spark-token-provider-kafka-0-10_2.13:jar:4.2.0: Failed "
            "to read artifact descriptor for org.apache.spark:spark-token-provider-kafka-0-10_"
            "2.13:jar:4.2.0: Could not transfer artifact org.apache.spark:spark-token-provider-"
            "kafka-0-10_2.13:pom:4.2.0 from/to gcs-maven-central-mirror",
            "org.apache.spark:spark-token-provider-kafka-0-10_2.13:4.2.0",
        ),
        (
            "Could not resolve dependencies for project connectors.jars:resolve:pom:0: "
            "io.delta:delta-spark_4.2_2.13:jar:4.4.1 was not found in "
            "https://repo.maven.apache.org/maven2 during a previous attempt.",
            "io.delta:delta-spark_4.2_2.13:4.4.1",
        ),
        (
            "Failure to find org.example:thing:jar:tests:1.2.3 in https://repo",
            "org.example:thing:1.2.3",
        ),
        ("[ERROR] No plugin found for prefix 'dependency'", None),
    ],
)
def test_missing_artifact_is_read_from_maven_output(output: str, expected: str | None) -> None:
    found = _maven._missing_artifact(output)
    assert (str(found) if found else None) == expected


def test_transitive_fallback_may_leave_the_minor_line(monkeypatch: pytest.MonkeyPatch) -> None:
    _serve_metadata(monkeypatch, [], ["3.5.4", "4.0.0", "4.1.0-preview1", "4.2.0"])
    missing = _components.Artifact(
        "org.apache.spark", "spark-token-provider-kafka-0-10_2.13", "4.2.0")
    older_release = _releases.older_release
    older = older_release(missing, "https://r", exclude={"4.2.0"}, same_minor=False)
    assert older is not None and older.version == "4.0.0"
    assert older_release(missing, "https://r", exclude={"4.2.0"}, same_minor=True) is None
    assert older_release(missing, "file:///etc", exclude=set(), same_minor=False) is None


def test_pom_substitutes_a_transitive_artifact_as_a_direct_dependency() -> None:
    root = _components.Artifact("org.apache.spark", "spark-sql-kafka-0-10_2.13", "4.2.0")
    pom = _maven._render_pom(
        (root,),
        {("org.apache.spark", "spark-token-provider-kafka-0-10_2.13"): "4.0.0"},
        frozenset({"slf4j-api"}),
        "https://mirror.example/maven2",
    )
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    doc = ET.fromstring(pom)
    deps = doc.findall("m:dependencies/m:dependency", ns)
    coords = [
        ":".join(
            d.findtext(f"m:{t}", namespaces=ns) or "" for t in ("groupId", "artifactId", "version")
        )
        for d in deps
    ]
    assert coords == [
        "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0",
        "org.apache.spark:spark-token-provider-kafka-0-10_2.13:4.0.0",
    ]
    first_exclusions = {
        (e.findtext("m:groupId", namespaces=ns), e.findtext("m:artifactId", namespaces=ns))
        for e in deps[0].iterfind(".//m:exclusion", ns)
    }
    assert first_exclusions == {
        ("*", "slf4j-api"),
        ("org.apache.spark", "spark-token-provider-kafka-0-10_2.13"),
    }
    assert doc.findtext("m:repositories/m:repository/m:url", namespaces=ns) == (
        "https://mirror.example/maven2"
    )


def test_delta_artifact_names_follow_delta_pip_utils() -> None:
    assert _components._delta_artifact_id("4.4.1", "4.2.0", "2.13") == "delta-spark_4.2_2.13"
    assert _components._delta_artifact_id("4.0.0", "4.0.1", "2.13") == "delta-spark_2.13"
    assert _components._delta_artifact_id("3.3.2", "3.5.4", "2.12") == "delta-spark_2.12"


# ------------------------------------------------------------------ "s3"

#: The Hadoop version the installed pyspark ships, read here independently of the helper.
(HADOOP,) = {
    n[len("hadoop-client-api-"):-len(".jar")]
    for n in os.listdir(Path(pyspark.__file__).parent / "jars")
    if n.startswith("hadoop-client-api-")
}
S3_DIR = f"s3-{HADOOP}-spark{SPARK}"


def _spark_home_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jars: list[str]) -> Path:
    """A SPARK_HOME whose ``jars/`` holds (empty) files of these names."""
    home = tmp_path / "spark-home"
    (home / "jars").mkdir(parents=True)
    for name in jars:
        (home / "jars" / name).write_bytes(b"jar")
    monkeypatch.setenv("SPARK_HOME", str(home))
    return home


def test_s3_plan_is_hadoop_aws_of_pysparks_own_hadoop_version() -> None:
    plan = _components.component_plan("s3", _components.pyspark_home())
    if SPARK == "4.2.0":
        assert HADOOP == "3.5.0"
    assert tuple(map(str, plan.roots)) == (f"org.apache.hadoop:hadoop-aws:{HADOOP}",)
    assert plan.dirname == S3_DIR
    assert plan.pinned_group == "org.apache.hadoop" and plan.pinned_exact
    assert plan.excluded == (("org.apache.hadoop", "*"),)  # pyspark's hadoop-client-* serve


def test_s3_plan_follows_the_hadoop_jar_of_spark_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pyspark 4.0.1 ships Hadoop 3.4.1 (spark-parent_2.13 4.0.1's hadoop.version)
    home = _spark_home_with(tmp_path, monkeypatch, [
        "hadoop-client-api-3.4.1.jar", "hadoop-client-runtime-3.4.1.jar",
        "scala-library-2.13.16.jar"])
    monkeypatch.setattr(_components, "_spark_version", lambda: "4.0.1")
    plan = _components.component_plan("s3", home)
    assert tuple(map(str, plan.roots)) == ("org.apache.hadoop:hadoop-aws:3.4.1",)
    assert plan.dirname == "s3-3.4.1-spark4.0.1"


@pytest.mark.parametrize(
    ("jars", "says"),
    [
        (["spark-core_2.13-4.2.0.jar"], "has no hadoop-client-api-<version>.jar"),
        (["hadoop-client-api-3.4.1.jar", "hadoop-client-api-3.5.0.jar"],
         "has several (hadoop-client-api-3.4.1.jar, hadoop-client-api-3.5.0.jar)"),
    ],
)
def test_an_unknown_hadoop_version_is_a_configuration_error_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jars: list[str], says: str
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no Maven is needed to refuse
    home = _spark_home_with(tmp_path, monkeypatch, jars)
    for call in (cs.resolve_jars, cs.jar_report):
        with pytest.raises(ConfigurationError) as info:
            call(["s3"], cache_dir=str(tmp_path / "c"))
        message = str(info.value)
        assert f"{home / 'jars'} {says}, so that version is unknown" in message
        assert "must be exactly the Hadoop version Spark ships" in message
        assert "unset SPARK_HOME" in message and "leave 's3' out of components" in message


def test_s3_fetch_takes_hadoop_aws_and_the_sdk_but_no_hadoop_jar_again(
    fake_mvn: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("FAKE_MVN_JARS", f"hadoop-aws-{HADOOP}.jar bundle-2.35.4.jar "
                       f"hadoop-client-runtime-{HADOOP}.jar wildfly-openssl-2.2.5.Final.jar")
    jars = cs.resolve_jars("s3", cache_dir=str(tmp_path / "c"))
    target = tmp_path / "c" / "jars" / S3_DIR
    assert jars == [str(target / n) for n in (
        "bundle-2.35.4.jar", f"hadoop-aws-{HADOOP}.jar", "wildfly-openssl-2.2.5.Final.jar")]
    assert capsys.readouterr().err.splitlines() == [
        f"connectors.spark: jars for s3: org.apache.hadoop:hadoop-aws:{HADOOP} "
        f"(3 jars in {target})"]
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    (dep,) = ET.parse(f"{fake_mvn}.pom").getroot().findall("m:dependencies/m:dependency", ns)
    assert [dep.findtext(f"m:{t}", namespaces=ns) for t in ("groupId", "artifactId", "version")] \
        == ["org.apache.hadoop", "hadoop-aws", HADOOP]
    excluded = {(e.findtext("m:groupId", namespaces=ns), e.findtext("m:artifactId", namespaces=ns))
                for e in dep.iterfind(".//m:exclusion", ns)}
    # every other Hadoop artifact (hadoop-common & co), and what pyspark ships, by id
    assert {("org.apache.hadoop", "*"), ("*", "hadoop-client-api"),
            ("*", "hadoop-client-runtime")} <= excluded


def test_an_unpublished_hadoop_aws_is_refused_not_substituted(
    fake_mvn: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MVN_MISSING", f"org.apache.hadoop:hadoop-aws@{HADOOP}")
    asked: list[str] = []
    _serve_metadata(monkeypatch, asked, ["3.4.1", "3.4.2", HADOOP])
    with pytest.raises(ConfigurationError) as info:
        cs.resolve_jars(["s3"], cache_dir=str(tmp_path / "c"))
    message = str(info.value)
    assert (f"org.apache.hadoop:hadoop-aws:{HADOOP} is not in https://repo1.maven.org/maven2; "
            f"org.apache.hadoop artifacts must be exactly the version pyspark ships ({HADOOP}"
            in message)
    assert "another release is refused" in message
    assert f"EOS_MAVEN_REPO to a repository that has org.apache.hadoop:hadoop-aws:{HADOOP}" in (
        message)
    assert f"Could not find artifact org.apache.hadoop:hadoop-aws:jar:{HADOOP}" in message
    assert asked == []  # no older release was even looked for
    assert fake_mvn.read_text().count("call") == 1
    assert not (tmp_path / "c" / "jars" / S3_DIR).exists()


def test_a_transitive_hadoop_jar_is_pinned_exactly_too(
    fake_mvn: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MVN_MISSING", f"org.apache.hadoop:hadoop-annotations@{HADOOP}")
    _serve_metadata(monkeypatch, [], ["3.4.1", HADOOP])
    with pytest.raises(ConfigurationError, match="another release is refused"):
        cs.resolve_jars(["s3"], cache_dir=str(tmp_path / "c"))


def test_a_cached_hadoop_substitution_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    target = _write_cache(tmp_path, S3_DIR, ["hadoop-aws-3.4.1.jar", "bundle-2.35.4.jar"])
    stamp = json.loads((target / ".complete.json").read_text())
    stamp["substituted"] = {"org.apache.hadoop:hadoop-aws": "3.4.1"}
    (target / ".complete.json").write_text(json.dumps(stamp))
    for call in (cs.resolve_jars, cs.jar_report):
        with pytest.raises(ConfigurationError) as info:
            call(["s3"], cache_dir=str(tmp_path))
        assert f"use org.apache.hadoop:hadoop-aws:3.4.1 for org.apache.hadoop:hadoop-aws:{HADOOP}"\
            in str(info.value)
        assert f"Delete {target} to resolve again" in str(info.value)


def test_jar_report_says_s3_is_fetched_only_when_asked_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    assert [c.component for c in cs.jar_report(cache_dir=str(tmp_path))] == ["delta", "kafka"]
    (s3,) = cs.jar_report(["s3"], cache_dir=str(tmp_path))
    assert s3.line() == (
        f"s3: org.apache.hadoop:hadoop-aws:{HADOOP} (not resolved yet: the first session with "
        f"'s3' in components fetches it with Maven into {tmp_path / 'jars' / S3_DIR})")

