"""benchmarks/iceberg_bench.py on a Spark without an Iceberg runtime (the test lane's 4.2):
it exits with status 2 and the resolver's reason before starting Spark, not a traceback."""

from __future__ import annotations

import pyspark
import pytest

from benchmarks import iceberg_bench


@pytest.mark.parametrize("version", ["4.2.0", "3.4.1"])
def test_a_spark_without_an_iceberg_runtime_is_refused_by_name(
    version: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(pyspark, "__version__", version)
    monkeypatch.delenv("EOS_ICEBERG_VERSION", raising=False)
    assert iceberg_bench.main(["--smoke"]) == 2
    err = capsys.readouterr().err
    minor = ".".join(version.split(".")[:2])
    assert f"iceberg_bench cannot run on this Spark: pyspark {version}" in err
    assert f"Apache Iceberg publishes no Spark runtime for Spark {minor}" in err
    assert "Traceback" not in err
