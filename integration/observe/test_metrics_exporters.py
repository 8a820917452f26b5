"""Metrics read back from real exporters while a real streaming query runs (issue 40,
item 1): a classic PySpark query reads JSON files (one file a batch) into a PostgresSink
and a DeltaSink; the Prometheus endpoint is scraped over HTTP (parsed with
``prometheus_client``'s parser) and OpenTelemetry is read through the SDK's in-memory
reader, and both are checked against ``sink.last_metrics`` and the rows in the targets. A
batch Spark replays (its commit-log entry removed, as after a crash between the sink's
commit and Spark's) is counted as replayed. Spark's own progress shows what
``docs/metrics.md`` says: ``numOutputRows`` -1, the rows in an ``observe``'d metric."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client.parser import text_string_to_metric_families

import connectors
from connectors.core.metrics import registered_exporters
from integration.support._pg import PgTarget

pytestmark = pytest.mark.integration

ROWS = (5, 7, 11)  # rows of the files, one file a batch
Labels = tuple[tuple[str, str], ...]


@pytest.fixture
def exporters() -> Iterator[tuple[Any, InMemoryMetricReader]]:
    for exporter in registered_exporters():
        exporter.close()
    reader = InMemoryMetricReader()
    prom = connectors.export_metrics(connectors.PrometheusMetrics(port=0, addr="127.0.0.1"))
    otel = connectors.export_metrics(
        connectors.OpenTelemetryMetrics(MeterProvider(metric_readers=[reader])))
    yield prom, reader
    prom.close()
    otel.close()


def scrape(port: int) -> dict[tuple[str, Labels], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def otel_points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    return {m.name: list(m.data.data_points) for rm in data.resource_metrics
            for sm in rm.scope_metrics for m in sm.metrics}


def of_sink(points: list[Any], sink_id: str) -> list[Any]:
    return [p for p in points if p.attributes["sink_id"] == sink_id]


def write_file(folder: Path, n: int, rows: int) -> None:
    first = 1000 * n
    lines = [json.dumps({"id": first + i, "name": f"n{i}"}) for i in range(rows)]
    (folder / f"part-{n:03d}.json").write_text("\n".join(lines) + "\n")


def test_metrics_of_a_streaming_query_read_back_from_prometheus_and_otel(
    spark: Any, postgres_conninfo: str, tmp_path: Path,
    exporters: tuple[Any, InMemoryMetricReader],
) -> None:
    from pyspark.sql import functions as F

    from connectors.delta import DeltaSink
    from connectors.postgres import PostgresSink

    prom, reader = exporters
    pg = PgTarget(postgres_conninfo, prefix="eos_metrics")
    pg.create_table("id bigint NOT NULL, name text")
    source, ckpt, table = tmp_path / "in", tmp_path / "ckpt", str(tmp_path / "delta")
    source.mkdir()
    pg_sink = PostgresSink(postgres_conninfo, pg.table, sink_id=pg.sink_id,
                           ledger_table=pg.ledger)
    delta_id = f"{pg.sink_id}-d"
    delta_sink = DeltaSink(table, sink_id=delta_id, create_table=True)
    seen: dict[str, list[Any]] = {pg.sink_id: [], delta_id: []}

    def both(df: Any, batch_id: int) -> None:
        pg_sink(df, batch_id)
        delta_sink(df, batch_id)
        seen[pg.sink_id].append(pg_sink.last_metrics)
        seen[delta_id].append(delta_sink.last_metrics)

    def start() -> Any:
        df = (spark.readStream.schema("id LONG, name STRING")
              .option("maxFilesPerTrigger", 1).json(str(source))
              .observe("input", F.count(F.lit(1)).alias("rows")))
        return (df.writeStream.foreachBatch(both).queryName(f"metrics_{pg.suffix}")
                .option("checkpointLocation", str(ckpt)).start())

    try:
        query = start()
        try:
            for n, rows in enumerate(ROWS[:2]):
                write_file(source, n, rows)
                query.processAllAvailable()
            # Read while the query runs: two committed batches of each sink.
            live = scrape(prom.port)
            pg_labels = (("family", "prepare_in_task"), ("sink_id", pg.sink_id))
            assert live[("connectors_rows_total", pg_labels)] == ROWS[0] + ROWS[1]
            assert live[("connectors_batches_total", tuple(sorted(
                (*pg_labels, ("outcome", "committed"), ("path", "default")))))] == 2
            progress = query.recentProgress
        finally:
            query.stop()
        # Spark's own progress: the foreachBatch sink's rows are unknown (-1); the input
        # rows and a count observed on the input add up every read of the batch: here
        # two sinks, each reading it once, so twice the rows. The sinks' own figures are
        # the exporters'.
        batches = [p for p in progress if p.numInputRows > 0]
        assert [p.sink.numOutputRows for p in batches] == [-1, -1]
        assert [p.numInputRows for p in batches] == [2 * rows for rows in ROWS[:2]]
        assert [p.observedMetrics["input"]["rows"] for p in batches] == [
            2 * rows for rows in ROWS[:2]]

        # Spark replays batch 1 (its commit-log entry gone, as after a crash between the
        # sinks' commits and Spark's): both sinks find it committed and write nothing.
        (ckpt / "commits" / "1").unlink()
        (ckpt / "commits" / ".1.crc").unlink(missing_ok=True)  # Hadoop's checksum of it
        write_file(source, 2, ROWS[2])
        query = start()
        try:
            query.processAllAvailable()
            final = scrape(prom.port)
        finally:
            query.stop()
    finally:
        pg_sink.close()
        delta_sink.close()
        rows_in_pg = pg.count()
        pg.cleanup()

    assert [m.outcome for m in seen[pg.sink_id]] == [
        "committed", "committed", "replayed", "committed"]
    assert [m.batch_id for m in seen[pg.sink_id]] == [0, 1, 1, 2]
    # Every row in PostgreSQL, each counted once by the sink's metrics.
    assert rows_in_pg == sum(m.rows for m in seen[pg.sink_id]) == sum(ROWS)
    # DeltaSink writes every row but does not count an append's rows (counting costs a
    # job; Delta's own history has numOutputRows): its figure is 0, documented.
    assert spark.read.format("delta").load(table).count() == sum(ROWS)
    assert sum(m.rows for m in seen[delta_id]) == 0

    for sink_id, family, rows in ((pg.sink_id, "prepare_in_task", sum(ROWS)),
                                  (delta_id, "commit_on_driver", 0)):
        base = (("family", family), ("sink_id", sink_id))
        metrics = seen[sink_id]
        path = metrics[-1].path or "default"

        def key(name: str, *extra: tuple[str, str], base: Labels = base) -> tuple[str, Labels]:
            return name, tuple(sorted((*base, *extra)))

        # Prometheus, scraped over HTTP
        assert final[key("connectors_rows_total")] == rows
        assert final[key("connectors_bytes_total")] == sum(m.bytes for m in metrics)
        assert final[key("connectors_tasks_total")] == sum(m.tasks for m in metrics)
        assert final[key("connectors_batches_total", ("outcome", "committed"),
                         ("path", path))] == 3
        assert final[key("connectors_batches_total", ("outcome", "replayed"),
                         ("path", metrics[2].path or "default"))] == 1
        assert final[key("connectors_last_committed_batch_id")] == 2
        assert final[key("connectors_lingering_transactions")] == metrics[-1].lingering == 0
        assert final[key("connectors_batch_duration_seconds_count", ("phase", "total"))] == 4
        assert final[key("connectors_batch_duration_seconds_sum", ("phase", "commit"))] == (
            pytest.approx(sum(m.commit_ms for m in metrics) / 1000))

        # OpenTelemetry, through the SDK's in-memory reader
        points = otel_points(reader)
        (otel_rows,) = of_sink(points["connectors.rows"], sink_id)
        assert otel_rows.value == rows
        outcomes: dict[str, int] = {}
        for p in of_sink(points["connectors.batches"], sink_id):
            outcomes[p.attributes["outcome"]] = outcomes.get(p.attributes["outcome"], 0) + p.value
        assert outcomes == {"committed": 3, "replayed": 1}
        (last,) = of_sink(points["connectors.batch.last_committed"], sink_id)
        assert last.value == 2
    # The Delta sink names its commit path (tag / txn_seed / txn).
    assert seen[delta_id][-1].path in ("tag", "txn_seed", "txn")


def leave_prepared(conninfo: str, table: str, sink_id: str, batch_id: int) -> None:
    """What a task killed right after its PREPARE TRANSACTION leaves: a prepared transaction
    of the sink (of a run that is gone) holding a row, that no decision lists."""
    import psycopg
    from psycopg import sql

    from connectors.core.naming import TransactionId
    from connectors.postgres import XID_FORMAT_ID

    tid = TransactionId(sink_id, "deadbeef", batch_id, 7)
    conn = psycopg.connect(conninfo)
    try:
        conn.tpc_begin(conn.xid(XID_FORMAT_ID, *tid.xid_parts()))
        conn.execute(sql.SQL("INSERT INTO {} VALUES (-1, 'lingering')").format(
            sql.Identifier(table)))
        conn.tpc_prepare()
    finally:
        conn.close()  # the transaction stays prepared, as the dead task's did


def test_lingering_gauge_rises_with_a_left_prepared_transaction_and_falls_after_the_sweep(
    spark: Any, postgres_conninfo: str, tmp_path: Path,
    exporters: tuple[Any, InMemoryMetricReader],
) -> None:
    from connectors.postgres import PostgresSink

    prom, reader = exporters
    pg = PgTarget(postgres_conninfo, prefix="eos_metrics_l")
    pg.create_table("id bigint NOT NULL, name text")
    source, ckpt = tmp_path / "in", tmp_path / "ckpt"
    source.mkdir()
    sink = PostgresSink(postgres_conninfo, pg.table, sink_id=pg.sink_id, ledger_table=pg.ledger)
    base = (("family", "prepare_in_task"), ("sink_id", pg.sink_id))
    lingering, aborted = [], []
    try:
        query = (spark.readStream.schema("id LONG, name STRING")
                 .option("maxFilesPerTrigger", 1).json(str(source))
                 .writeStream.foreachBatch(sink).option("checkpointLocation", str(ckpt))
                 .start())
        try:
            for n, rows in enumerate(ROWS):
                if n == 1:  # a task of batch 1's earlier attempt died after its PREPARE
                    leave_prepared(postgres_conninfo, pg.table, pg.sink_id, 1)
                    assert len(pg.prepared()) == 1
                write_file(source, n, rows)
                query.processAllAvailable()
                scraped = scrape(prom.port)
                lingering.append(scraped[("connectors_lingering_transactions", base)])
                aborted.append(scraped[("connectors_aborted_transactions_total", base)])
        finally:
            query.stop()
        left, ids = pg.prepared(), pg.ids()
    finally:
        sink.close()
        pg.cleanup()
    assert lingering == [0, 1, 0]
    assert aborted == [0, 1, 1]  # rolled back by batch 1's sweep
    assert left == []
    assert sorted(ids) == sorted(1000 * n + i for n, rows in enumerate(ROWS)
                                 for i in range(rows))  # the lingering row never visible
    (gauge,) = of_sink(otel_points(reader)["connectors.transactions.lingering"], pg.sink_id)
    assert gauge.value == 0
