"""PostgresSink error cases on a real PostgreSQL: clear messages, nothing committed, no
transaction left prepared, and after the fix the same batch writes every row exactly once.

Most cases are batch-job calls ``sink(df, batch_id)`` in one small in-process SparkSession
(``local[2]``). The password case also runs a streaming driver (a child process, so every
log line of Spark, the driver and the Python workers is captured) and restarts it after
the fix from the same checkpoint.
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from connectors.core.errors import (
    BadInputError,
    ConfigurationError,
    ConnectorError,
    NonDeterministicReplayError,
    RetriesExhaustedError,
)
from connectors.postgres import PostgresSink
from connectors.postgres._errors import CannotConnectError, translate
from connectors.postgres._reach import TargetDownError
from examples.stream_to_files import make_input_files
from integration import services
from integration.support._driver import run_driver, spark_batches
from integration.support._pg import DRIVER_PGOPTIONS, PgTarget, check_restart, connect, token

pytestmark = pytest.mark.integration

ROWS, PARTITIONS = 400, 4


@pytest.fixture
def pg(postgres_conninfo: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[PgTarget]:
    # The sinks' driver connections: a lock wait fails instead of hanging the test.
    monkeypatch.setenv("PGOPTIONS", DRIVER_PGOPTIONS)
    target = PgTarget(postgres_conninfo, prefix="err")
    yield target
    target.cleanup()


def events(spark: SparkSession, n: int = ROWS, partitions: int = PARTITIONS) -> DataFrame:
    """``id, name, amount, ts`` with ids ``0..n-1`` in ``partitions`` partitions."""
    return spark.range(0, n, 1, partitions).select(
        F.col("id"),
        F.concat(F.lit("name-"), F.col("id").cast("string")).alias("name"),
        (F.col("id") * F.lit(0.25)).alias("amount"),
        F.timestamp_seconds(F.lit(1767225600) + F.col("id")).alias("ts"),
    )


def sink_for(pg: PgTarget, conninfo: str | None = None, table: str | None = None,
             **options: Any) -> PostgresSink:
    return PostgresSink(conninfo or pg.conninfo, table or pg.table, sink_id=pg.sink_id,
                        ledger_table=pg.ledger, **options)


def assert_not_committed(pg: PgTarget, batch_id: int = 0, table: str | None = None) -> None:
    """The batch left nothing: no decision, no prepared transaction, no row."""
    assert batch_id not in pg.ledger_states()
    assert not pg.prepared(), pg.prepared()
    name = table or pg.table
    if pg.exists(name):
        assert pg.count(name) == 0


def fails(call: Any, error: type[ConnectorError], *needles: str) -> ConnectorError:
    """``call()`` raises ``error`` whose message holds every needle (case-insensitive)."""
    with pytest.raises(error) as info:
        call()
    text = str(info.value)
    for needle in needles:
        assert needle.lower() in text.lower(), f"{needle!r} not in {text!r}"
    return info.value


# ------------------------------------------------------------- the server's language


def test_the_test_server_answers_in_german_and_errors_go_by_sqlstate(
    postgres_conninfo: str, eos_services: Any
) -> None:
    """The proof that no error test passes by matching English text: the server's own
    words are German (``lc_messages``, set by integration/services/). Only where the
    services recorded why the German locale could not be had does the proof fall back to
    SQLSTATE-only, and says so."""
    with connect(postgres_conninfo) as conn:
        (lc_messages,), = conn.execute("SHOW lc_messages").fetchall()
        with pytest.raises(psycopg.errors.DivisionByZero) as info:
            conn.execute("SELECT 1 / 0")
    exc = info.value
    assert exc.sqlstate == "22012"
    err = translate(exc, doing="dividing")
    assert "SQLSTATE 22012" in str(err) and "durch Null" not in str(err)  # no server text
    if str(lc_messages).startswith("de_DE"):
        assert exc.diag.message_primary == "Division durch Null", exc.diag.message_primary
        return
    if eos_services.is_native("postgres"):
        _, fallback = services.postgres_messages()
    elif os.environ.get("CI", "").strip().lower() not in ("1", "true", "yes"):
        # A server of the developer's (docker/, EOS_POSTGRES_CONNINFO): CI runs the proof.
        fallback = "not the test cluster of integration/services/ (which answers in German)"
    else:
        fallback = None
    if fallback:
        print(f"\nFALLBACK (SQLSTATE-only proof): the test server answers in {lc_messages!r}, "
              f"not German, because: {fallback}")
        return
    pytest.fail(f"the PostgreSQL under test answers in {lc_messages!r}, not German, and no "
                "reason was recorded: run `scripts/services start` (it generates the "
                "de_DE.UTF-8 locale and sets lc_messages), or point EOS_POSTGRES_CONNINFO at "
                "a server with lc_messages = 'de_DE.UTF-8'")


# ----------------------------------------------------------------- server configuration


def test_too_many_tasks_for_max_prepared_transactions_then_coalesce(
    spark: SparkSession, pg: PgTarget
) -> None:
    pg.create_table()
    (limit,), = pg.execute("SHOW max_prepared_transactions")
    sink = sink_for(pg)
    wide = events(spark, ROWS, int(limit) + 36)  # more tasks than the server can prepare
    err = fails(lambda: sink(wide, 0), ConfigurationError, "max_prepared_transactions",
                f"is {limit}", f"below the {int(limit) + 36} task", "postgresql.conf",
                "restart PostgreSQL")
    assert err.batch_id is None or err.batch_id == 0
    assert_not_committed(pg)
    # The fix: fewer tasks per batch.
    sink(wide.coalesce(PARTITIONS), 0)
    pg.assert_exact(ROWS)
    assert sink.last_metrics is not None and sink.last_metrics.tasks == PARTITIONS
    sink.close()


# ------------------------------------------------------------------------- replays


def test_a_replay_with_other_rows_is_refused_and_the_same_rows_split_otherwise_are_not(
    spark: SparkSession, pg: PgTarget
) -> None:
    # PostgresSink's tasks fingerprint what they write; a replay is fingerprinted by a
    # separate job over the replayed DataFrame: both must agree on the same rows however
    # Spark splits them, and disagree on other rows.
    pg.create_table()
    first = sink_for(pg)
    first(events(spark), 0)
    pg.assert_exact(ROWS)
    first.close()
    # A new driver run replays batch 0 with one changed value: refused, nothing written.
    changed = events(spark).withColumn(
        "name", F.when(F.col("id") == 17, F.lit("other")).otherwise(F.col("name")))
    replay = sink_for(pg)
    fails(lambda: replay(changed, 0), NonDeterministicReplayError, "not deterministic",
          "on_replay_mismatch")
    pg.assert_exact(ROWS)
    assert pg.rows()[17][1] == "name-17"  # the committed rows stay
    assert pg.ledger_states() == {0: "COMMITTED"}
    assert not pg.prepared(), pg.prepared()
    # The same rows in other partitions and another order: a replay, nothing written twice.
    same = events(spark).repartition(3).orderBy(F.desc("id"))
    replay(same, 0)
    assert replay.last_metrics is not None and replay.last_metrics.outcome == "replayed"
    pg.assert_exact(ROWS)
    replay.close()


# -------------------------------------------------------------------- table and schema


def test_missing_table_then_create_table_creates_it(spark: SparkSession, pg: PgTarget) -> None:
    df = events(spark)
    sink = sink_for(pg)
    fails(lambda: sink(df, 0), BadInputError, f"table public.{pg.table} does not exist",
          "create_table=True")
    assert not pg.exists(pg.table)
    assert_not_committed(pg)
    sink.close()
    # The fix: let the sink create it (same sink id, same batch id).
    sink = sink_for(pg, create_table=True)
    sink(df, 0)
    columns = pg.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = 'public' AND table_name = %s ORDER BY ordinal_position",
        [pg.table])
    assert columns == [("id", "bigint"), ("name", "text"), ("amount", "double precision"),
                       ("ts", "timestamp with time zone")]
    pg.assert_exact(ROWS)
    assert pg.rows()[7] == (7, "name-7", 1.75, pg.rows()[7][3])
    sink.close()


def test_missing_column_then_add_it(spark: SparkSession, pg: PgTarget) -> None:
    pg.create_table("id bigint NOT NULL, amount double precision, ts timestamptz")
    sink = sink_for(pg)
    df = events(spark)
    fails(lambda: sink(df, 0), BadInputError, "column 'name'", "does not exist",
          "add it to the table or drop it from the DataFrame")
    assert_not_committed(pg)
    pg.execute(sql.SQL("ALTER TABLE {} ADD COLUMN name text").format(sql.Identifier(pg.table)))
    sink(df, 0)
    pg.assert_exact(ROWS)
    assert sorted(r[0] for r in pg.execute(
        sql.SQL("SELECT name FROM {}").format(sql.Identifier(pg.table)))) == sorted(
        f"name-{i}" for i in range(ROWS))
    sink.close()


def test_string_into_integer_column_then_cast(spark: SparkSession, pg: PgTarget) -> None:
    pg.create_table("id integer NOT NULL, name text, amount double precision, ts timestamptz")
    sink = sink_for(pg)
    as_text = events(spark).withColumn("id", F.col("id").cast("string"))
    fails(lambda: sink(as_text, 0), BadInputError, "column 'id'", "integer", "incompatible",
          "cast the column")
    assert_not_committed(pg)
    # The fix: cast in the DataFrame.
    sink(as_text.withColumn("id", F.col("id").cast("int")), 0)
    pg.assert_exact(ROWS)
    sink.close()


def test_bigint_overflowing_integer_column_then_widen_it(
    spark: SparkSession, pg: PgTarget
) -> None:
    """A value that does not fit is a safe-cast error in its task (never a wrapped
    number); the batch's other tasks had prepared: the driver rolls them back."""
    pg.create_table("id bigint NOT NULL, qty integer")
    big = 3_000_000_000  # > 2**31 - 1
    df = spark.range(0, ROWS, 1, PARTITIONS).select(
        "id", F.when(F.col("id") >= ROWS - 10, F.col("id") + big).otherwise(F.col("id"))
        .alias("qty"))
    sink = sink_for(pg)
    err = fails(lambda: sink(df, 0), BadInputError, "does not fit", f"public.{pg.table}",
                "column 'qty' (integer)")
    assert err.batch_id == 0
    assert str(big)[:8] not in str(err)  # the value (3000000390...) is not quoted
    assert_not_committed(pg)
    assert sink.last_metrics is not None and sink.last_metrics.outcome == "failed"
    # The fix: a column wide enough.
    pg.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN qty TYPE bigint").format(
        sql.Identifier(pg.table)))
    sink(df, 0)
    pg.assert_exact(ROWS)
    assert max(q for _, q in pg.rows("id, qty")) == ROWS - 1 + big
    sink.close()


