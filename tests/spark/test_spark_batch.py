"""Which rows tasks hash themselves: flat schemas only, and only for sinks that ask."""

from __future__ import annotations

import pyarrow as pa
import pytest
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
from connectors.spark._handover import (
    MAX_BYTES,
    MAX_RECORDS,
    NO_SIZE_CHECK,
    _byte_string,
    arrow_settings,
    handover_budget,
    handover_rows,
    session_settings,
)
from connectors.spark._plan import narrow_plan
from connectors.spark._rows import _as_written, arrow_schema, flat_schema


def _schema(*types: object) -> StructType:
    return StructType([StructField(f"c{i}", t) for i, t in enumerate(types)])  # type: ignore[arg-type]


def test_atomic_columns_make_a_flat_schema() -> None:
    assert flat_schema(_schema(
        LongType(), IntegerType(), BooleanType(), StringType(), BinaryType(), DoubleType(),
        DateType(), TimestampType(), TimestampNTZType(), DecimalType(30, 4), NullType(),
    ))
    assert flat_schema(_schema())


def test_nested_columns_other_than_arrays_of_atomic_types_keep_the_jvm_row_hashes() -> None:
    assert flat_schema(_schema(LongType(), ArrayType(StringType())))  # numpy hashes arrays
    assert not flat_schema(_schema(ArrayType(ArrayType(StringType()))))
    assert not flat_schema(_schema(StructType([StructField("x", IntegerType())])))
    assert not flat_schema(_schema(MapType(StringType(), IntegerType())))


def test_postgres_tasks_hash_their_rows_and_kafka_tasks_sum_the_jvm_s() -> None:
    assert PostgresSink.hash_rows_in_tasks is True
    assert KafkaSink.hash_rows_in_tasks is False


