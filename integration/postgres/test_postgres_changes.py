"""``PostgresSink(mode="changes")`` on real Spark and a real PostgreSQL.

The Spark tests compare the sink's table row by row with a reference table that a plain
PostgreSQL script (psycopg, :func:`apply_one_by_one`) builds from the same changes, one
change at a time in sequence order (ties: the other columns, the greatest last).

- a streaming driver (``examples/stream_changes_to_postgres.py``) SIGKILLed at every
  driver-side crash point of the prepared-transaction family, one after the other in one
  job (each restart meets the next), then at a random moment, always restarted from the
  same checkpoint; afterwards nothing of the sink is left in ``pg_prepared_xacts``;
- batch-job calls ``sink(df, run_id)``: a replay with the same changes commits nothing
  twice, one holding other changes (another op, another sequence) is refused; an unknown
  op fails the batch, nothing committed, and the rerun with the fixed input is exact; the
  op column written when the table has it; a boolean deleted flag; a key without a unique
  index refused;
- in-process (``LocalBatch``, no JVM): composite keys, a boolean flag, timestamp sequences,
  partitions and a retried task.

``EOS_WIDE_MATRIX=1`` adds random kills.
"""

from __future__ import annotations

import datetime as dt
import os
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from psycopg import sql
from pyspark.sql import DataFrame, SparkSession

from connectors.core.errors import BadInputError, ConfigurationError, NonDeterministicReplayError
from connectors.postgres import PostgresSink
from connectors.testing import LocalBatch
from examples.stream_changes_to_postgres import CHANGE_SCHEMA, Change, make_change_files
from integration.support._changes import (
    DELETES,
    DRIVER_POINTS,
    FILES,
    ROWS_PER_FILE,
    ChangesJob,
    assert_stream_has_every_case,
    holds_what_the_point_stands_for,
)
from integration.support._driver import (
    SEED,
    file_batches,
    finished_batches,
    kill_at_each,
    kill_at_random,
)
from integration.support._pg import DRIVER_PGOPTIONS, PgTarget, check_restart, connect

pytestmark = pytest.mark.integration

WIDE = os.environ.get("EOS_WIDE_MATRIX") == "1"
TABLE_DDL = "id bigint PRIMARY KEY, seq bigint, name text, amount double precision"
COLUMNS = "id, seq, name, amount"


def apply_one_by_one(pg: PgTarget, table: str, changes: Sequence[Change]) -> None:
    """The reference: every change applied alone, in sequence order; ties in the order of
    the table's other columns then the delete flag (the sink keeps the greatest)."""
    def order(c: Change) -> tuple[Any, ...]:
        key, op, seq, name, amount = c
        return seq, key, name, amount, op.lower() in DELETES

    t = sql.Identifier(table)
    upsert = sql.SQL("INSERT INTO {} ({}) VALUES (%s, %s, %s, %s) ON CONFLICT (id) DO UPDATE "
                     "SET seq = EXCLUDED.seq, name = EXCLUDED.name, amount = EXCLUDED.amount"
                     ).format(t, sql.SQL(COLUMNS))
    delete = sql.SQL("DELETE FROM {} WHERE id = %s").format(t)
    with connect(pg.conninfo) as conn, conn.transaction(), conn.cursor() as cur:
        for key, op, seq, name, amount in sorted(changes, key=order):
            if op.lower() in DELETES:
                cur.execute(delete, [key])
            else:
                cur.execute(upsert, [key, seq, name, amount])


def assert_same_as_reference(pg: PgTarget, changes: Sequence[Change], *,
                             prepared: bool = False) -> None:
    reference = f"{pg.table}_ref"
    pg.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(reference)))
    pg.create_table(TABLE_DDL, name=reference)
    apply_one_by_one(pg, reference, changes)
    expected, actual = pg.rows(COLUMNS, table=reference), pg.rows(COLUMNS)
    assert expected or not changes, "the reference table is empty: all deleted?"
    wrong = [(a, e) for a, e in zip(actual, expected, strict=False) if a != e]
    assert len(actual) == len(expected) and not wrong, (len(actual), len(expected), wrong[:5])
    if not prepared:
        assert not pg.prepared(), f"prepared transactions of the sink left: {pg.prepared()}"