def test_null_into_not_null_column_then_fill_it(spark: SparkSession, pg: PgTarget) -> None:
    pg.create_table("id bigint NOT NULL, name text NOT NULL, amount double precision, "
                    "ts timestamptz")
    sink = sink_for(pg)
    df = events(spark).withColumn(
        "name", F.when(F.col("id") % 7 == 3, F.lit(None)).otherwise(F.col("name")))
    fails(lambda: sink(df, 0), BadInputError, "NULL in a NOT NULL column", "column name",
          f"table public.{pg.table}", "NotNullViolation", "SQLSTATE 23502")
    assert_not_committed(pg)
    # The fix: no NULLs in the DataFrame.
    sink(df.fillna({"name": "unknown"}), 0)
    pg.assert_exact(ROWS)
    assert pg.execute(sql.SQL("SELECT count(*) FROM {} WHERE name = 'unknown'").format(
        sql.Identifier(pg.table))) == [(len([i for i in range(ROWS) if i % 7 == 3]),)]
    sink.close()


def test_table_name_with_sql_is_just_a_missing_table(spark: SparkSession, pg: PgTarget) -> None:
    victim = f"y_{pg.suffix}"
    pg.create_table("v int", name=victim)
    pg.execute(sql.SQL("INSERT INTO {} VALUES (1)").format(sql.Identifier(victim)))
    evil = f'x"; drop table {victim}; --'
    df = events(spark)
    sink = sink_for(pg, table=evil)
    fails(lambda: sink(df, 0), BadInputError, "does not exist", "create_table=True")
    assert pg.exists(victim) and pg.count(victim) == 1
    assert_not_committed(pg, table=evil)
    sink.close()
    try:
        # Even created and written, the name stays one quoted identifier.
        sink = sink_for(pg, table=evil, create_table=True)
        sink(df, 0)
        pg.assert_exact(ROWS, table=evil)
        assert pg.exists(victim) and pg.count(victim) == 1
        sink.close()
    finally:
        pg.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(evil)))
        pg.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(victim)))


