"""``MariaDBSink(mode="changes")`` on a real MariaDB: PostgreSQL's change-stream tests
(integration/postgres/test_postgres_changes.py) for MariaDB.

The table is compared row by row with a reference built in Python (:func:`reference`):
every change applied alone, in sequence order (ties: the other columns in the table's
order, then the delete flag: the greatest last, a delete beats an upsert).

- Spark, a streaming driver (``examples/stream_to_mariadb.py --changes``) SIGKILLed at
  every driver-side crash point of the prepared-transaction family in turn (each restart
  meets the next), then at a random moment, always restarted from the same checkpoint:
  after each kill the table holds what the point stands for; at the end it is exact and
  nothing of the sink is left in ``XA RECOVER``;
- in-process (``LocalBatch``: tasks in this process, real XA branches): a replay with the
  same changes commits nothing twice, one with other changes is refused; an unknown or NULL
  op and a NULL sequence value fail the batch with nothing committed, and the rerun with
  the fixed input is exact; deletes whose other columns are NULL into a table whose other
  columns are NOT NULL; the op column written when the table has it; a boolean flag into a
  table the sink creates (the sequence column created, the op column not); composite keys
  across partitions and a retried task; a key no unique index covers refused;
- Spark batch jobs (``sink(df, batch_id)``): a replay, a bad op refused in the tasks with
  nothing committed, the fixed rerun exact.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from connectors.core.errors import BadInputError, NonDeterministicReplayError
from connectors.mariadb._sink import MariaDBSink
from connectors.testing import LocalBatch
from examples.stream_changes_to_postgres import Change, make_change_files
from integration.mariadb.test_mariadb_kill import Target
from integration.support import _changes as shared
from integration.support._driver import SEED, finished_batches, kill_at_each, kill_at_random

pytestmark = pytest.mark.integration

DDL = "id BIGINT PRIMARY KEY, seq BIGINT, name VARCHAR(64), amount DOUBLE"
COLUMNS = "id, seq, name, amount"


def reference(changes: Sequence[Change]) -> list[tuple[Any, ...]]:
    """Every change applied alone in sequence order: the rows ``(id, seq, name, amount)``."""
    table: dict[int, tuple[Any, ...]] = {}
    for key, op, seq, name, amount in sorted(
            changes, key=lambda c: (c[2], c[0], c[3], c[4], c[1].lower() in shared.DELETES)):
        if op.lower() in shared.DELETES:
            table.pop(key, None)
        else:
            table[key] = (key, seq, name, amount)
    return [table[k] for k in sorted(table)]


class ChangesTarget(Target):
    """A kill test's :class:`Target` whose table has the change stream's columns."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.execute(f"DROP TABLE {self.sql()}")
        self.execute(f"CREATE TABLE {self.sql()} ({DDL}) ENGINE=InnoDB")

    def rows(self, table: str | None = None) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.execute(
            f"SELECT {COLUMNS} FROM {self.sql(table)} ORDER BY id")]

    def assert_exact(self, changes: Sequence[Change], *, prepared: bool = False) -> None:
        expected, actual = reference(changes), self.rows()
        assert expected or not changes, "the reference is empty: all deleted?"
        wrong = [(a, e) for a, e in zip(actual, expected, strict=False) if a != e]
        assert len(actual) == len(expected) and not wrong, (len(actual), len(expected),
                                                            wrong[:5])
        if not prepared:
            assert self.prepared() == [], "nothing of the sink left prepared"


@pytest.fixture
def target(mariadb_url: str) -> Iterator[ChangesTarget]:
    t = ChangesTarget(mariadb_url)
    yield t
    t.cleanup()


# ------------------------------------------------------------------ killed drivers

