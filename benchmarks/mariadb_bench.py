"""MariaDBSink vs Spark's JDBC writer vs a plain LOAD DATA, side by side (issue 54).

Run from the repository root with a MariaDB from ``scripts/services start --only mariadb``
(``.services.env``) or ``--url``::

    python -m benchmarks.mariadb_bench          # 500,000 rows, 4 partitions, 8 rounds, per
                                                # Connector/J version (3.5.11, 2.7.15)
    python -m benchmarks.mariadb_bench --jdbc-version 3.5.11   # one version (one Spark)
    python -m benchmarks.mariadb_bench --quick  # 100,000 rows, 2 rounds: no verdict
    python -m benchmarks.mariadb_bench --smoke  # 2,000 rows, 1 round: every contender and
                                                # check, no verdict (CI's smoke test)

The same cached DataFrame (``--rows`` rows of ``id bigint, qty int, amount double, price
decimal(12,2), name varchar, ts timestamp, flag boolean`` in ``--partitions`` partitions,
materialised before any timing) is written by every contender, in the same Spark session
(``local[<partitions>]``), into the same table of the same server (``bench_mariadb``:
``BIGINT, INT, DOUBLE, DECIMAL(12,2), VARCHAR(64), DATETIME(6), BOOLEAN``, all ``NOT NULL``,
primary key ``id``; ``TRUNCATE`` before each write):

==================  ==========================================================================
contender           what
==================  ==========================================================================
``sink``            ``MariaDBSink(url, table, sink_id=..., mode="append")`` called
                    ``sink(df, batch_id)`` as ``foreachBatch`` calls it: per task ``XA
                    START``, the encoder's file by ``LOAD DATA LOCAL INFILE``, the warning
                    check, the receipt, ``XA PREPARE``; the driver's decision in the ledger,
                    ``XA COMMIT`` of each branch
``plain-load``      the sink's task work minus XA, ledger and receipt: ``mapInArrow`` tasks,
                    the same connection settings (``connectors.mariadb._client.connect``),
                    the same encoder (``connectors.mariadb._encode.LoadPlan``) into a
                    temporary file, ``LOAD DATA LOCAL INFILE`` in autocommit, the warning
                    count checked: at-least-once
``jdbc-<b>``        ``df.write.format("jdbc")...mode("append")`` with MariaDB Connector/J
                    (``org.mariadb.jdbc:mariadb-java-client``, from Maven Central into the
                    project's jar cache: ``benchmarks._common.fetch_maven_jar``) and
                    ``batchsize=<b>`` (``--batchsize``, default 1000, Spark's default, and
                    10000): at-least-once. Its batching option: 2.x
                    ``rewriteBatchedStatements=true`` (a batch of INSERTs rewritten into
                    multi-row INSERTs); 3.x and later have no such option (removed in 3.0)
                    and batch INSERTs through MariaDB's bulk protocol
                    (``COM_STMT_BULK_EXECUTE``), ``useBulkStmtsForInserts=true`` (3.2's
                    default, set explicitly)
==================  ==========================================================================

The JDBC URL is ``jdbc:mysql://`` (3.x: with ``permitMysqlScheme``), so that Spark picks its
MySQL dialect (backquoted identifiers; Spark 4.2 has no dialect for ``jdbc:mariadb:``); the
driver is named ``org.mariadb.jdbc.Driver``. Two versions of Connector/J share one class
name and cannot share a JVM: with more than one ``--jdbc-version`` the bench runs itself
once per version (a Spark of its own each), the sink and the plain load in each run again,
so every ratio is of contenders measured side by side in one Spark.

Order: one untimed warm-up write of every contender (20,000 rows), then ``--rounds`` rounds;
each round writes the whole DataFrame once per contender, the order rotating with the round
and every odd round the reverse of the even one before it (iceberg_bench's ``order``).
Every write is checked (count, sums of ``id``, ``qty``, ``price``, ``flag``, CRC32 of
``name`` and the microseconds of ``ts``, against Spark's): a contender that loses,
duplicates or shifts rows ends the bench with exit status 1. Nothing timed is asserted.

Reported: rows/s per contender (median, min-max over the rounds), and the sink's ratios in
rows/s, sink over each other contender, over all rounds (sum of the other's times over the
sink's) with a 95 % bootstrap interval over the round pairs (``_common.ratio_interval``),
and the median and min-max of the round ratios; the targets of issue 54 (sink >= 2x Spark's
JDBC writer at its fastest batchsize, >= 0.9x the plain load) with a verdict (met, NOT
met, or undecided while the interval holds the target; none under 4 rounds, whose interval
says nothing); the sink's call split into its phases (``last_metrics``: the prepare job,
the decision, the commits, the rest on the driver); the 1-min load before and after.
``--json FILE`` keeps every timing; ``--chart FILE`` draws the round ratios (default
``benchmarks/charts/mariadb_bench.png``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks._chart import Panel, default_chart_path, draw_chart
from benchmarks._common import (
    REPO_ROOT,
    SMOKE_NOTE,
    fetch_maven_jar,
    format_table,
    judged,
    load_service_env,
    median,
    ratio_interval,
    ratio_verdict,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["main"]

TABLE = "bench_mariadb"
LEDGER = "bench_mariadb_ledger"
JDBC_VERSIONS = ("3.5.11", "2.7.15")
TARGET_VS_JDBC, TARGET_VS_PLAIN = 2.0, 0.9  # sink rows/s over theirs, at least
DEFAULT_ROUNDS, QUICK_ROUNDS = 8, 2
MIN_JUDGED_ROUNDS = 4  # a bootstrap over fewer round pairs says nothing
WARM_ROWS = 20_000
DDL = (f"CREATE TABLE {TABLE} (id BIGINT NOT NULL PRIMARY KEY, qty INT NOT NULL, "
       "amount DOUBLE NOT NULL, price DECIMAL(12,2) NOT NULL, name VARCHAR(64) NOT NULL, "
       "ts DATETIME(6) NOT NULL, flag BOOLEAN NOT NULL) ENGINE=InnoDB")
CHECK_SQL = (f"SELECT COUNT(*), COALESCE(SUM(id), 0), COALESCE(SUM(qty), 0), "
             "COALESCE(SUM(price), 0), COALESCE(SUM(flag), 0), COALESCE(SUM(CRC32(name)), 0), "
             "COALESCE(SUM(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', ts) % 1000003), 0) "
             f"FROM {TABLE}")

Writer = Callable[["DataFrame"], None]


def make_df(spark: SparkSession, rows: int, partitions: int) -> DataFrame:
    """The bench's rows, cached and counted (nothing of their making is timed)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F  # noqa: N812

    idc = F.col("id")
    df = spark.range(0, rows, 1, partitions).select(
        idc.alias("id"),
        (idc % 1000).cast("int").alias("qty"),
        ((idc % 100_000) / F.lit(100.0)).alias("amount"),
        ((idc % 1_000_000) / F.lit(100)).cast("decimal(12,2)").alias("price"),
        F.concat(F.lit("customer-"), F.lpad((idc % 1_000_003).cast("string"), 7, "0"))
        .alias("name"),
        F.timestamp_micros(F.lit(1_700_000_000_000_000) + idc * 1001).alias("ts"),
        (idc % 3 == 0).alias("flag"),
    ).persist(StorageLevel.MEMORY_ONLY)
    df.count()
    return df