# ----------------------------------------------------------------------- connections


def _with_password(conninfo: str, password: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(conninfo)
    params["password"] = password
    return psycopg.conninfo.make_conninfo("", **params)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_wrong_password_then_the_right_one(
    spark: SparkSession, pg: PgTarget, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="connectors")
    pg.create_table()
    wrong = f"Wr0ng-{token()}{token()}"
    sink = sink_for(pg, conninfo=_with_password(pg.conninfo, wrong))
    err = fails(lambda: sink(events(spark), 0), ConfigurationError,
                "cannot connect or authenticate", "check host, user, password, dbname")
    assert isinstance(err, CannotConnectError)
    for text in (str(err), repr(err), repr(sink), str(sink.conninfo), caplog.text,
                 "".join(traceback.format_exception(err))):
        assert wrong not in text
    assert_not_committed(pg)
    sink.close()
    sink = sink_for(pg)
    sink(events(spark), 0)
    pg.assert_exact(ROWS)
    sink.close()


def test_unreachable_server_is_waited_for_then_named_with_the_bound_then_the_right_address(
    spark: SparkSession, pg: PgTarget
) -> None:
    """No server at the port: it may be restarting (PQping: no answer), so the batch waits
    within ``outage_timeout``, then fails naming the target, the bound and host and port
    as the thing to check. The password stays out of it."""
    pg.create_table()
    params = psycopg.conninfo.conninfo_to_dict(pg.conninfo)
    port = _closed_port()
    bad = psycopg.conninfo.make_conninfo("", **{**params, "port": str(port)})
    sink = sink_for(pg, conninfo=bad, connect_timeout=5, outage_timeout=4)
    started = time.monotonic()
    err = fails(lambda: sink(events(spark), 0), RetriesExhaustedError,
                f"PostgreSQL 127.0.0.1:{port}", "past the sink's outage_timeout (4 s)",
                "TargetDownError", f"no PostgreSQL server answers at 127.0.0.1:{port}",
                "check host and port")
    took = time.monotonic() - started
    assert 2 < took < 30, took
    assert isinstance(err, RetriesExhaustedError) and err.attempts >= 2
    password = str(params.get("password"))  # here equal to the user name: check the slots
    assert f"password={password}" not in str(err) and f":{password}@" not in str(err)
    assert_not_committed(pg)
    sink.close()
    # Without riding out (outage_timeout=0) the first failure ends the batch as it is.
    sink = sink_for(pg, conninfo=bad, connect_timeout=5, outage_timeout=0)
    err = fails(lambda: sink(events(spark), 0), TargetDownError, "check host and port")
    assert "password=***" in str(err) and f"password={password}" not in str(err)
    sink.close()
    sink = sink_for(pg)
    sink(events(spark), 0)
    pg.assert_exact(ROWS)
    sink.close()


# ----------------------------------------------------------------- the password, nowhere


@pytest.fixture
def secret_role(pg: PgTarget) -> Iterator[tuple[str, str, str]]:
    """A role whose password is unique to this test: (role, password, conninfo)."""
    role = f"eos_secret_role_{pg.suffix}"
    password = f"S3cr3t-{token()}{token()}"
    (db,), = pg.execute("SELECT current_database()")
    with connect(pg.conninfo) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(password)))
        # What the sink needs: create its ledger tables, write the target table.
        conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
            sql.Identifier(db), sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA public TO {}").format(
            sql.Identifier(role)))
    params = psycopg.conninfo.conninfo_to_dict(pg.conninfo)
    conninfo = psycopg.conninfo.make_conninfo("", **{**params, "user": role, "password": password})
    yield role, password, conninfo
    pg.cleanup()  # before the role's tables go: roll back what it prepared
    with connect(pg.conninfo) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def test_password_never_in_reprs_errors_or_logs(
    spark: SparkSession, pg: PgTarget, secret_role: tuple[str, str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="connectors")
    role, password, conninfo = secret_role
    pg.create_table()
    pg.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(
        sql.Identifier(pg.table), sql.Identifier(role)))
    texts: list[str] = []

    def record(err: BaseException) -> None:
        texts.extend([str(err), repr(err), "".join(traceback.format_exception(err)),
                      repr(err.__dict__)])
        if isinstance(err, ConnectorError):  # travels from tasks to the driver pickled
            texts.append(repr(pickle.loads(pickle.dumps(err))))

    sink = sink_for(pg, conninfo=conninfo)
    texts += [repr(sink), str(sink.conninfo), repr(sink.conninfo), sink.conninfo.redacted()]
    assert sink.conninfo.secret == conninfo  # the only place that holds it

    # 1. The role may not insert: the tasks' COPY is refused. (Whatever type the error has
    #    here -- see test_permission_denied_in_tasks_then_grant -- it must not hold it.)
    with pytest.raises(Exception, match="permission denied") as info:
        sink(events(spark), 0)
    record(info.value)
    assert_not_committed(pg)
    # 2. The wrong password for the role.
    wrong = sink_for(pg, conninfo=conninfo.replace(password, password + "x"))
    record(fails(lambda: wrong(events(spark), 0), CannotConnectError,
                 "cannot connect or authenticate"))
    texts.append(repr(wrong))
    # 3. The right password, an unreachable port.
    params = psycopg.conninfo.conninfo_to_dict(conninfo)
    away = sink_for(pg, conninfo=psycopg.conninfo.make_conninfo(
        "", **{**params, "port": str(_closed_port())}), outage_timeout=2)
    record(fails(lambda: away(events(spark), 0), RetriesExhaustedError,
                 "no PostgreSQL server answers"))
    # 4. Bad input.
    record(fails(lambda: sink(events(spark).withColumn("extra", F.lit(1)), 0), BadInputError,
                 "column 'extra'"))
    texts.append(caplog.text)
    leaks = [t for t in texts if password in t]
    assert not leaks, f"the password leaked into {len(leaks)} text(s): {leaks[0][:300]}"
    assert_not_committed(pg)

    # The fix: grant INSERT; the same batch id writes every row once.
    pg.execute(sql.SQL("GRANT INSERT ON {} TO {}").format(
        sql.Identifier(pg.table), sql.Identifier(role)))
    sink(events(spark), 0)
    pg.assert_exact(ROWS)
    assert password not in caplog.text
    for s in (sink, wrong, away):
        s.close()


