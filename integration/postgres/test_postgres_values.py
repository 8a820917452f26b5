"""No row values in PostgresSink's errors or logs unless ``values_in_errors=True``.

Three kinds of bad rows that PostgreSQL refuses with the row's values in its text (the
server answers in German here, see ``integration/services/``):

- a NULL into a NOT NULL column (``DETAIL: Failing row contains (...)``);
- a key that exists already (``DETAIL: Key (id)=(...) already exists``);
- a value of the wrong kind (a string that is not JSON into a ``jsonb`` column: the
  ``DETAIL`` and ``CONTEXT`` quote it).

Each row carries a unique marker. In process, the raised error (str, repr, args, pickle,
traceback, ``__cause__``/``__context__``) and every log line hold no marker by default and
hold it with ``values_in_errors=True``. Through a real streaming ``foreachBatch`` query (a
child driver: every line of Spark, the driver and the Python workers is captured) the same,
and after each fix the restarted query delivers every row exactly once.

Run as a program (``python -m integration.postgres.test_postgres_values ...``) it is that streaming
job.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import secrets
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

#: Input rows per file (one file per micro-batch).
ROWS_PER_FILE = 60


def _marker() -> int:
    """A 9-digit number that appears in no log by chance."""
    return 700_000_000 + secrets.randbelow(99_999_999)


@dataclass(frozen=True)
class Case:
    """One kind of bad row: the table, the bad row's id, what quotes it, and the fix."""

    name: str
    columns: str  # the table's DDL
    setup: str  # SQL run once after CREATE ({t} = the table), may be empty
    fix: str  # SQL that makes the bad row acceptable ({t} = the table)
    sqlstate: str
    needles: tuple[str, ...]  # what the (value-free) message must name


CASES = {
    "not_null": Case(
        "not_null", "id bigint PRIMARY KEY, name text NOT NULL, payload jsonb", "",
        "ALTER TABLE {t} ALTER COLUMN name DROP NOT NULL", "23502",
        ("NULL in a NOT NULL column", "column name", "NotNullViolation")),
    "unique": Case(
        "unique", "id bigint PRIMARY KEY, name text, payload jsonb",
        "INSERT INTO {t} (id, name) VALUES ({bad}, 'there before')",
        "DELETE FROM {t} WHERE name = 'there before'", "23505",
        ("unique constraint", "UniqueViolation")),
    "bad_type": Case(
        "bad_type", "id bigint PRIMARY KEY, name text, payload jsonb", "",
        "ALTER TABLE {t} ALTER COLUMN payload TYPE text", "22P02",
        ("a value does not fit its column", "InvalidTextRepresentation")),
}


def bad_row(case: str, marker: int) -> dict[str, Any]:
    """The row ``case`` refuses: each of its columns carries ``marker``."""
    row: dict[str, Any] = {"id": marker, "name": f"name-{marker}", "payload": "{}"}
    if case == "not_null":
        row["name"] = None
    elif case == "bad_type":
        row["payload"] = f"tok{marker}"  # not JSON: the server quotes the token
    return row


def good_rows(start: int, n: int) -> list[dict[str, Any]]:
    return [{"id": i, "name": f"n{i}", "payload": json.dumps({"i": i})}
            for i in range(start, start + n)]


# ------------------------------------------------------------------------ in process

