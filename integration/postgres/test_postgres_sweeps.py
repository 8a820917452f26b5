"""One read of ``pg_prepared_xacts`` per batch in steady state, on a real streaming query.

PostgresSink lists its prepared transactions (its ``list_prepared`` hook, the only query of
``pg_prepared_xacts`` in the sink) when a driver run starts and when a batch closes (the
sweep that rolls back losing attempts). Once every attempt of a batch's tasks has ended
(Spark's status tracker, asked without waiting), the next batch of the same run does not
list them again before its tasks: the first batch of a run reads twice, every later batch
once. The table is exact and nothing stays prepared.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

FILES = 4
ROWS = 50


@pytest.fixture
def pg(postgres_conninfo: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from integration.support._pg import DRIVER_PGOPTIONS, PgTarget

    monkeypatch.setenv("PGOPTIONS", DRIVER_PGOPTIONS)
    target = PgTarget(postgres_conninfo, prefix="sweeps")
    target.create_table()
    yield target
    target.cleanup()


def test_a_streaming_query_reads_pg_prepared_xacts_once_per_batch(
    spark: Any, pg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from connectors.postgres import PostgresSink

    source = tmp_path / "in"
    source.mkdir()
    for f in range(FILES):
        lines = [json.dumps({"id": f * ROWS + i, "name": f"n{i}", "amount": float(i),
                             "ts": "2026-11-27T12:00:00Z"}) for i in range(ROWS)]
        (source / f"part-{f:03d}.json").write_text("\n".join(lines) + "\n")

    reads: list[int] = []
    original = PostgresSink.list_prepared

    def counted(self: PostgresSink) -> Any:
        reads.append(1)
        return original(self)

    monkeypatch.setattr(PostgresSink, "list_prepared", counted)
    sink = PostgresSink(pg.conninfo, pg.table, sink_id=pg.sink_id, ledger_table=pg.ledger)
    per_batch: list[int] = []

    def write(df: Any, batch_id: int) -> None:
        before = len(reads)
        sink(df, batch_id)
        per_batch.append(len(reads) - before)

    stream = (spark.readStream.schema("id BIGINT, name STRING, amount DOUBLE, ts TIMESTAMP")
              .option("maxFilesPerTrigger", 1).json(str(source)))
    query = (stream.writeStream.foreachBatch(write)
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(300)
    finally:
        query.stop()
        sink.close()
    assert query.exception() is None
    assert per_batch == [2] + [1] * (FILES - 1), per_batch
    got = sorted(row[0] for row in pg.rows("id"))
    assert got == list(range(FILES * ROWS)), "every row exactly once"
    assert pg.prepared() == [], "nothing left prepared"
