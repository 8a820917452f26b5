"""The README's main job (``connectors demo``) works into each target, and Spark keeps
refusing what breaks exactly-once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from pyspark.sql import SparkSession

from examples.fs_sink import FileSystemSink
from integration.support._driver import run_cli, run_driver

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def demo(tmp_path: Path, *extra: str) -> dict[str, Any]:
    """Run the README's main job (``connectors demo``); return its JSON verdict."""
    run = run_driver(
        ["demo", "--workdir", str(tmp_path / "demo"), "--files", "4", "--rows-per-file", "500",
         "--crash-batch", "1", "--json", *extra],
        module="connectors",
    )
    lines = [ln for ln in run.output.splitlines() if ln.startswith("{")]
    assert run.returncode == 0 and lines, run.tail()
    verdict: dict[str, Any] = json.loads(lines[-1])
    assert verdict["verdict"] == "EXACTLY ONCE", verdict
    assert verdict["driver SIGKILLed"] is True and verdict["restarts"] == 1
    assert verdict["rows in"] == verdict["rows out"] == 2000
    assert verdict["duplicates"] == 0 and verdict["missing"] == 0 and verdict["batches"] == 4
    return verdict


def cli(*args: str) -> tuple[int, Any]:
    code, data, err = run_cli(*args)
    assert not isinstance(data, str) or code != 0, err
    return code, data


def test_demo_into_delta_by_default_then_status_and_doctor(tmp_path: Path) -> None:
    verdict = demo(tmp_path)
    assert verdict["sink"] == "delta"
    table, sid = verdict["target"], verdict["sink id"]
    code, (status,) = cli("status", "--delta", table)
    assert code == 0 and status["sink_id"] == sid and status["last_committed"] == 3
    code, findings = cli("doctor", "--delta", table, "--sink-id", sid, "--checkpoint",
                         str(Path(verdict["work dir"]) / "checkpoint"))
    assert code == 0 and all(f["ok"] for f in findings), findings


def test_demo_into_postgres(tmp_path: Path, postgres_conninfo: str) -> None:
    verdict = demo(tmp_path, "--sink", "postgres", "--conninfo", postgres_conninfo)
    code, (status,) = cli("status", "--postgres", postgres_conninfo,
                          "--sink-id", verdict["sink id"])
    assert code == 0 and status["last_committed"] == 3 and status["lingering"] == []
    with psycopg.connect(postgres_conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE {}").format(
            sql.Identifier(*verdict["target"].split("."))))


def test_async_progress_tracking_stays_refused_with_foreach_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    """asyncProgressTrackingEnabled commits offsets before the sink is done: exactly-once
    is lost. Spark refuses it for foreachBatch; this test fails if that ever changes."""
    sink = FileSystemSink(tmp_path / "out", sink_id="async")
    df = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 10).load()
    with pytest.raises(Exception) as info:
        query = (
            df.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .option("asyncProgressTrackingEnabled", "true")
            .start()
        )
        try:
            query.processAllAvailable()
        finally:
            query.stop()
    assert "async" in str(info.value).lower() or "foreachbatch" in str(info.value).lower()
    assert not (tmp_path / "out" / "data").exists(), "the sink wrote despite the refusal"


def test_demo_into_kafka(tmp_path: Path, kafka_bootstrap: str) -> None:
    verdict = demo(tmp_path, "--sink", "kafka", "--bootstrap", kafka_bootstrap)
    code, (status,) = cli("status", "--kafka", kafka_bootstrap, "--sink-id", verdict["sink id"],
                          "--kafka-topic", verdict["target"])
    assert code == 0 and status["last_committed"] == 3 and status["lingering"] == []