def test_permission_denied_in_tasks_then_grant(
    spark: SparkSession, pg: PgTarget, secret_role: tuple[str, str, str]
) -> None:
    """The role may read the table but not insert: the tasks' COPY is refused. A
    deterministic error: the caller gets ConfigurationError naming the fix, not a retried
    task's traceback."""
    role, password, conninfo = secret_role
    pg.create_table()
    pg.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(
        sql.Identifier(pg.table), sql.Identifier(role)))
    sink = sink_for(pg, conninfo=conninfo)
    try:
        err = fails(lambda: sink(events(spark), 0), ConfigurationError, "permission denied",
                    "grant the sink's role")
        assert err.batch_id == 0 and password not in str(err)
        assert_not_committed(pg)
        pg.execute(sql.SQL("GRANT INSERT ON {} TO {}").format(
            sql.Identifier(pg.table), sql.Identifier(role)))
        sink(events(spark), 0)
        pg.assert_exact(ROWS)
    finally:
        sink.close()


def test_streaming_driver_permission_denied_logs_no_password_then_restart_is_exact(
    tmp_path: Path, pg: PgTarget, secret_role: tuple[str, str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real streaming driver fails on a missing privilege: every line it, Spark and the
    Python workers logged is free of the password; after the GRANT the restarted query
    (same checkpoint, same batch) writes every row exactly once."""
    role, password, conninfo = secret_role
    pg.create_table()
    pg.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(
        sql.Identifier(pg.table), sql.Identifier(role)))
    monkeypatch.setenv("EOS_POSTGRES_CONNINFO", conninfo)
    monkeypatch.setenv("PGOPTIONS", DRIVER_PGOPTIONS)
    total = make_input_files(tmp_path / "in", 2, 300)
    checkpoint = tmp_path / "ckpt"
    args = ["--source", "files", "--input", str(tmp_path / "in"), "--checkpoint",
            str(checkpoint), "--table", pg.table, "--sink-id", pg.sink_id,
            "--ledger-table", pg.ledger]
    first = run_driver(args, module="examples.stream_to_postgres")
    assert first.returncode != 0, first.tail()
    assert "permission denied" in first.output and "grant the sink's role" in first.output
    assert password not in first.output, "the password is in the driver's output"
    offsets, commits = spark_batches(checkpoint)
    assert 0 in offsets and 0 not in commits
    assert_not_committed(pg)

    pg.execute(sql.SQL("GRANT INSERT ON {} TO {}").format(
        sql.Identifier(pg.table), sql.Identifier(role)))
    second = run_driver(args, module="examples.stream_to_postgres")
    check_restart(second)
    assert password not in second.output
    pg.assert_exact(total)
    assert set(pg.ledger_states().values()) == {"COMMITTED"}
