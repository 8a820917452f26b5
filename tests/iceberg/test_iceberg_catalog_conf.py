"""The Iceberg example's catalogs without a JVM: the confs of a Hadoop, JDBC and REST catalog,
the JDBC password kept off the builder (PySpark passes a builder's confs to the JVM on its
command line) and set on the running session, and PostgreSQL's JDBC driver as the
``postgres-jdbc`` jar component. ``integration/iceberg/test_iceberg_catalogs.py`` runs them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import connectors.spark as cs
from connectors.spark.jars import _components, _session
from examples import stream_to_iceberg as example

PREFIX = "spark.sql.catalog.lake"


def test_hadoop_jdbc_and_rest_catalog_confs() -> None:
    assert example.catalog_conf("/wh") == {
        PREFIX: "org.apache.iceberg.spark.SparkCatalog", f"{PREFIX}.warehouse": "/wh",
        f"{PREFIX}.type": "hadoop"}
    jdbc = example.catalog_conf("/wh", jdbc_uri="jdbc:postgresql://h:5432/db", jdbc_user="u")
    assert jdbc[f"{PREFIX}.type"] == "jdbc" and jdbc[f"{PREFIX}.uri"].endswith("/db")
    assert jdbc[f"{PREFIX}.jdbc.user"] == "u"
    assert jdbc[f"{PREFIX}.jdbc.schema-version"] == "V1"
    rest = example.catalog_conf("/wh", rest_uri="http://127.0.0.1:8181")
    assert rest[f"{PREFIX}.type"] == "rest" and rest[f"{PREFIX}.uri"] == "http://127.0.0.1:8181"


def test_the_jdbc_password_is_a_secret_of_the_running_session_never_a_builder_conf(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ICEBERG_JDBC_PASSWORD", "pw-from-env")
    uri = "jdbc:postgresql://h:5432/db"
    assert not any("password" in k for k in example.catalog_conf("/wh", jdbc_uri=uri))
    assert example.catalog_secrets(jdbc_uri=uri) == {f"{PREFIX}.jdbc.password": "pw-from-env"}
    assert example.catalog_secrets() == {}, "no JDBC catalog, no secret"
    monkeypatch.delenv("ICEBERG_JDBC_PASSWORD")
    assert example.catalog_secrets(jdbc_uri=uri) == {}


class _Builder:
    def __init__(self, calls: list[dict[str, Any]], **kwargs: Any) -> None:
        calls.append(kwargs)
        self.set: dict[str, str] = {}

    def getOrCreate(self) -> Any:
        builder = self

        class Conf:
            def set(self, key: str, value: str) -> None:
                builder.set[key] = value

        class Spark:
            conf = Conf()
            set = builder.set

        return Spark()


@pytest.mark.parametrize(("uri", "warehouse", "components"), [
    ("", "/wh", ["iceberg"]),
    ("", "s3a://b/wh", ["iceberg", "s3"]),
    ("jdbc:postgresql://h:5432/db", "/wh", ["iceberg", "postgres-jdbc"]),
    ("jdbc:postgresql://h:5432/db", "s3a://b/wh", ["iceberg", "s3", "postgres-jdbc"]),
    ("jdbc:sqlite:/tmp/c.db", "/wh", ["iceberg"]),  # another database's driver is yours
])
def test_build_session_adds_the_postgresql_driver_for_a_postgresql_jdbc_catalog(
        monkeypatch: pytest.MonkeyPatch, uri: str, warehouse: str,
        components: list[str]) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(cs, "session_builder",
                        lambda *a, **kw: _Builder(calls, **kw), raising=False)
    monkeypatch.setenv("ICEBERG_JDBC_PASSWORD", "pw-from-env")
    catalog = example.catalog_conf(warehouse, jdbc_uri=uri, jdbc_user="u")
    spark = example.build_session("local[1]", [], catalog,
                                  s3=warehouse.startswith("s3a://"),
                                  secrets=example.catalog_secrets(jdbc_uri=uri))
    (call,) = calls
    assert call["components"] == components
    assert not any("password" in k or "pw-from-env" in v for k, v in call["conf"].items())
    assert spark.set == ({f"{PREFIX}.jdbc.password": "pw-from-env"} if uri else {})


def test_postgres_jdbc_component_is_the_driver_jar_at_a_pinned_release(
        tmp_path: Path) -> None:
    assert "postgres-jdbc" in cs.COMPONENTS and "postgres-jdbc" not in cs.DEFAULT_COMPONENTS
    plan = _components.component_plan("postgres-jdbc", _components.pyspark_home())
    version = _components.POSTGRES_JDBC_VERSION
    assert tuple(map(str, plan.roots)) == (f"org.postgresql:postgresql:{version}",)
    assert plan.dirname == f"postgres-jdbc-{version}"  # the same whatever the Spark
    assert plan.pinned_group == "org.postgresql" and plan.pinned_exact
    assert _components.component_settings(("postgres-jdbc",)) == {}, "a jar, no setting"
    assert _session._MARKER_CLASSES["postgres-jdbc"] == "org.postgresql.Driver"
    (choice,) = cs.jar_report(["postgres-jdbc"], cache_dir=str(tmp_path))
    assert "not resolved yet" in choice.line()
    assert f"org.postgresql:postgresql:{version}" in choice.line()
