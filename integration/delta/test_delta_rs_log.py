"""delta-rs (DeltaRsLog, what the operator CLI and a Spark Connect sink read) against
Delta's own JVM snapshot, on tables Spark wrote with checkpoints: classic, multi-part and
V2 (JSON and Parquet), and with the transaction ids expired by the retention."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from connectors.delta._log import jvm_log_state
from connectors.delta._rs_log import DeltaRsLog

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.integration]
pytest.importorskip("deltalake")

CASES = {
    "classic": ("", {}),
    "multipart": ("", {"spark.databricks.delta.checkpoint.partSize": "1"}),
    "v2json": (", 'delta.checkpointPolicy'='v2'", {}),
    "v2parquet": (", 'delta.checkpointPolicy'='v2'",
                  {"spark.databricks.delta.checkpointV2.topLevelFileFormat": "parquet"}),
    "expired": (", 'delta.setTransactionRetentionDuration'='interval 1 milliseconds'", {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_delta_rs_reads_what_delta_reads(spark: SparkSession, tmp_path: Path,
                                         case: str) -> None:
    props, confs = CASES[case]
    path = str(tmp_path / case)
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT) USING delta "
              f"TBLPROPERTIES ('delta.checkpointInterval'='2'{props})")
    try:
        for key, value in confs.items():
            spark.conf.set(key, value)
        for b in range(5):
            tag = json.dumps({"connectors": {"v": 1, "sink": "s", "app": "s", "batch": b}})
            spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", tag)
            spark.range(b, b + 1).write.format("delta").mode("append").option(
                "txnAppId", "s").option("txnVersion", b).save(path)
    finally:
        for key in [*confs, "spark.databricks.delta.commitInfo.userMetadata"]:
            spark.conf.unset(key)
    names = [p.name for p in (tmp_path / case / "_delta_log").iterdir()]
    assert any(".checkpoint." in n for n in names), names
    for name in names:  # the log clean-up: commits before the newest checkpoint go
        if name.endswith(".json") and name[:20].isdigit() and int(name[:20]) < 4:
            (tmp_path / case / "_delta_log" / name).unlink()
    jvm = jvm_log_state(spark, path, ["s"])
    rs = DeltaRsLog(path).read(["s"])
    assert (rs.exists, rs.table_version, rs.versions) == (
        jvm.exists, jvm.table_version, jvm.versions)
    assert rs.versions == ({} if case == "expired" else {"s": 4})
    tags = [json.loads(i["userMetadata"])["connectors"]["batch"]
            for _, i in DeltaRsLog(path).commit_infos() if i.get("userMetadata")]
    assert tags == [3, 4]