@pytest.fixture
def pg(postgres_conninfo: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[PgTarget]:
    monkeypatch.setenv("EOS_POSTGRES_CONNINFO", postgres_conninfo)  # drivers read it
    monkeypatch.setenv("PGOPTIONS", DRIVER_PGOPTIONS)
    target = PgTarget(postgres_conninfo, prefix="cdc")
    target.create_table(TABLE_DDL)
    yield target
    target.cleanup(f"{target.table}_ref")


# ------------------------------------------------------------------ killed drivers

@pytest.mark.slow
def test_change_stream_killed_at_every_driver_point_and_at_random_is_exact(
    tmp_path: Path, pg: PgTarget
) -> None:
    job = ChangesJob(tmp_path, pg, "examples.stream_changes_to_postgres")
    per_file = [make_change_files(job.input, f, 1, ROWS_PER_FILE) for f in range(FILES)]
    assert_stream_has_every_case(per_file)
    changes = [c for file in per_file for c in file]
    plan = [(point, pg.sink_id, batch) for batch, point in enumerate(DRIVER_POINTS)]

    def partly_committed(batch: int, prepared: Sequence[Any]) -> None:
        decided = set(pg.decided_transactions(batch))
        assert len(decided) > 1 and {str(t) for t in prepared} < decided, decided

    after_kill = holds_what_the_point_stands_for(
        pg, per_file, lambda done: assert_same_as_reference(pg, done, prepared=True),
        partly_committed)
    runs = kill_at_each(job, plan, after_kill=after_kill)
    assert [r.returncode for r in runs] == [-9] * len(plan) + [0]
    batches = file_batches(job.checkpoint)
    assert batches == {f"part-{f:05d}.json": f for f in range(FILES)}, batches
    assert_same_as_reference(pg, changes)
    assert set(pg.ledger_states().values()) == {"COMMITTED"}

    # More of the stream, killed at random moments while the driver writes.
    more = 5 if WIDE else 3  # the kill lands within 1 s of a batch: two more follow it
    changes += make_change_files(job.input, FILES, more, ROWS_PER_FILE)
    kill_at_random(job, progress=lambda: len(pg.ledger_states()), runs=3 if WIDE else 1,
                   max_delay=1.0, seed=SEED, check=check_restart)
    # Spark's micro-batches, not the files: a kill can put two files in one batch.
    batches = finished_batches(job.checkpoint)
    by_file = file_batches(job.checkpoint)
    assert len(by_file) == FILES + more and sorted(set(by_file.values())) == list(range(batches))
    assert_same_as_reference(pg, changes)


# ------------------------------------------------------------------ batch jobs


def frame(spark: SparkSession, changes: Sequence[Change], partitions: int = 3) -> DataFrame:
    return spark.createDataFrame(list(changes), CHANGE_SCHEMA).repartition(partitions)


def sink_for(pg: PgTarget, **options: Any) -> PostgresSink:
    options.setdefault("op_column", "op")
    return PostgresSink(pg.conninfo, options.pop("table", pg.table), sink_id=pg.sink_id,
                        ledger_table=pg.ledger, mode="changes", key_columns=["id"],
                        sequence_column="seq", **options)


def stream_of(tmp_path: Path, first: int, files: int) -> list[Change]:
    return make_change_files(tmp_path / f"in-{first}", first, files, 300, keys=60)


def test_replays_bad_ops_and_the_fixed_rerun(spark: SparkSession, tmp_path: Path,
                                             pg: PgTarget) -> None:
    run0 = stream_of(tmp_path, 0, 1)
    sink = sink_for(pg)
    sink(frame(spark, run0), 0)
    assert_same_as_reference(pg, run0)
    before = pg.rows(COLUMNS)

    # The same changes again (other partitions, other order): nothing written twice.
    sink(frame(spark, list(reversed(run0)), 2), 0)
    assert sink.last_metrics is not None and sink.last_metrics.outcome == "replayed"
    # Other changes under the same run id: another op, then another sequence value.
    i = next(i for i, c in enumerate(run0) if c[1].lower() not in DELETES)
    for changed in ((*run0[i][:1], "d", *run0[i][2:]), (*run0[i][:2], 10**9, *run0[i][3:])):
        other = [*run0[:i], changed, *run0[i + 1:]]
        with pytest.raises(NonDeterministicReplayError, match="on_replay_mismatch"):
            sink(frame(spark, other), 0)
        assert pg.rows(COLUMNS) == before and not pg.prepared()

    # An unknown op fails the batch: nothing of it committed, the value not shown.
    run1 = stream_of(tmp_path, 1, 1)
    bad = [*run1[:5], (run1[5][0], "merge-secret", *run1[5][2:]), *run1[6:]]
    with pytest.raises(BadInputError) as err:
        sink(frame(spark, bad), 1)
    text = str(err.value)
    assert "op_column 'op'" in text and "'d'" in text and "merge-secret" not in text, text
    assert 1 not in pg.ledger_states() and not pg.prepared()
    assert pg.rows(COLUMNS) == before
    # A NULL sequence value too.
    nulls = [*run1[:5], (*run1[5][:2], None, *run1[5][3:]), *run1[6:]]
    with pytest.raises(BadInputError, match="sequence_column 'seq' is NULL"):
        sink(frame(spark, nulls), 1)
    assert pg.rows(COLUMNS) == before and not pg.prepared()

    sink(frame(spark, run1), 1)  # the fixed input: exact
    assert sink.last_metrics is not None and sink.last_metrics.outcome == "committed"
    assert_same_as_reference(pg, run0 + run1)
    sink.close()


def test_op_column_written_when_the_table_has_it_and_boolean_flags(
    spark: SparkSession, tmp_path: Path, pg: PgTarget
) -> None:
    changes = stream_of(tmp_path, 0, 1)
    pg.execute(sql.SQL("ALTER TABLE {} ADD COLUMN op text").format(sql.Identifier(pg.table)))
    sink = sink_for(pg)
    sink(frame(spark, changes), 0)
    sink.close()
    assert_same_as_reference(pg, changes)
    ops = dict(pg.execute(sql.SQL("SELECT id, op FROM {}").format(sql.Identifier(pg.table))))
    assert ops and all(op.lower() not in DELETES for op in ops.values()), ops

    # A boolean "deleted" flag, into a table the sink creates: seq created, the flag not.
    created = f"{pg.table}_flag"
    flagged = spark.createDataFrame(
        [(k, op.lower() in DELETES, seq, name, amount) for k, op, seq, name, amount in changes],
        "id LONG, deleted BOOLEAN, seq LONG, name STRING, amount DOUBLE")
    flags = sink_for(pg, table=created, op_column="deleted", create_table=True)
    try:
        flags(flagged, 1)
        flags.close()
        cols = pg.execute("SELECT column_name FROM information_schema.columns WHERE "
                          "table_name = %s ORDER BY ordinal_position", [created])
        assert [c for c, in cols] == ["id", "seq", "name", "amount"]
        assert pg.rows(COLUMNS, table=created) == pg.rows(COLUMNS)
    finally:
        pg.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(created)))


