"""The README's demo command works, and Spark keeps refusing what breaks exactly-once."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from examples.fs_sink import FileSystemSink
from integration._driver import run_driver

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_demo_kills_its_driver_and_reports_exactly_once(tmp_path: Path):
    run = run_driver(
        ["--workdir", str(tmp_path), "--files", "5", "--rows-per-file", "500",
         "--crash-batch", "2"],
        module="examples.demo",
    )
    assert run.returncode == 0, run.tail()
    assert "verdict        EXACTLY ONCE" in run.output
    assert "driver killed  yes (SIGKILL)" in run.output
    assert "duplicates     0" in run.output and "missing        0" in run.output


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