def spark_checksum(df: DataFrame) -> tuple[int, ...]:
    """What :data:`CHECK_SQL` must read back after ``df`` was written."""
    from pyspark.sql import functions as F  # noqa: N812

    row = df.agg(F.count("*"), F.sum("id"), F.sum("qty"), F.sum("price"),
                 F.sum(F.col("flag").cast("int")), F.sum(F.crc32("name")),
                 F.sum(F.unix_micros("ts") % 1_000_003)).first()
    assert row is not None
    return tuple(int(v or 0) for v in row)


def plain_load_writer(url: str) -> Writer:
    """The sink's task work without XA, ledger or receipt (see the module docstring)."""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import contextlib

        import pyarrow as pa

        from connectors.mariadb._client import connect
        from connectors.mariadb._config import Address, TableName
        from connectors.mariadb._encode import LoadPlan

        address = Address(url)
        table = TableName.parse(TABLE, address.database)
        conn = connect(address, connect_timeout=10, lock_wait_timeout=30, local_infile=True)
        rows = 0
        try:
            with tempfile.NamedTemporaryFile(prefix="mariadb-bench-", suffix=".tsv") as spool:
                plan = None
                for batch in batches:
                    if batch.num_rows:
                        plan = plan or LoadPlan.for_schema(batch.schema)
                        spool.write(memoryview(plan.encode(batch)))
                        rows += batch.num_rows
                spool.flush()
                if plan is not None:
                    cur = conn.cursor()
                    cur.execute(plan.statement((table.database, table.name), spool.name))
                    if cur.warning_count:
                        raise RuntimeError(f"plain-load: {cur.warning_count} warnings")
        finally:
            with contextlib.suppress(Exception):
                conn.close()
        yield pa.record_batch([pa.array([rows], pa.int64())], names=["rows"])

    def run(df: DataFrame) -> None:
        df.mapInArrow(task, "rows long").collect()

    return run