def test_key_columns_need_a_unique_index(spark: SparkSession, tmp_path: Path,
                                         pg: PgTarget) -> None:
    loose = f"{pg.table}_loose"
    pg.create_table("id bigint, seq bigint, name text, amount double precision", name=loose)
    try:
        sink = sink_for(pg, table=loose)
        with pytest.raises(ConfigurationError, match="ADD PRIMARY KEY"):
            sink(frame(spark, stream_of(tmp_path, 0, 1)), 0)
        sink.close()
        assert pg.count(loose) == 0 and 0 not in pg.ledger_states() and not pg.prepared()
    finally:
        pg.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(loose)))


# ------------------------------------------------------------------ in-process, no Spark


def test_composite_keys_and_flags_across_partitions_and_retries(pg: PgTarget) -> None:
    """LocalBatch (no JVM): a composite key, a boolean deleted flag and timestamps as the
    sequence; each batch's rows spread over partitions, a failed first attempt retried.
    The table after every batch equals applying the changes one by one."""
    table = f"{pg.table}_pair"
    pg.create_table("a bigint, b text, v bigint, PRIMARY KEY (b, a)", name=table)
    sink = PostgresSink(pg.conninfo, table, sink_id=pg.sink_id, ledger_table=pg.ledger,
                        mode="changes", key_columns=["a", "b"], op_column="gone",
                        sequence_column="at")
    rng, state = random.Random(7), {}
    base = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    try:
        for batch_id in range(3):
            rows = [(rng.randrange(5), rng.choice("xy"), rng.random() < 0.3,
                     base + dt.timedelta(seconds=batch_id * 1000 + i), i + 100 * batch_id)
                    for i in range(200)]
            for a, b, gone, _, v in rows:  # in sequence order already
                if gone:
                    state.pop((a, b), None)
                else:
                    state[(a, b)] = v
            data = pa.table({"a": [r[0] for r in rows], "b": [r[1] for r in rows],
                             "gone": [r[2] for r in rows],
                             "at": pa.array([r[3] for r in rows], pa.timestamp("us", "UTC")),
                             "v": [r[4] for r in rows]})
            sink.write_batch(LocalBatch(data, partitions=3, fail_first_attempt=[1]), batch_id)
            got = pg.execute(sql.SQL("SELECT a, b, v FROM {} ORDER BY a, b").format(
                sql.Identifier(table)))
            assert got == [(a, b, v) for (a, b), v in sorted(state.items())], batch_id
        assert not pg.prepared()
    finally:
        sink.close()
        pg.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