_GC_PROBE = r'''
import gc, json, sys
from connectors.spark import _tasks as spark_tasks
from connectors.core.fingerprint import Fingerprint
from connectors.core.templates.tasks import TaskCommit, TaskInfo, TaskOutcome

spark_tasks._task_info = lambda: TaskInfo(partition=0, attempt_number=0, task_attempt_id=1)
kept = []

def task(info, batches):
    import email.mime.multipart, xml.dom.minidom  # first use: thousands of new objects
    if not kept:  # and something the first task keeps (a client, a pool)
        kept.append([[] for _ in range(10_000)])
    return TaskOutcome(commit=TaskCommit("t", 0, 1, Fingerprint()))

run = spark_tasks.outcome_task(task)
# A PySpark worker has pyarrow's lazy imports done before any task (it reads Arrow).
spark_tasks.pa.record_batch([spark_tasks.pa.array([b""], spark_tasks.pa.binary())],
                            spark_tasks._OUTCOME_SCHEMA)
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


class _Conf:
    """The part of ``spark.conf`` the handover reads and sets."""

    def __init__(self, **values: str) -> None:
        self.values = dict(values)
        self.calls: list[tuple[str, str | None]] = []

    def get(self, key: str, *default: object) -> object:
        if key in self.values:
            return self.values[key]
        if default:
            return default[0]
        return {MAX_BYTES: "67108864b", MAX_RECORDS: "10000"}[key]

    def set(self, key: str, value: str) -> None:
        self.calls.append((key, value))
        self.values[key] = value

    def unset(self, key: str) -> None:
        self.calls.append((key, None))
        self.values.pop(key, None)


class _Session:
    def __init__(self, **values: str) -> None:
        self.conf = _Conf(**values)


def test_spark_byte_strings_are_read_with_binary_units() -> None:
    assert _byte_string("67108864b") == 64 << 20
    assert _byte_string("64MB") == _byte_string("64m") == _byte_string(" 64 mb ") == 64 << 20
    assert _byte_string("2g") == 2 << 30
    assert _byte_string("1000") == 1000
    assert _byte_string("64 megabytes") is None
    assert _byte_string("1.5g") is None


def test_rows_per_arrow_batch_keep_the_session_s_byte_and_row_limits() -> None:
    assert handover_budget(_Session()) == (64 << 20, 10_000)
    assert handover_rows(_Session(), 100) == 10_000  # the row limit binds
    assert handover_rows(_Session(), 20_000) == (64 << 20) // 20_000  # the bytes bind
    assert handover_rows(_Session(), 70_000) is None  # < 1,024 rows: Spark's batching
    assert handover_rows(_Session(**{MAX_RECORDS: "0"}), 100) == (64 << 20) // 100
    assert handover_rows(_Session(**{MAX_RECORDS: "-1", MAX_BYTES: "1g"}), 1 << 20) == 1024
    # The size check is off already, or the setting is unreadable: leave Spark alone.
    assert handover_rows(_Session(**{MAX_BYTES: str(NO_SIZE_CHECK)}), 100) is None
    assert handover_rows(_Session(**{MAX_BYTES: "lots"}), 100) is None


def test_arrow_settings_are_set_for_the_block_and_restored_even_on_error() -> None:
    session = _Session(**{MAX_RECORDS: "5000"})
    with session_settings(session, arrow_settings(1234)):
        assert session.conf.values == {MAX_RECORDS: "1234", MAX_BYTES: str(NO_SIZE_CHECK)}
    assert session.conf.values == {MAX_RECORDS: "5000"}  # the user's value back; ours unset
    with pytest.raises(RuntimeError), session_settings(session, arrow_settings(99)):
        raise RuntimeError("the job failed")
    assert session.conf.values == {MAX_RECORDS: "5000"}


def test_session_settings_are_set_for_the_block_and_restored_even_on_error() -> None:
    session = _Session(**{"spark.sql.adaptive.enabled": "true"})
    with session_settings(session, {"spark.sql.adaptive.enabled": "false", "x": "1"}):
        assert session.conf.values == {"spark.sql.adaptive.enabled": "false", "x": "1"}
    assert session.conf.values == {"spark.sql.adaptive.enabled": "true"}
    with pytest.raises(RuntimeError), session_settings(session, {"x": "2"}):
        raise RuntimeError("the job failed")
    assert session.conf.values == {"spark.sql.adaptive.enabled": "true"}
    with session_settings(session, {}):  # nothing to set: the session is not touched
        assert session.conf.values == {"spark.sql.adaptive.enabled": "true"}


def test_a_plan_that_cannot_be_read_keeps_adaptive_execution() -> None:
    class ConnectFrame:  # Spark Connect: no JVM plan
        pass

    assert narrow_plan(ConnectFrame()) is False


# ------------------------------------------------------------ the tasks' Arrow schema

NY = "America/New_York"


def test_arrow_schema_zones_every_timestamp_like_the_jvm_on_any_pyspark() -> None:
    """The batches ``mapInArrow`` hands tasks carry the session's zone on every timestamp,
    nested ones too (measured with a session in America/New_York on pyspark 4.0.1 and
    4.3.0); pyspark < 4.2's ``to_arrow_schema`` names UTC, 4.2+ takes ``timezone``; 3.5's
    takes no ``prefers_large_types`` either."""
    ts = TimestampType()
    spark_schema = StructType([
        StructField("ts", ts),
        StructField("a", ArrayType(ts)),
        StructField("m", MapType(StringType(), ts)),
        StructField("s", StructType([StructField("x", ts), StructField("n", LongType())])),
        StructField("ntz", TimestampNTZType()),
        StructField("str", StringType()),
    ])
    zoned = pa.timestamp("us", tz=NY)
    assert arrow_schema(spark_schema, timezone=NY) == pa.schema([
        ("ts", zoned),
        ("a", pa.list_(zoned)),
        ("m", pa.map_(pa.string(), zoned)),
        ("s", pa.struct([("x", zoned), ("n", pa.int64())])),
        ("ntz", pa.timestamp("us")),
        ("str", pa.string()),
    ])
    large = arrow_schema(spark_schema, timezone="UTC", large_types=True)
    assert large.field("str").type == pa.large_string()
    assert large.field("ts").type == pa.timestamp("us", tz="UTC")


def test_as_written_keeps_everything_but_the_zone_and_widens_only_when_asked() -> None:
    utc = pa.timestamp("us", tz="UTC")
    t = pa.struct([
        pa.field("l", pa.large_list(pa.field("e", utc, nullable=False)), nullable=False),
        ("m", pa.map_(pa.string(), pa.list_(utc), keys_sorted=True)),
        ("naive", pa.timestamp("ms")),
        ("d", pa.decimal128(10, 2)),
    ])
    z = pa.timestamp("us", tz=NY)
    assert _as_written(t, NY, False) == pa.struct([
        pa.field("l", pa.large_list(pa.field("e", z, nullable=False)), nullable=False),
        ("m", pa.map_(pa.string(), pa.list_(z), keys_sorted=True)),
        ("naive", pa.timestamp("ms")),
        ("d", pa.decimal128(10, 2)),
    ])
    assert _as_written(pa.int64(), NY, False) == pa.int64()
    assert _as_written(t, NY, True) == pa.struct([  # pyspark 3.5 with useLargeVarTypes
        pa.field("l", pa.large_list(pa.field("e", z, nullable=False)), nullable=False),
        ("m", pa.map_(pa.large_string(), pa.list_(z), keys_sorted=True)),
        ("naive", pa.timestamp("ms")),
        ("d", pa.decimal128(10, 2)),
    ])
    assert _as_written(pa.struct([("b", pa.binary())]), "UTC", True) == pa.struct(
        [("b", pa.large_binary())])
