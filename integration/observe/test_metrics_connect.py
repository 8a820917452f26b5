"""Metrics under Spark Connect (issue 40, item 1): the sink runs in the foreachBatch worker
next to the Connect server, not in the client. The client registers a Prometheus exporter
(a textfile) before starting the query; the exporter travels with the pickled sink and the
worker starts it on its first batch, so the file holds the worker's figures: every row of
the PostgreSQL table counted once, every batch counted, the last committed batch id."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from integration.connect._connect_server import connect_server
from integration.support._pg import PgTarget

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = (4, 9, 6)  # rows of the files, one file a batch

CLIENT = """
import sys
import connectors
from connectors.postgres import PostgresSink
from pyspark.sql import SparkSession

url, conninfo, table, ledger, sink_id, source, ckpt, textfile = sys.argv[1:]
spark = SparkSession.builder.remote(url).getOrCreate()
# Registered in the client, before the query starts: it travels with the sink.
connectors.export_metrics(connectors.PrometheusMetrics(port=None, textfile=textfile))
sink = PostgresSink(conninfo, table, sink_id=sink_id, ledger_table=ledger,
                    query_name="metered")
df = spark.readStream.schema("id LONG, name STRING").option("maxFilesPerTrigger", 1).json(source)
query = (df.writeStream.foreachBatch(sink).queryName("metered")
         .option("checkpointLocation", ckpt).trigger(availableNow=True).start())
query.awaitTermination()
print("client done")
"""


def test_exporters_travel_to_the_connect_worker_and_count_its_batches(
    postgres_conninfo: str, tmp_path: Path,
) -> None:
    pg = PgTarget(postgres_conninfo, prefix="eos_metrics_c")
    pg.create_table("id bigint NOT NULL, name text")
    source = tmp_path / "in"
    source.mkdir()
    for n, rows in enumerate(ROWS):
        lines = [json.dumps({"id": 1000 * n + i, "name": f"n{i}"}) for i in range(rows)]
        (source / f"part-{n:03d}.json").write_text("\n".join(lines) + "\n")
    textfile = tmp_path / "connectors.prom"
    (tmp_path / "client.py").write_text(CLIENT)
    try:
        with connect_server(tmp_path / "server") as server:
            run = subprocess.run(
                [sys.executable, str(tmp_path / "client.py"), server.url, postgres_conninfo,
                 pg.table, pg.ledger, pg.sink_id, str(source), str(tmp_path / "ckpt"),
                 str(textfile)],
                capture_output=True, text=True, timeout=600, cwd=tmp_path)
            assert run.returncode == 0, run.stderr[-3000:] + server.tail()
        rows_in_pg = pg.count()
    finally:
        pg.cleanup()

    assert rows_in_pg == sum(ROWS)
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for family in text_string_to_metric_families(textfile.read_text())
           for s in family.samples}
    base = (("family", "prepare_in_task"), ("sink_id", pg.sink_id))
    assert got[("connectors_rows_total", base)] == sum(ROWS)
    assert got[("connectors_batches_total", tuple(sorted(
        (*base, ("outcome", "committed"), ("path", "default")))))] == len(ROWS)
    assert got[("connectors_last_committed_batch_id", base)] == len(ROWS) - 1