def test_uuid_keys_and_array_columns(pg: PgTarget) -> None:
    """The column types of the binary COPY path in a change stream: a uuid key (deleted
    through ``unnest(%s::uuid[])``), an ``integer[]`` and an enum column upserted; the table
    equals applying the changes one by one."""
    table, mood = f"{pg.table}_uuid", f"{pg.table}_mood"
    pg.execute(sql.SQL("CREATE TYPE {} AS ENUM ('sad', 'ok')").format(sql.Identifier(mood)))
    pg.execute(sql.SQL("CREATE TABLE {} (id uuid PRIMARY KEY, scores integer[], mood {})")
               .format(sql.Identifier(table), sql.Identifier(mood)))
    sink = PostgresSink(pg.conninfo, table, sink_id=pg.sink_id, ledger_table=pg.ledger,
                        mode="changes", key_columns=["id"], op_column="op",
                        sequence_column="seq")
    ids = [f"00000000-0000-4000-8000-{i:012d}" for i in range(4)]
    rng, state = random.Random(11), {}
    try:
        for batch_id in range(3):
            rows = [(rng.choice(ids), rng.choice("cud"), batch_id * 100 + i,
                     [i, None] if i % 3 else [], rng.choice(["sad", "ok"])) for i in range(40)]
            for key, op, _, scores, m in rows:
                if op == "d":
                    state.pop(key, None)
                else:
                    state[key] = (scores, m)
            data = pa.table({"id": [r[0] for r in rows], "op": [r[1] for r in rows],
                             "seq": [r[2] for r in rows],
                             "scores": pa.array([r[3] for r in rows], pa.list_(pa.int32())),
                             "mood": [r[4] for r in rows]})
            sink.write_batch(LocalBatch(data, partitions=2), batch_id)
            got = pg.execute(sql.SQL("SELECT id::text, scores, mood::text FROM {} ORDER BY 1")
                             .format(sql.Identifier(table)))
            assert got == [(k, *v) for k, v in sorted(state.items())], batch_id
        assert not pg.prepared()
    finally:
        sink.close()
        pg.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
        pg.execute(sql.SQL("DROP TYPE IF EXISTS {}").format(sql.Identifier(mood)))