def jdbc_writer(url: str, props: dict[str, str], batchsize: int) -> Writer:
    def run(df: DataFrame) -> None:
        (df.write.format("jdbc").option("url", url).option("dbtable", TABLE)
         .options(**props).option("batchsize", str(batchsize)).mode("append").save())

    return run


def jdbc_url(version: str, host: str, port: int, database: str) -> tuple[str, str]:
    """(the JDBC URL, the batching option named in it) for Connector/J ``version``."""
    base = f"jdbc:mysql://{host}:{port}/{database}"
    if int(version.split(".")[0]) < 3:
        return base + "?rewriteBatchedStatements=true", "rewriteBatchedStatements=true"
    return (base + "?permitMysqlScheme&useBulkStmtsForInserts=true",
            "useBulkStmtsForInserts=true (bulk protocol)")


class Server:
    """The bench's PyMySQL connection on the driver: reset, check, versions."""

    def __init__(self, url: str) -> None:
        from connectors.mariadb._client import connect
        from connectors.mariadb._config import Address

        self.address = Address(url)
        self.conn = connect(self.address, connect_timeout=10, lock_wait_timeout=30)

    def sql(self, statement: str) -> list[tuple[Any, ...]]:
        cur = self.conn.cursor()
        cur.execute(statement)
        return list(cur.fetchall())

    def reset(self) -> None:
        self.sql(f"DROP TABLE IF EXISTS {TABLE}")
        self.sql(DDL)
        for (name,) in self.sql(f"SHOW TABLES LIKE '{LEDGER}%'"):
            self.sql(f"DROP TABLE `{name}`")

    def checksum(self) -> tuple[int, ...]:
        return tuple(int(v) for v in self.sql(CHECK_SQL)[0])