@pytest.mark.slow
def test_change_stream_killed_at_every_driver_point_and_at_random_is_exact(
        tmp_path: Path, target: ChangesTarget) -> None:
    job = shared.ChangesJob(tmp_path, target, "examples.stream_to_mariadb",
                            ["--changes", "--source", "files", "--url", target.url])
    per_file = [make_change_files(job.input, f, 1, shared.ROWS_PER_FILE)
                for f in range(shared.FILES)]
    shared.assert_stream_has_every_case(per_file)
    changes = [c for file in per_file for c in file]
    plan = [(point, target.sink_id, batch) for batch, point in enumerate(shared.DRIVER_POINTS)]
    after_kill = shared.holds_what_the_point_stands_for(
        target, per_file, lambda done: target.assert_exact(done, prepared=True))
    runs = kill_at_each(job, plan, after_kill=after_kill)
    assert [r.returncode for r in runs] == [-9] * len(plan) + [0]
    target.assert_exact(changes)
    assert target.ledger_states() == dict.fromkeys(range(shared.FILES), "COMMITTED")

    # More of the stream, killed at a random moment while the driver writes.
    more = 3
    changes += make_change_files(job.input, shared.FILES, more, shared.ROWS_PER_FILE)
    kill_at_random(job, progress=lambda: len(target.ledger_states()), runs=1,
                   max_delay=1.0, seed=SEED)
    # Spark's micro-batches, not the files: a kill can put two files in one batch.
    batches = finished_batches(job.checkpoint)
    assert target.ledger_states() == dict.fromkeys(range(batches), "COMMITTED")
    assert batches <= shared.FILES + more, batches
    target.assert_exact(changes)


# ------------------------------------------------------------------ in-process, no Spark

def data(changes: Sequence[Change]) -> pa.Table:
    return pa.table({"id": pa.array([c[0] for c in changes], pa.int64()),
                     "op": pa.array([c[1] for c in changes], pa.string()),
                     "seq": pa.array([c[2] for c in changes], pa.int64()),
                     "name": pa.array([c[3] for c in changes], pa.string()),
                     "amount": pa.array([c[4] for c in changes], pa.float64())})


def sink_for(t: ChangesTarget, **options: Any) -> MariaDBSink:
    options.setdefault("op_column", "op")
    options.setdefault("key_columns", ["id"])
    return MariaDBSink(t.url, options.pop("table", t.table), sink_id=t.sink_id,
                       ledger_table=t.ledger, mode="changes", sequence_column="seq",
                       **options)


def stream_of(tmp_path: Path, first: int) -> list[Change]:
    return make_change_files(tmp_path / f"in-{first}", first, 1, 300, keys=60)


def test_replays_bad_ops_and_the_fixed_rerun(tmp_path: Path, target: ChangesTarget) -> None:
    run0 = stream_of(tmp_path, 0)
    assert len({c[0] for c in run0}) < len(run0), "several changes of a key in the batch"
    sink = sink_for(target)
    try:
        sink.write_batch(LocalBatch(data(run0), partitions=3), 0)
        target.assert_exact(run0)
        before = target.rows()
        # The same changes again (other partitions, other order): nothing written twice.
        sink.write_batch(LocalBatch(data(list(reversed(run0))), partitions=2), 0)
        assert sink.last_metrics is not None and sink.last_metrics.outcome == "replayed"
        # Other changes under the same batch id: another op, then another sequence value.
        i = next(i for i, c in enumerate(run0) if c[1].lower() not in shared.DELETES)
        for changed in ((*run0[i][:1], "d", *run0[i][2:]),
                        (*run0[i][:2], 10**9, *run0[i][3:])):
            other = [*run0[:i], changed, *run0[i + 1:]]
            with pytest.raises(NonDeterministicReplayError, match="on_replay_mismatch"):
                sink.write_batch(LocalBatch(data(other), partitions=3), 0)
            assert target.rows() == before and not target.prepared()

        # An unknown op, a NULL op, a NULL sequence: the batch fails, nothing committed.
        run1 = stream_of(tmp_path, 1)
        bad = [*run1[:5], (run1[5][0], "merge-secret", *run1[5][2:]), *run1[6:]]
        with pytest.raises(BadInputError) as err:
            sink.write_batch(LocalBatch(data(bad), partitions=3), 1)
        text = str(err.value)
        assert "op_column 'op'" in text and "'d'" in text and "merge-secret" not in text, text
        null_op = data(run1).set_column(1, "op", pa.array(
            [None if k == 7 else c[1] for k, c in enumerate(run1)], pa.string()))
        with pytest.raises(BadInputError, match="op_column 'op' holds 1 value"):
            sink.write_batch(LocalBatch(null_op, partitions=3), 1)
        null_seq = data(run1).set_column(2, "seq", pa.array(
            [None if k == 9 else c[2] for k, c in enumerate(run1)], pa.int64()))
        with pytest.raises(BadInputError, match="sequence_column 'seq' is NULL"):
            sink.write_batch(LocalBatch(null_seq, partitions=3), 1)
        assert 1 not in target.ledger_states() and not target.prepared()
        assert target.rows() == before

        sink.write_batch(LocalBatch(data(run1), partitions=3, fail_first_attempt=[1]), 1)
        assert sink.last_metrics is not None and sink.last_metrics.outcome == "committed"
        target.assert_exact(run0 + run1)
    finally:
        sink.close()