@pytest.fixture
def pg(postgres_conninfo: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from integration.support._pg import DRIVER_PGOPTIONS, PgTarget

    monkeypatch.setenv("PGOPTIONS", DRIVER_PGOPTIONS)
    target = PgTarget(postgres_conninfo, prefix="vals")
    yield target
    target.cleanup()


def _texts(err: BaseException) -> list[str]:
    """Every text of an error and its chain, as a log or a traceback would show it."""
    texts = [str(err), repr(err), repr(err.args), repr(err.__dict__),
             "".join(traceback.format_exception(err)),
             repr(pickle.loads(pickle.dumps(err)))]
    for linked in (err.__cause__, err.__context__):
        if linked is not None:
            texts += [repr(linked), "".join(traceback.format_exception(linked))]
    return texts


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_rows_raise_errors_without_their_values_then_the_fix_delivers_once(
    case: str, spark: Any, pg: Any, caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    from psycopg import sql

    from connectors.core.errors import BadInputError
    from connectors.postgres import PostgresSink

    caplog.set_level(logging.DEBUG, logger="connectors")
    caplog.set_level(logging.DEBUG, logger="psycopg")
    c = CASES[case]
    marker = _marker()
    pg.create_table(c.columns)
    table = sql.Identifier(pg.table).as_string()
    if c.setup:
        pg.execute(c.setup.format(t=table, bad=marker))
    data = [*good_rows(0, 50), bad_row(case, marker), *good_rows(50, 49)]
    df = spark.createDataFrame(data, "id LONG, name STRING, payload STRING").repartition(2)

    def sink(values: bool) -> PostgresSink:
        return PostgresSink(pg.conninfo, pg.table, sink_id=pg.sink_id, ledger_table=pg.ledger,
                            values_in_errors=values)

    quiet = sink(False)
    with pytest.raises(BadInputError) as info:
        quiet(df, 0)
    quiet.close()
    err = info.value
    text = str(err)
    for needle in (*c.needles, f"SQLSTATE {c.sqlstate}", f"public.{pg.table}"):
        assert needle in text, (needle, text)
    captured = capfd.readouterr()
    leaks = [t for t in [*_texts(err), caplog.text, captured.out, captured.err]
             if str(marker) in t]
    assert not leaks, f"the row's value {marker} leaked: {leaks[0][-600:]}"
    assert err.__cause__ is None and err.__context__ is None
    assert 0 not in pg.ledger_states() and not pg.prepared()

    loud = sink(True)
    with pytest.raises(BadInputError) as info:
        loud(df, 0)
    loud.close()
    assert str(marker) in str(info.value), str(info.value)  # the grep above can see it
    assert 0 not in pg.ledger_states() and not pg.prepared()

    # The fix, then the same batch id: every row once.
    pg.execute(c.fix.format(t=table))
    fixed = sink(False)
    fixed(df, 0)
    fixed.close()
    assert sorted(pg.ids()) == sorted(r["id"] for r in data)
    assert pg.ledger_states() == {0: "COMMITTED"} and not pg.prepared()


# ----------------------------------------------------------------- a streaming query

@pytest.mark.slow
def test_streaming_query_logs_no_row_values_and_delivers_once_after_each_fix(
    tmp_path: Path, pg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One file per kind of bad row (batches 0, 1, 2). Each stage: the query fails on its
    batch with no marker anywhere in the driver's output (with ``values_in_errors=True``,
    tried on the first stage, the marker is there); nothing of the batch is committed;
    after the fix the restarted query passes that batch. At the end every row is there
    exactly once."""
    from integration.support._driver import run_driver, spark_batches
    from integration.support._pg import check_restart

    monkeypatch.setenv("EOS_POSTGRES_CONNINFO", pg.conninfo)
    pg.create_table("id bigint PRIMARY KEY, name text NOT NULL, payload jsonb")
    table = '"' + pg.table + '"'
    stages = ["not_null", "unique", "bad_type"]
    markers = {case: _marker() for case in stages}
    inputs = tmp_path / "in"
    inputs.mkdir()
    expected: list[int] = []
    for batch, case in enumerate(stages):
        rows = [*good_rows(batch * 1000, ROWS_PER_FILE), bad_row(case, markers[case])]
        expected += [r["id"] for r in rows]
        path = inputs / f"part-{batch:05d}.json"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.utime(path, (1_767_225_600 + 10 * batch,) * 2)  # the order Spark reads them
    pg.execute(CASES["unique"].setup.format(t=table, bad=markers["unique"]))
    checkpoint = tmp_path / "ckpt"
    args = ["--input", str(inputs), "--checkpoint", str(checkpoint), "--table", pg.table,
            "--sink-id", pg.sink_id, "--ledger-table", pg.ledger]
    module = "integration.postgres.test_postgres_values"
    for batch, case in enumerate(stages):
        marker = str(markers[case])
        quiet = run_driver(args, module=module)
        assert quiet.returncode != 0, quiet.tail()
        for needle in CASES[case].needles:
            assert needle in quiet.output, (needle, quiet.tail())
        assert "BadInputError" in quiet.output
        lines = [line for line in quiet.output.splitlines() if marker in line]
        assert not lines, f"row value {marker} in the driver's output: {lines[:3]}"
        if batch == 0:  # (once is enough to show the grep sees a value that is there)
            loud = run_driver([*args, "--values-in-errors"], module=module)
            assert loud.returncode != 0, loud.tail()
            assert marker in loud.output, loud.tail()
        offsets, commits = spark_batches(checkpoint)
        assert batch in offsets and batch not in commits
        assert batch not in pg.ledger_states() and not pg.prepared()
        first = batch * 1000
        assert not [i for i in pg.ids() if first <= i < first + ROWS_PER_FILE], (
            "rows of the failed batch were committed")
        pg.execute(CASES[case].fix.format(t=table))
    check_restart(run_driver(args, module=module))
    assert sorted(pg.ids()) == sorted(expected)
    assert pg.ledger_states() == {0: "COMMITTED", 1: "COMMITTED", 2: "COMMITTED"}
    assert not pg.prepared()


# ------------------------------------------------------------------ the job itself

def _job(argv: list[str]) -> int:
    from connectors.postgres import PostgresSink
    from examples.stream_to_files import build_session

    parser = argparse.ArgumentParser(description="files -> PostgresSink, one file a batch")
    parser.add_argument("--input", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--sink-id", required=True)
    parser.add_argument("--ledger-table", required=True)
    parser.add_argument("--values-in-errors", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    logging.getLogger("connectors").setLevel(logging.DEBUG)
    sink = PostgresSink(os.environ["EOS_POSTGRES_CONNINFO"], args.table, sink_id=args.sink_id,
                        ledger_table=args.ledger_table, values_in_errors=args.values_in_errors)
    spark = build_session("local[2]", ["spark.app.name=connectors-values-in-errors"])
    try:
        df = (spark.readStream.schema("id LONG, name STRING, payload STRING")
              .option("maxFilesPerTrigger", 1).json(args.input))
        query = (df.writeStream.foreachBatch(sink)
                 .option("checkpointLocation", args.checkpoint)
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination()
        except Exception as exc:  # the query's error, with everything chained to it
            print("".join(traceback.format_exception(exc)), file=sys.stderr)
            return 1
        return 0
    finally:
        sink.close()
        spark.stop()


if __name__ == "__main__":
    sys.exit(_job(sys.argv[1:]))
