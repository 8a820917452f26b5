"""A fan-out of two Delta tables on real Spark and Delta (issue 41: what ``DeltaSinks``
does today, under one decision): the decisions beside the first table's ledger
(``DeltaSink.create_ledger_for``); a batch the second table refuses (a schema mismatch)
commits nothing in the first either; a crash between the two tables' commits converges
when the batch runs again (a batch job's same run id). In-process (``conftest.spark``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from connectors import FanOut
from connectors.core.errors import BadInputError
from connectors.core.protocol import crash
from connectors.core.protocol.crash import SimulatedCrash
from connectors.core.states import CrashPoint
from connectors.delta import DeltaSink
from integration.delta.test_delta_errors import events, expected
from integration.support._delta import table_rows

pytestmark = [pytest.mark.integration]

ROWS = 100
FAN = "lakes"


def fan(a: Path, b: Path) -> FanOut:
    return FanOut(DeltaSink(str(a), sink_id="lake-a", create_table=True),
                  DeltaSink(str(b), sink_id="lake-b", create_table=True), sink_id=FAN)


def rows(spark: SparkSession, path: Path) -> list[tuple[object, ...]]:
    return table_rows(spark, path, ["id", "name", "amount"]) if path.exists() else []


def test_two_delta_tables_one_decision(spark: SparkSession, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    crash.disarm_all()
    first = fan(a, b)
    first.run_batch(events(spark, 0, ROWS), 0)
    first.close()
    assert (a / "_connectors" / FAN).is_dir()  # the decisions beside the first table's
    # Table b now has `amount` as a string: batch 1 (amount double) does not fit it.
    (events(spark, 10_000, 1).withColumn("amount", F.col("amount").cast("string"))
     .write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(str(b)))
    refused = fan(a, b)
    with pytest.raises(BadInputError, match="amount") as info:
        refused.run_batch(events(spark, ROWS, ROWS), 1)
    assert info.value.sink_id == "lake-b"
    refused.close()
    assert rows(spark, a) == expected(0, ROWS)  # batch 1 in neither table
    # The fix: table b gets its schema back (and batch 0's rows, as it had them).
    events(spark, 0, ROWS).write.format("delta").mode("overwrite").option(
        "overwriteSchema", "true").save(str(b))
    crash.arm(CrashPoint.BETWEEN_COMMITS, sink_id=FAN, batch_id=1)
    crashed = fan(a, b)
    with pytest.raises(SimulatedCrash):
        crashed.run_batch(events(spark, ROWS, ROWS), 1)
    crashed.close()
    assert rows(spark, a) == expected(0, 2 * ROWS) and rows(spark, b) == expected(0, ROWS)
    again = fan(a, b)  # the batch job runs again with the same run id
    again.run_batch(events(spark, ROWS, ROWS), 1)
    again.run_batch(events(spark, 2 * ROWS, ROWS), 2)
    again.close()
    crash.disarm_all()
    for path in (a, b):
        assert rows(spark, path) == expected(0, 3 * ROWS), path