def test_spark_batch_jobs_replay_refuse_a_bad_op_and_rerun_exact(
        spark: SparkSession, tmp_path: Path, target: ChangesTarget) -> None:
    """The same through Spark (``sink(df, batch_id)``: the driver routes the keys, Spark's
    tasks prepare): a replay in another order and partitioning commits nothing twice; an
    unknown op fails the batch in its tasks, nothing committed, nothing left prepared;
    the fixed rerun is exact."""
    from examples.stream_changes_to_postgres import CHANGE_SCHEMA

    first, second = stream_of(tmp_path, 0), stream_of(tmp_path, 1)
    sink = sink_for(target)
    try:
        sink(spark.createDataFrame(first, CHANGE_SCHEMA).repartition(3), 0)
        sink(spark.createDataFrame(first[::-1], CHANGE_SCHEMA).repartition(2), 0)
        assert sink.last_metrics is not None and sink.last_metrics.outcome == "replayed"
        target.assert_exact(first)
        wrong = [(*c[:1], "upsert?" if n == 17 else c[1], *c[2:]) for n, c in enumerate(second)]
        with pytest.raises(BadInputError, match="op_column 'op' holds 1 value"):
            sink(spark.createDataFrame(wrong, CHANGE_SCHEMA).repartition(3), 1)
        assert 1 not in target.ledger_states() and target.prepared() == []
        target.assert_exact(first)
        sink(spark.createDataFrame(second, CHANGE_SCHEMA).repartition(3), 1)
        assert sink.last_metrics is not None and sink.last_metrics.outcome == "committed"
    finally:
        sink.close()
    target.assert_exact(first + second)


def test_deletes_with_null_columns_into_not_null_columns(target: ChangesTarget) -> None:
    """Debezium's deletes may carry NULL but for the key: the delete is by the key alone,
    even when the table's other columns are NOT NULL."""
    target.execute(f"ALTER TABLE {target.sql()} MODIFY name VARCHAR(64) NOT NULL, "
                   "MODIFY amount DOUBLE NOT NULL, MODIFY seq BIGINT NOT NULL")
    sink = sink_for(target)
    try:
        sink.write_batch(LocalBatch(data([(k, "c", k, f"n{k}", k * 1.0) for k in range(6)]),
                                    partitions=2), 0)
        deletes = pa.table({"id": pa.array([1, 3, 99, 4, 4], pa.int64()),
                            "op": ["d", "D", "delete", "u", "d"],
                            "seq": pa.array([10, 10, 10, 11, 12], pa.int64()),
                            "name": pa.array([None, None, None, "back", None], pa.string()),
                            "amount": pa.array([None, None, None, 4.5, None], pa.float64())})
        sink.write_batch(LocalBatch(deletes, partitions=2), 1)
    finally:
        sink.close()
    assert target.rows() == [(0, 0, "n0", 0.0), (2, 2, "n2", 2.0), (5, 5, "n5", 5.0)]
    assert target.prepared() == []


