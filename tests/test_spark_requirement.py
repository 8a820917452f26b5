"""pyspark is the user's (docs/design/spark-versions.md): no extra but ``spark`` (and Spark
Connect's ``connect``) installs it, and where the package meets Spark one guard checks it
(``connectors.spark._require``); Delta's Python API may come from Delta's jar. The ``spark``
extra stops below the first Spark minor without a Delta release, so ``[spark,delta]`` never
resolves to a pyspark Delta cannot run on."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from connectors.core.errors import DependencyError
from connectors.spark import _pyapi, _require
from connectors.spark.jars import _submit
from connectors.spark.jars._components import DELTA_FOR_SPARK, version_tuple

try:
    import tomllib
except ImportError:  # Python 3.10: pytest's own dependency tomli is the same parser
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
EXTRAS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


@pytest.fixture(autouse=True)
def fresh_guard() -> Iterator[None]:
    _require.require_spark.cache_clear()
    yield
    _require.require_spark.cache_clear()


def test_only_the_spark_extras_bring_pyspark_and_they_declare_the_guards_range() -> None:
    assert not [d for d in EXTRAS["dependencies"] if d.lower().startswith("pyspark")]
    extras = EXTRAS["optional-dependencies"]
    # the spark extra: from the guard's floor to the first Spark minor without a Delta release
    minors = sorted(DELTA_FOR_SPARK)
    first_without = (minors[-1][0], minors[-1][1] + 1)
    assert first_without not in DELTA_FOR_SPARK
    assert extras["spark"] == [
        f"pyspark>={_require.SPARK_FLOOR},<{first_without[0]}.{first_without[1]}"]
    assert minors[0] == version_tuple(_require.SPARK_FLOOR)[:2]
    assert (3, 5) in DELTA_FOR_SPARK
    assert all((4, m) in DELTA_FOR_SPARK for m in range(0, first_without[1]))
    assert extras["connect"][0].startswith(f"pyspark[connect]{_require.SPARK_RANGE}")
    for name, deps in extras.items():
        if name in ("spark", "connect", "dev"):
            continue
        # delta-spark requires a pyspark of its own choosing: no extra a user names has it
        assert not [d for d in deps if re.match(r"(pyspark|delta[-_]spark)\b", d)], name
        assert not [d for d in deps if "[" in d and "spark" in d.split("[", 1)[1]], name


def test_the_installed_pyspark_passes() -> None:
    assert _require.require_spark("X") == pyspark.__version__


@pytest.mark.parametrize(("version", "ok"), [
    ("3.5.3", True), ("3.5.9", True), ("4.0.0", True), ("4.1.0.dev1", True), ("4.3.0", True),
    ("4.99.9", True), ("3.5.2", False), ("3.4.4", False), ("5.0.0", False),
    ("5.0.0.dev0", False),
])
def test_the_range_is_checked_on_the_modules_version(
    monkeypatch: pytest.MonkeyPatch, version: str, ok: bool
) -> None:
    monkeypatch.setattr(pyspark, "__version__", version)
    monkeypatch.setattr(_require, "_python", lambda: (3, 11))  # 3.5 runs there (below)
    if ok:
        assert _require.require_spark("KafkaSink") == version
        return
    with pytest.raises(DependencyError) as err:
        _require.require_spark("KafkaSink")
    message = str(err.value)
    assert message.startswith(f"KafkaSink needs PySpark >=3.5.3,<5, and the pyspark imported "
                              f"here is {version} (from ")
    assert "pip install 'spark-exactly-once[spark]'" in message
    assert "where your platform provides Spark" in message


def test_spark_35_on_python_312_is_refused_naming_both(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """pyspark 3.5 imports distutils (gone in Python 3.12) and lists Python 3.11 at most."""
    monkeypatch.setattr(pyspark, "__version__", "3.5.3")
    monkeypatch.setattr(_require, "_python", lambda: (3, 12))
    with pytest.raises(DependencyError, match=r"^KafkaSink: pyspark 3\.5\.3 runs on Python "
                       r"3\.11 at most .* this is Python 3\.12\. Use Python 3\.10 or 3\.11"):
        _require.require_spark("KafkaSink")
    _require.require_spark.cache_clear()
    monkeypatch.setattr(pyspark, "__version__", "4.0.1")
    assert _require.require_spark("KafkaSink") == "4.0.1"


def test_a_pyspark_out_of_range_refuses_the_spark_sinks_and_names(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from connectors import DeltaSink, KafkaSink
    from connectors.kafka import admin

    monkeypatch.setattr(pyspark, "__version__", "3.5.2")
    with pytest.raises(DependencyError, match=r"^KafkaSink needs PySpark >=3\.5\.3,<5.* 3\.5\.2"):
        KafkaSink("t", {"bootstrap.servers": "localhost:1"}, sink_id="k")
    with pytest.raises(DependencyError, match=r"^DeltaSink needs PySpark >=3\.5\.3,<5.* 3\.5\.2"):
        DeltaSink(str(tmp_path / "t"), sink_id="d")
    import connectors.spark as cs

    with pytest.raises(DependencyError, match=r"^connectors\.spark\.submit_args needs PySpark"):
        cs.__getattr__("submit_args")
    # what `connectors recover` builds to fence a KafkaSink's slots runs no batch: no guard
    settling = admin._SettlingSink(None, {"bootstrap.servers": "localhost:1"}, sink_id="k")
    settling.close()


def test_without_pyspark_the_sinks_and_names_refuse_clearly_and_the_rest_imports() -> None:
    code = (
        "import sys; sys.modules['pyspark'] = None\n"
        "import connectors, connectors.spark, connectors.spark.toolkit, connectors.cli\n"
        "from connectors import DeltaSink, KafkaSink, PostgresSink\n"
        "from connectors.core.errors import DependencyError\n"
        "for build in (lambda: KafkaSink('t', {'bootstrap.servers': 'x:1'}, sink_id='k'),\n"
        "              lambda: DeltaSink('/tmp/t', sink_id='d'),\n"
        "              lambda: connectors.spark.get_session,\n"
        "              lambda: connectors.register):\n"
        "    try:\n"
        "        build()\n"
        "        print('BUILT')\n"
        "    except DependencyError as exc:\n"
        "        print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120, cwd=REPO).stdout.splitlines()
    assert [ln.split(" needs ")[0] for ln in out] == [
        "KafkaSink", "DeltaSink", "connectors.spark.get_session", "connectors.spark.register"]
    for line in out:
        assert "needs PySpark >=3.5.3,<5, and no pyspark module can be imported here" in line
        assert "pip install 'spark-exactly-once[spark]'" in line


def _delta_jar(tmp_path: Path, name: str = "delta-spark_4.2_2.13-4.4.0.jar") -> Path:
    jar = tmp_path / name
    with zipfile.ZipFile(jar, "w") as z:
        z.writestr("delta/__init__.py", "FROM_JAR = True\n")
        z.writestr("delta/tables.py", "class DeltaTable: pass\n")
        z.writestr("io/delta/Some.class", b"\xca\xfe")
    return jar


@pytest.mark.parametrize("name", ["delta-spark_4.2_2.13-4.4.0.jar", "delta-spark_2.12-3.3.3.jar",
                                  "delta-spark_2.13-4.0.0.jar"])
def test_delta_jars_are_told_from_the_others(name: str) -> None:
    assert _pyapi.is_delta_spark_jar(f"/cache/delta-4.4.0/{name}")
    assert not _pyapi.is_delta_spark_jar("/cache/delta-4.4.0/delta-storage-4.4.0.jar")
    assert not _pyapi.is_delta_spark_jar("/cache/k/spark-sql-kafka-0-10_2.13-4.2.0.jar")


def test_without_delta_spark_the_jar_serves_deltas_python_api(tmp_path: Path) -> None:
    jar = _delta_jar(tmp_path)
    other = tmp_path / "delta-storage-4.4.0.jar"
    other.write_bytes(b"")
    # An environment without delta-spark: site-packages as links, but its `delta` package.
    deps = tmp_path / "deps"
    deps.mkdir()
    for site in (p for p in sys.path if p.endswith("site-packages")):
        for entry in Path(site).iterdir():
            if entry.name != "delta" and not (deps / entry.name).exists():
                (deps / entry.name).symlink_to(entry)
    code = (
        "import importlib.util, sys\n"
        "from connectors.spark import _pyapi\n"
        "assert importlib.util.find_spec('delta') is None\n"
        f"print(_pyapi.delta_python_from_jars([{str(other)!r}, {str(jar)!r}]))\n"
        "import delta, delta.tables\n"
        "print(delta.FROM_JAR, delta.__file__)\n"
        f"print(_pyapi.delta_python_from_jars([{str(jar)!r}]))  # importable now: nothing\n"
        f"print(sys.path.count({str(jar)!r}))\n"
    )
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": f"{REPO}:{deps}"}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [str(jar), f"True {jar}/delta/__init__.py", "None", "1"]


def test_submit_args_with_jars_ship_deltas_python_api_as_py_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    jar = str(_delta_jar(tmp_path))
    storage = str(tmp_path / "delta-storage-4.4.0.jar")
    monkeypatch.setattr(_submit, "resolve_jars", lambda names, cache_dir=None: [jar, storage])
    args = _submit.submit_args(["delta"], packages=False)
    assert args[:4] == ["--jars", f"{jar},{storage}", "--py-files", jar]
