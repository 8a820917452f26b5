"""The ``"s3"`` component against a real S3 API: Delta on ``s3a://``, read back by delta-rs.

The S3 service is the shared ``s3_service`` fixture (``integration/support/_fixtures_services.py``;
under ``CI=true`` a missing one fails the test). The in-process ``spark`` session of the
integration tests has the ``s3`` jars (hadoop-aws and the AWS SDK bundle: the first run
fetches 650 MB and more with Maven) and the service's ``spark.hadoop.fs.s3a.*`` confs, so
the round trip runs in it; the settings log's masking of the keys is checked on the
builder that logs it (``session_builder``, which starts no session).
"""

from __future__ import annotations

import logging

import pytest
from pyspark.sql import SparkSession

from connectors.spark import session_builder
from integration.delta._delta_s3 import S3Tables
from integration.support._fixtures_services import S3Service

pytestmark = pytest.mark.integration


def test_delta_on_s3a_round_trip_read_back_by_delta_rs(
    spark: SparkSession, s3_service: S3Service, capfd: pytest.CaptureFixture[str]
) -> None:
    endpoint = spark.conf.get("spark.hadoop.fs.s3a.endpoint", None)
    assert endpoint == s3_service.endpoint, (
        f"the shared session's s3a endpoint is {endpoint!r}, the S3 service's "
        f"{s3_service.endpoint!r}: export .services.env's EOS_S3_* before pytest")
    path = f"{s3_service.prefix('s3a-round-trip')}/t"
    spark.range(0, 5).write.format("delta").save(path)
    spark.range(5, 8).write.format("delta").mode("append").save(path)
    spark.range(8, 12).write.format("delta").mode("append").save(path)
    rows = spark.read.format("delta").load(path).orderBy("id").collect()
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()

    assert [r.id for r in rows] == list(range(12))
    assert [(h.version, h.operation) for h in history] == [
        (0, "WRITE"), (1, "WRITE"), (2, "WRITE")]
    # delta-rs reads the same table through its own S3 client: the log Spark wrote is whole.
    tables = S3Tables(s3_service)
    assert tables.table(path).version() == 2
    assert tables.rows(path, ["id"]) == [(i,) for i in range(12)]
    assert tables.operations(path) == ["WRITE"] * 3
    # Nothing the JVM or Python printed during the test holds the secret.
    out, err = capfd.readouterr()
    assert s3_service.secret_key not in out + err


def test_s3a_settings_are_logged_with_the_keys_masked(
    s3_service: S3Service, caplog: pytest.LogCaptureFixture
) -> None:
    """A session's settings (``session_builder``/``get_session`` log them at DEBUG) with
    the S3 service's confs, as a user passes them: the keys appear as ``***``, the other
    s3a settings as given."""
    with caplog.at_level(logging.DEBUG, logger="connectors.spark.jars._session"):
        session_builder("s3a-test", components=["delta", "s3"], conf=s3_service.hadoop_confs())
    logged = "\n".join(r.getMessage() for r in caplog.records
                       if r.getMessage().startswith("Spark session settings"))
    assert "'spark.hadoop.fs.s3a.secret.key': '***'" in logged
    assert "'spark.hadoop.fs.s3a.access.key': '***'" in logged
    assert f"'spark.hadoop.fs.s3a.endpoint': '{s3_service.endpoint}'" in logged
    assert s3_service.secret_key not in caplog.text