def test_op_column_written_when_the_table_has_it_and_boolean_flags(
        tmp_path: Path, target: ChangesTarget) -> None:
    changes = stream_of(tmp_path, 0)
    target.execute(f"ALTER TABLE {target.sql()} ADD COLUMN op VARCHAR(8)")
    sink = sink_for(target)
    try:
        sink.write_batch(LocalBatch(data(changes), partitions=3), 0)
    finally:
        sink.close()
    target.assert_exact(changes)
    ops = dict(target.execute(f"SELECT id, op FROM {target.sql()}"))
    assert ops and all(op.lower() not in shared.DELETES for op in ops.values()), ops

    # A boolean "deleted" flag, into a table the sink creates: seq created, the flag not.
    created = f"{target.table}_flag"
    flagged = data(changes).set_column(1, "deleted", pa.array(
        [c[1].lower() in shared.DELETES for c in changes], pa.bool_()))
    flags = sink_for(target, table=created, op_column="deleted", create_table=True)
    try:
        flags.write_batch(LocalBatch(flagged, partitions=3), 1)
        flags.close()
        cols = target.execute("SELECT column_name FROM information_schema.columns WHERE "
                              "table_schema = DATABASE() AND table_name = %s ORDER BY "
                              "ordinal_position", (created,))
        assert [c for c, in cols] == ["id", "seq", "name", "amount"]
        assert target.rows(created) == target.rows()
    finally:
        target.execute(f"DROP TABLE IF EXISTS {target.sql(created)}")


def test_composite_keys_across_partitions_and_retries(target: ChangesTarget) -> None:
    """A composite key (its index in another column order), a boolean flag and string
    sequence values; each batch over partitions, a failed first attempt retried. The table
    after every batch equals applying the changes one by one."""
    table = f"{target.table}_pair"
    target.execute(f"CREATE TABLE {target.sql(table)} (a BIGINT, b VARCHAR(8), v BIGINT, "
                   "PRIMARY KEY (b, a))")
    sink = MariaDBSink(target.url, table, sink_id=target.sink_id, ledger_table=target.ledger,
                       mode="changes", key_columns=["a", "b"], op_column="gone",
                       sequence_column="at")
    rng, state = random.Random(7), {}
    try:
        for batch_id in range(3):
            rows = [(rng.randrange(5), rng.choice("xy"), rng.random() < 0.3,
                     f"{batch_id:02d}-{i:05d}", i + 100 * batch_id) for i in range(200)]
            for a, b, gone, _, v in rows:  # in sequence order already
                if gone:
                    state.pop((a, b), None)
                else:
                    state[(a, b)] = v
            shuffled = rows[:]
            rng.shuffle(shuffled)
            t = pa.table({"a": [r[0] for r in shuffled], "b": [r[1] for r in shuffled],
                          "gone": [r[2] for r in shuffled], "at": [r[3] for r in shuffled],
                          "v": [r[4] for r in shuffled]})
            sink.write_batch(LocalBatch(t, partitions=3, fail_first_attempt=[1]), batch_id)
            got = target.execute(f"SELECT a, b, v FROM {target.sql(table)} ORDER BY a, b")
            assert [tuple(r) for r in got] == [(a, b, v) for (a, b), v in
                                               sorted(state.items())], batch_id
        assert target.prepared() == []
    finally:
        sink.close()
        target.execute(f"DROP TABLE IF EXISTS {target.sql(table)}")


def test_key_columns_need_a_unique_index(tmp_path: Path, target: ChangesTarget) -> None:
    loose = f"{target.table}_loose"
    target.execute(f"CREATE TABLE {target.sql(loose)} (id BIGINT, seq BIGINT, "
                   "name VARCHAR(64), amount DOUBLE)")
    try:
        sink = sink_for(target, table=loose)
        with pytest.raises(BadInputError, match="ADD UNIQUE"):
            sink.write_batch(LocalBatch(data(stream_of(tmp_path, 0)), partitions=2), 0)
        with pytest.raises(BadInputError, match="op_column 'op' is int64"):
            sink.write_batch(LocalBatch(data(stream_of(tmp_path, 0)).set_column(
                1, "op", pa.array(range(300), pa.int64())), partitions=2), 0)
        sink.close()
        assert target.execute(f"SELECT COUNT(*) FROM {target.sql(loose)}")[0][0] == 0
        assert 0 not in target.ledger_states() and not target.prepared()
    finally:
        target.execute(f"DROP TABLE IF EXISTS {target.sql(loose)}")
