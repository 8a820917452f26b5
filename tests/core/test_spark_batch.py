"""Which rows tasks hash themselves: flat schemas only, and only for sinks that ask."""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from connectors import KafkaSink, PostgresSink
from connectors.core.spark_batch import flat_schema


def _schema(*types: object) -> StructType:
    return StructType([StructField(f"c{i}", t) for i, t in enumerate(types)])  # type: ignore[arg-type]


def test_atomic_columns_make_a_flat_schema() -> None:
    assert flat_schema(_schema(
        LongType(), IntegerType(), BooleanType(), StringType(), BinaryType(), DoubleType(),
        DateType(), TimestampType(), TimestampNTZType(), DecimalType(30, 4), NullType(),
    ))
    assert flat_schema(_schema())


def test_any_nested_column_keeps_the_jvm_row_hashes() -> None:
    assert not flat_schema(_schema(LongType(), ArrayType(StringType())))
    assert not flat_schema(_schema(StructType([StructField("x", IntegerType())])))
    assert not flat_schema(_schema(MapType(StringType(), IntegerType())))


def test_postgres_tasks_hash_their_rows_and_kafka_tasks_sum_the_jvm_s() -> None:
    assert PostgresSink.hash_rows_in_tasks is True
    assert KafkaSink.hash_rows_in_tasks is False


_GC_PROBE = r'''
import gc, json, sys
from connectors.core import spark_batch
from connectors.core.fingerprint import Fingerprint
from connectors.core.tasks import TaskCommit, TaskInfo, TaskOutcome

spark_batch._task_info = lambda: TaskInfo(partition=0, attempt_number=0, task_attempt_id=1)
kept = []

def task(info, batches):
    import email.mime.multipart, xml.dom.minidom  # first use: thousands of new objects
    if not kept:  # and something the first task keeps (a client, a pool)
        kept.append([[] for _ in range(10_000)])
    return TaskOutcome(commit=TaskCommit("t", 0, 1, Fingerprint()))

run = spark_batch.outcome_task(task)
# A PySpark worker has pyarrow's lazy imports done before any task (it reads Arrow).
spark_batch.pa.record_batch([spark_batch.pa.array([b""], spark_batch.pa.binary())],
                            spark_batch._OUTCOME_SCHEMA)
TaskOutcome(commit=TaskCommit("t", 0, 1, Fingerprint())).to_bytes()
counts = []
for _ in range(3):
    list(run(iter([])))
    counts.append(len(gc.get_objects()))  # what the next gc.collect() would scan
print(json.dumps(counts))
'''


def test_a_worker_s_first_task_leaves_nothing_for_later_collections_to_scan() -> None:
    # PySpark runs gc.collect() after every task of a reused worker: it must not scan the
    # modules and clients the first task loaded and kept (measured 13-37 ms a task).
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])  # this checkout, not an installed copy
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _GC_PROBE], capture_output=True, text=True,
                         check=True, timeout=120, env=env)
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(c < 1000 for c in counts), counts