def order(kinds: list[str], round_: int) -> list[str]:
    """Rotated by the round pair; an odd round the reverse of the even one before it."""
    shift = (round_ // 2) % len(kinds)
    out = kinds[shift:] + kinds[:shift]
    return out[::-1] if round_ % 2 else out


def run_one(args: argparse.Namespace, url: str, version: str) -> dict[str, Any]:
    """One Spark with Connector/J ``version``: every contender, ``args.rounds`` rounds."""
    from connectors.mariadb._sink import MariaDBSink
    from connectors.spark import session_builder

    jar = fetch_maven_jar("org.mariadb.jdbc", "mariadb-java-client", version,
                          dirname=f"mariadb-jdbc-{version}")
    server = Server(url)
    server_version = str(server.sql("SELECT VERSION()")[0][0])
    server.reset()
    spark = session_builder("mariadb-bench", master=f"local[{args.partitions}]", components=[],
                            conf={"spark.jars": str(jar), "spark.driver.memory": "2g",
                                  "spark.sql.session.timeZone": "UTC",
                                  "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
                                  "spark.executorEnv.PYTHONPATH": str(REPO_ROOT)}).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    address = server.address
    jurl, batching = jdbc_url(version, address.host, address.port, address.database)
    props = {"driver": "org.mariadb.jdbc.Driver", "user": address.user,
             "password": address.password or ""}
    sink = MariaDBSink(url, TABLE, sink_id="bench", mode="append", ledger_table=LEDGER)
    batch_ids = iter(range(1_000_000))
    phases: list[dict[str, float]] = []  # the sink's own phase times, per call

    def sink_write(df: DataFrame) -> None:
        t0 = time.perf_counter()
        sink(df, next(batch_ids))
        metrics = sink.last_metrics
        assert metrics is not None and metrics.outcome == "committed", metrics
        phases.append({"call_ms": (time.perf_counter() - t0) * 1000,
                       "prepare_ms": metrics.prepare_ms, "decide_ms": metrics.decide_ms,
                       "commit_ms": metrics.commit_ms})

    writers: dict[str, Writer] = {"sink": sink_write, "plain-load": plain_load_writer(url)}
    for size in args.batchsize:
        writers[f"jdbc-{size}"] = jdbc_writer(jurl, props, size)
    kinds = list(writers)
    load_before = os.getloadavg()
    rounds: list[dict[str, float]] = []
    timed_phases: list[dict[str, float]] = []  # the sink's phases in the timed rounds
    try:
        df = make_df(spark, args.rows, args.partitions)
        want = spark_checksum(df)
        if not args.smoke:
            warm = df.limit(WARM_ROWS).repartition(args.partitions).cache()
            warm.count()
            for kind in kinds:
                server.sql(f"TRUNCATE TABLE {TABLE}")
                writers[kind](warm)
            warm.unpersist()
        for r in range(args.rounds):
            times: dict[str, float] = {}
            for kind in order(kinds, r):
                server.sql(f"TRUNCATE TABLE {TABLE}")
                t0 = time.perf_counter()
                writers[kind](df)
                times[kind] = time.perf_counter() - t0
                got = server.checksum()
                if got != want:
                    raise SystemExit(f"{kind} (round {r}): the table reads {got}, expected "
                                     f"{want}: rows lost, duplicated or changed")
            rounds.append(times)
            timed_phases.append(phases[-1])
            print(f"[Connector/J {version}] round {r}: "
                  + ", ".join(f"{k} {times[k]:.2f} s" for k in kinds), flush=True)
        df.unpersist()
        prepared = len(server.sql("XA RECOVER"))
    finally:
        sink.close()
        spark.stop()
    return {"jdbc_version": version, "batching": batching, "server": server_version,
            "rows": args.rows, "partitions": args.partitions, "kinds": kinds,
            "rounds": rounds, "sink_phases": timed_phases, "prepared_left": prepared,
            "load_before": load_before[0], "load_after": os.getloadavg()[0]}


def sink_ratios(run: dict[str, Any]) -> dict[str, tuple[float, float, float, list[float]]]:
    """Per contender: the sink's rows/s over its (all rounds), the 95 % interval, and the
    per-round ratios."""
    rounds = run["rounds"]
    sink = [t["sink"] for t in rounds]
    out = {}
    for kind in run["kinds"]:
        if kind == "sink":
            continue
        theirs = [t[kind] for t in rounds]
        low, high = ratio_interval(theirs, sink)
        out[kind] = (sum(theirs) / sum(sink), low, high, [a / b for a, b in
                                                           zip(theirs, sink, strict=True)])
    return out


def verdict(ratio: float, low: float, high: float, rounds: int, target: float) -> str:
    """``ratio >= target`` (rows/s, higher is better) judged by its interval; in times."""
    return ratio_verdict(1 / ratio, 1 / high, 1 / low, rounds, 1 / target)


def report(run: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """Print one version's tables; return its target lines."""
    rows, rounds = run["rows"], run["rounds"]
    version = run["jdbc_version"]
    print()
    print(f"# Connector/J {version} ({run['batching']}), MariaDB {run['server']}: {rows:,} "
          f"rows, {run['partitions']} partitions, {len(rounds)} interleaved rounds")
    print()
    ratios = sink_ratios(run)
    table = []
    for kind in run["kinds"]:
        rates = [rows / t[kind] for t in rounds]
        if kind == "sink":
            cells = ["-", "-"]
        else:
            r, low, high, per = ratios[kind]
            cells = [f"{r:.2f}x [{low:.2f}-{high:.2f}]",
                     f"{median(per):.2f}x ({min(per):.2f}-{max(per):.2f})"]
        table.append([kind, f"{median([t[kind] for t in rounds]):.2f}",
                      f"{median(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f})", *cells])
    print(format_table(["contender", "median s", "rows/s: median (min-max)",
                        "sink rows/s over its [95 %]", "round ratios: median (min-max)"],
                       table))
    print()
    phases = run["sink_phases"]
    if phases:
        def ms(key: str) -> float:
            return median([p[key] for p in phases])

        rest = median([p["call_ms"] - p["prepare_ms"] - p["decide_ms"] - p["commit_ms"]
                       for p in phases])
        print(f"The sink's call, median ms over the rounds: {ms('call_ms'):.0f} = prepare "
              f"(the Spark job: the tasks' XA START, encode, LOAD DATA, receipt, XA PREPARE) "
              f"{ms('prepare_ms'):.0f} + decide {ms('decide_ms'):.1f} + commit (XA COMMIT "
              f"per branch) {ms('commit_ms'):.1f} + the rest (the table's check, the "
              f"ledger's reads, the batch's plan) {rest:.0f}")
        print()
    decide = not (args.smoke or args.quick) and len(rounds) >= MIN_JUDGED_ROUNDS
    lines = []
    jdbc = [k for k in run["kinds"] if k.startswith("jdbc-")]
    best = min(jdbc, key=lambda k: sum(t[k] for t in rounds))
    for kind, target in ((best, TARGET_VS_JDBC), ("plain-load", TARGET_VS_PLAIN)):
        r, low, high, _ = ratios[kind]
        what = (f"Spark JDBC, Connector/J {version}, its fastest batchsize ({kind})"
                if kind == best else "the plain LOAD DATA")
        said = (verdict(r, low, high, len(rounds), target) if decide
                else "not judged (--quick: too few rounds)" if args.quick
                else "" if args.smoke
                else f"not judged ({len(rounds)} rounds: fewer than {MIN_JUDGED_ROUNDS})")
        lines.append(f"* target: sink >= {target}x {what} in rows/s: {r:.2f}x "
                     f"[{low:.2f}-{high:.2f}]: {judged(said, args.smoke)}")
    lines.append(f"* Connector/J {version}: every write checked (count, sums, CRC32): exact; "
                 f"XA branches left prepared: {run['prepared_left']}; 1-min load "
                 f"{run['load_before']:.1f} before, {run['load_after']:.1f} after, on "
                 f"{os.cpu_count()} CPUs")
    for line in lines:
        print(line)
    return lines


def chart(runs: list[dict[str, Any]], path: str) -> None:
    panels = [Panel(f"Connector/J {run['jdbc_version']}, {run['rows']:,} rows",
                    {f"over {k}": v[3] for k, v in sink_ratios(run).items()},
                    "the sink's rows/s over the contender's (per round)")
              for run in runs]
    title = "mariadb_bench: MariaDBSink vs Spark JDBC and LOAD DATA"
    print(f"chart: {draw_chart(path, title, panels)}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=None, help="mariadb:// URL (default $EOS_MARIADB_URL, "
                   "else .services.env)")
    p.add_argument("--rows", type=int, default=None, help="500,000 (100,000 with --quick)")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--rounds", type=int, default=None,
                   help=f"{DEFAULT_ROUNDS} ({QUICK_ROUNDS} with --quick, 1 with --smoke)")
    p.add_argument("--jdbc-version", action="append", default=None,
                   help=f"Connector/J version (repeatable; default {', '.join(JDBC_VERSIONS)})")
    p.add_argument("--batchsize", type=int, action="append", default=None,
                   help="Spark JDBC batchsize (repeatable; default 1000 and 10000)")
    p.add_argument("--quick", action="store_true", help="100,000 rows, 2 rounds: no verdict")
    p.add_argument("--smoke", action="store_true",
                   help="correctness only (CI): 2,000 rows, 1 round, no warm-up, no verdict")
    p.add_argument("--json", default=None, help="every timing, as JSON, to FILE")
    p.add_argument("--chart", default=str(default_chart_path("mariadb_bench")),
                   help="the round ratios as a PNG ('' for none)")
    p.add_argument("--quiet-report", action="store_true", help=argparse.SUPPRESS)  # a child
    args = p.parse_args(argv)
    args.rows = args.rows or (2_000 if args.smoke else 100_000 if args.quick else 500_000)
    args.rounds = args.rounds or (1 if args.smoke else QUICK_ROUNDS if args.quick
                                  else DEFAULT_ROUNDS)
    args.jdbc_version = args.jdbc_version or list(JDBC_VERSIONS)
    args.batchsize = args.batchsize or [1000, 10000]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    url = load_service_env("EOS_MARIADB_URL", args.url)
    if not url:
        print("No MariaDB: run scripts/services start --only mariadb or pass --url",
              file=sys.stderr)
        return 2
    started = time.monotonic()
    if len(args.jdbc_version) == 1:
        runs = [run_one(args, url, args.jdbc_version[0])]
    else:  # one Spark per version: the versions share the driver's class name
        runs = []
        rest = list(argv if argv is not None else sys.argv[1:])
        for version in args.jdbc_version:
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                cmd = [sys.executable, "-m", "benchmarks.mariadb_bench", *strip(rest),
                       "--jdbc-version", version, "--json", out.name, "--chart", "",
                       "--quiet-report"]
                proc = subprocess.run(cmd, cwd=REPO_ROOT, check=False,
                                      env=dict(os.environ, EOS_MARIADB_URL=url))
                if proc.returncode != 0:
                    return proc.returncode
                runs.extend(json.loads(Path(out.name).read_text(encoding="utf-8")))
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1) + "\n", encoding="utf-8")
    if args.quiet_report:
        return 0
    for run in runs:
        report(run, args)
    print()
    if args.chart:
        chart(runs, args.chart)
    print(f"* wall time {time.monotonic() - started:.0f} s")
    if args.smoke:
        print(f"* {SMOKE_NOTE}")
    return 0


def strip(argv: list[str]) -> list[str]:
    """``argv`` without the options the parent sets per version."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in ("--jdbc-version", "--json", "--chart"):
            skip = "=" not in a
            continue
        out.append(a)
    return out


if __name__ == "__main__":
    sys.exit(main())
