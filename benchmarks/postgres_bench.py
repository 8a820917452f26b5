"""PostgreSQL write throughput: PostgresSink against Spark's JDBC writer and plain COPY.

Run from the repository root, with PostgreSQL up (``scripts/services start``)::

    python -m benchmarks.postgres_bench            # 2,000,000 rows, 9 timed runs each
    python -m benchmarks.postgres_bench --quick    # 200,000 rows, 1 run: a short benchmark
    python -m benchmarks.postgres_bench --smoke    # 5,000 rows, 1 run, 1 tiny batch, no
                                                   # warm-up: every contender and check, no
                                                   # verdict (CI's smoke test)
    python -m benchmarks.postgres_bench --types    # + a uuid and an integer[] column: the
                                                   # sink/COPY ratio with and without them

Every contender writes the same cached DataFrame (``--rows`` rows of ``id bigint, name
text, amount double precision, ts timestamptz``, ``--partitions`` partitions, generated
with ``spark.range`` and materialised before any timing) into a freshly truncated
``public.bench_sink`` with ``synchronous_commit=on``:

``jdbc``          ``df.write.jdbc(...)``, Spark's defaults (batchsize 1000), at-least-once
``jdbc-tuned``    the same with ``reWriteBatchedInserts=true`` and ``batchsize=10000``
``copy-binary``   ``mapInArrow`` tasks: one psycopg connection each, pgpq-encoded
                  ``COPY ... FROM STDIN (FORMAT BINARY)``, commit; no 2PC (the near-limit)
``copy-csv``      the same with ``pyarrow.csv`` into ``COPY ... (FORMAT CSV)``, for context
``postgres-sink`` ``connectors.postgres.PostgresSink``: exactly-once, two-phase commit
``postgres-datasource`` the same sink in its DataSource form (``df.write.format(
                  "connectors.postgres")``, a ``run_id`` option per run)

Timed runs are interleaved (round ``r`` starts with contender ``r``), each run's result is
checked in PostgreSQL (count, sums, min/max timestamp), and rows/s is the median over the
runs. A second part times tiny batches (``--tiny-rows`` rows, same partitions) written
back to back, as ``foreachBatch`` would in a low-latency stream, to show the per-batch
protocol overhead of PostgresSink over a plain COPY. Nothing is asserted: the targets are
printed next to the measurements. ``--smoke`` runs every contender through the same writes
and checks at the smallest size (no warm-up run, one tiny batch each) and judges nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import itertools
import json
import logging
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
import pyarrow as pa
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

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
    stopwatch,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

logger = logging.getLogger("benchmarks.postgres_bench")

TABLE = "public.bench_sink"
COLUMNS = ("id", "name", "amount", "ts")
DDL = (
    f"CREATE TABLE {TABLE} (id bigint NOT NULL, name text NOT NULL, "
    "amount double precision NOT NULL, ts timestamptz NOT NULL)"
)
SINK_ID = "bench"
#: The sink's ledger: a table of the benchmark's own, dropped at the start and the end.
LEDGER = "public.bench_eos_ledger"
#: 2023-11-14T22:13:20Z in microseconds; row ``i`` gets ``TS_BASE_US + i * 1001``.
TS_BASE_US = 1_700_000_000_000_000
#: Newest 42.7.x on Maven Central when this was written.
DEFAULT_JDBC_VERSION = "42.7.14"
TARGET_VS_JDBC_TUNED = 2.0
TARGET_VS_COPY = 0.93
#: Stretch targets (printed beside the targets).
STRETCH_VS_JDBC_TUNED = 2.2
STRETCH_VS_COPY = 0.97
TARGET_OVERHEAD_MS = 15.0
#: The DataSource form's time over the callable's, same rows (issue 42).
TARGET_DATASOURCE = 1.05
SINK_ID_DS = "bench-ds"

TaskFn = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
Writer = Callable[["DataFrame"], None]


# --------------------------------------------------------------------------- data


def make_df(spark: SparkSession, rows: int, partitions: int) -> DataFrame:
    """``rows`` deterministic rows in ``partitions`` partitions (not yet materialised)."""
    from pyspark.sql import functions as F  # noqa: N812 (PySpark's convention)

    idc = F.col("id")
    return spark.range(0, rows, 1, partitions).select(
        idc.alias("id"),
        F.concat(F.lit("customer-"), F.lpad((idc % 1_000_003).cast("string"), 7, "0")).alias(
            "name"
        ),
        ((idc % 100_000) / F.lit(100.0)).cast("double").alias("amount"),
        F.timestamp_micros(F.lit(TS_BASE_US) + idc * 1001).alias("ts"),
    )


def materialise(df: DataFrame) -> DataFrame:
    """Cache ``df`` and compute it once, so that no timed run pays for generating it."""
    from pyspark import StorageLevel

    cached = df.persist(StorageLevel.MEMORY_ONLY)
    cached.count()
    return cached


@dataclass(frozen=True)
class Checksum:
    """What a written table must hold: compared after every run."""

    rows: int
    sum_id: int
    sum_name_len: int
    sum_amount: float
    min_ts_us: int | None
    max_ts_us: int | None

    def matches(self, other: Checksum) -> bool:
        exact = (
            self.rows,
            self.sum_id,
            self.sum_name_len,
            self.min_ts_us,
            self.max_ts_us,
        ) == (other.rows, other.sum_id, other.sum_name_len, other.min_ts_us, other.max_ts_us)
        return exact and abs(self.sum_amount - other.sum_amount) <= 1e-6 * max(
            1.0, abs(self.sum_amount)
        )


def spark_checksum(df: DataFrame) -> Checksum:
    from pyspark.sql import functions as F  # noqa: N812

    row = df.agg(
        F.count(F.lit(1)),
        F.sum("id"),
        F.sum(F.length("name")),
        F.sum("amount"),
        F.unix_micros(F.min("ts")),
        F.unix_micros(F.max("ts")),
    ).first()
    assert row is not None
    return Checksum(
        int(row[0]), int(row[1] or 0), int(row[2] or 0), float(row[3] or 0.0), row[4], row[5]
    )


def pg_checksum(conn: psycopg.Connection[Any]) -> Checksum:
    row = conn.execute(
        f"SELECT count(*), coalesce(sum(id), 0)::bigint, coalesce(sum(length(name)), 0)::bigint,"
        " coalesce(sum(amount), 0), (extract(epoch FROM min(ts)) * 1000000)::bigint,"
        f" (extract(epoch FROM max(ts)) * 1000000)::bigint FROM {TABLE}"
    ).fetchone()
    assert row is not None
    return Checksum(int(row[0]), int(row[1]), int(row[2]), float(row[3]), row[4], row[5])


# --------------------------------------------------------------------------- contenders


def copy_task(conninfo: str, fmt: str) -> TaskFn:
    """A ``mapInArrow`` function: COPY its partition in one transaction, yield its count.

    ``fmt`` is ``"BINARY"`` (pgpq's encoder) or ``"CSV"`` (``pyarrow.csv``). No 2PC: each
    task commits on its own, so a retried task writes its rows twice (at-least-once).
    """
    sql = f"COPY {TABLE} ({', '.join(COLUMNS)}) FROM STDIN (FORMAT {fmt})"

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import psycopg
        import pyarrow as pa

        rows = 0
        arrow_schema = ""
        first = next(batches, None)
        if first is not None:
            arrow_schema = ", ".join(f"{f.name}:{f.type}" for f in first.schema)
            with (
                psycopg.connect(conninfo) as conn,  # commits when the block ends
                conn.cursor() as cur,
                cur.copy(sql) as copy,
            ):
                if fmt == "BINARY":
                    from pgpq import ArrowToPostgresBinaryEncoder

                    encoder = ArrowToPostgresBinaryEncoder(first.schema)
                    copy.write(encoder.write_header())
                    copy.write(encoder.write_batch(first))
                    rows += first.num_rows
                    for batch in batches:
                        copy.write(encoder.write_batch(batch))
                        rows += batch.num_rows
                    copy.write(encoder.finish())
                else:
                    import pyarrow.csv as pacsv

                    options = pacsv.WriteOptions(include_header=False)
                    for batch in itertools.chain([first], batches):
                        buf = io.BytesIO()
                        pacsv.write_csv(batch, buf, options)
                        copy.write(buf.getvalue())
                        rows += batch.num_rows
        yield pa.record_batch(
            [pa.array([rows], pa.int64()), pa.array([arrow_schema], pa.string())],
            names=["rows", "arrow_schema"],
        )

    return task


def copy_writer(conninfo: str, fmt: str, observed: dict[str, str]) -> Writer:
    task = copy_task(conninfo, fmt)

    def run(df: DataFrame) -> None:
        out = df.mapInArrow(task, "rows long, arrow_schema string").collect()
        for row in out:
            if row[1]:
                observed[fmt] = str(row[1])

    return run


def jdbc_writer(url: str, properties: dict[str, str]) -> Writer:
    def run(df: DataFrame) -> None:
        df.write.mode("append").jdbc(url, TABLE, properties=properties)

    return run


@dataclass
class SinkRunner:
    """Calls ``PostgresSink`` with increasing run ids, keeping each run's metrics."""

    sink: Any
    next_id: int = 0
    metrics: list[dict[str, object]] = field(default_factory=list)

    def __call__(self, df: DataFrame) -> None:
        run_id = self.next_id
        self.next_id += 1
        self.sink(df, run_id)
        last = getattr(self.sink, "last_metrics", None)
        if last is not None:
            self.metrics.append(last.as_dict())


@dataclass
class DataSourceRunner:
    """PostgresSink's DataSource form in batch jobs: ``df.write.format("connectors.postgres")``
    with increasing ``run_id`` options (its own sink id, the same ledger table)."""

    options: dict[str, str]
    next_id: int = 0

    def __call__(self, df: DataFrame) -> None:
        run_id = self.next_id
        self.next_id += 1
        (df.write.format("connectors.postgres").options(**self.options)
         .option("run_id", str(run_id)).mode("append").save())


def make_sink(conninfo: str) -> tuple[SinkRunner | None, str]:
    """A ``PostgresSink`` on the bench table, or ``None`` and why when it does not import."""
    try:
        from connectors.postgres import PostgresSink
    except Exception as exc:  # not there yet, or broken: report and bench the rest
        return None, f"{type(exc).__name__}: {exc}"
    sink = PostgresSink(conninfo, TABLE, sink_id=SINK_ID, mode="append", ledger_table=LEDGER)
    return SinkRunner(sink), ""


# --------------------------------------------------------------------------- database


def connect(conninfo: str) -> psycopg.Connection[Any]:
    return psycopg.connect(conninfo, autocommit=True)


def reset_table(conn: psycopg.Connection[Any], *, checkpoint: bool) -> None:
    """An empty target table, and (when allowed) a checkpoint so no run inherits dirty WAL."""
    conn.execute(f"TRUNCATE {TABLE}")
    if checkpoint:
        conn.execute("CHECKPOINT")


def can_checkpoint(conn: psycopg.Connection[Any]) -> bool:
    try:
        conn.execute("CHECKPOINT")
    except psycopg.Error:
        return False
    return True


def prepared_xacts(conn: psycopg.Connection[Any]) -> int:
    """Prepared transactions left in the server (every database, every sink)."""
    row = conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()
    return int(row[0]) if row else 0


def sink_prepared(sink: Any) -> list[str]:
    """This benchmark's sink's own prepared transactions (its ``list_prepared()``): must be none."""
    try:
        return [str(t) for t in sink.list_prepared()]
    except Exception as exc:
        return [f"(could not list: {type(exc).__name__}: {exc})"]


def drop_ledger(conn: psycopg.Connection[Any]) -> list[str]:
    """Drop the benchmark's own ledger tables (``LEDGER`` and its ``_*`` companions)."""
    schema, _, name = LEDGER.partition(".")
    rows = conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = %s "
        "AND (tablename = %s OR tablename LIKE %s)",
        (schema, name, name.replace("_", r"\_") + r"\_%"),
    ).fetchall()
    dropped = []
    for (table,) in rows:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(schema, table)))
        dropped.append(f"{schema}.{table}")
    return dropped


# --------------------------------------------------------------------------- runs


@dataclass
class Contender:
    key: str
    label: str
    note: str
    write: Writer
    seconds: list[float] = field(default_factory=list)

    def rows_per_s(self, rows: int) -> float:
        return rows / median(self.seconds) if self.seconds else float("nan")


def run_once(
    contender: Contender,
    df: DataFrame,
    expected: Checksum,
    conn: psycopg.Connection[Any],
    *,
    checkpoint: bool,
) -> float:
    reset_table(conn, checkpoint=checkpoint)
    with stopwatch() as elapsed:
        contender.write(df)
    got = pg_checksum(conn)
    if not got.matches(expected):
        raise RuntimeError(
            f"{contender.key}: the table does not hold the expected rows:\n"
            f"  expected {expected}\n  got      {got}"
        )
    return elapsed[0]


def tiny_batches(
    writers: list[tuple[str, Writer]],
    df: DataFrame,
    batches: int,
    warmup: int,
    conn: psycopg.Connection[Any],
) -> dict[str, list[float]]:
    """Per-batch wall times (ms), writers interleaved batch by batch."""
    reset_table(conn, checkpoint=False)
    times: dict[str, list[float]] = {key: [] for key, _ in writers}
    for i in range(warmup + batches):
        for key, write in writers:
            with stopwatch() as elapsed:
                write(df)
            if i >= warmup:
                times[key].append(elapsed[0] * 1000)
    row = conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()
    expected_rows = (warmup + batches) * len(writers) * df.count()
    if row is None or int(row[0]) != expected_rows:
        raise RuntimeError(f"tiny batches: expected {expected_rows} rows, found {row}")
    return times


def phase_summary(metrics: list[dict[str, object]], rows: int) -> str | None:
    """Median of the sink's own phase timings over its batches of ``rows`` rows.

    ``prepare`` is the Spark job whose tasks write and prepare, ``decide`` the ledger
    decision, ``commit`` the ``COMMIT PREPARED`` round trips; ``other`` is the rest of the
    sink's ``total`` (binding, ledger reads, validation, pruning).
    """
    picked = [m for m in metrics if str(m.get("rows")) == str(rows)]
    if not picked:
        return None

    def med(key: str) -> float:
        return median([float(str(m[key])) for m in picked if key in m])

    phases = {k: med(f"{k}_ms") for k in ("prepare", "decide", "commit", "total")}
    other = median(
        [
            float(str(m["total_ms"]))
            - sum(float(str(m[f"{k}_ms"])) for k in ("prepare", "decide", "commit"))
            for m in picked
            if "total_ms" in m
        ]
    )
    return ", ".join(f"{k}={v:.1f}" for k, v in phases.items()) + f", other={other:.1f}"


def fmt_ratio(a: float, b: float) -> str:
    """``a / b`` as ``1.23x``, or ``-`` when either is not a measurement."""
    if math.isnan(a) or math.isnan(b) or b == 0:
        return "-"
    return f"{a / b:.2f}x"


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[idx]


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.postgres_bench",
        description="PostgresSink vs Spark JDBC vs plain COPY: rows/s and per-batch overhead.",
    )
    p.add_argument("--rows", type=int, default=2_000_000, help="rows per run (2,000,000)")
    p.add_argument("--runs", type=int, default=9,
                   help="timed runs per contender (9, interleaved: the ratios' bootstrap "
                        "interval over rounds is printed)")
    p.add_argument("--quick", action="store_true",
                   help="a short benchmark: 200,000 rows, 1 run, 15 tiny batches")
    p.add_argument("--smoke", action="store_true",
                   help="correctness only (CI): 5,000 rows, 1 run, 1 tiny batch, no warm-up "
                        "runs; every contender, check and the chart; no verdict")
    p.add_argument("--partitions", type=int, default=2, help="partitions = tasks (2)")
    p.add_argument("--tiny-rows", type=int, default=100, help="rows per tiny batch (100)")
    p.add_argument("--tiny-batches", type=int, default=40, help="timed tiny batches (40)")
    p.add_argument(
        "--only",
        default="",
        help="comma-separated contender keys (jdbc, jdbc-tuned, copy-binary, copy-csv, "
        "postgres-sink); default all",
    )
    p.add_argument("--types", action="store_true",
                   help="instead: COPY and the sink on the table and on the table plus a "
                        "uuid and an integer[] column, interleaved (benchmarks/"
                        "_pg_types_variant.py)")
    p.add_argument("--conninfo", default=None, help="default: $EOS_POSTGRES_CONNINFO")
    p.add_argument("--jdbc-version", default=DEFAULT_JDBC_VERSION)
    p.add_argument("--driver-memory", default="4g")
    p.add_argument("--json", default=None, help="also write the results to this file")
    p.add_argument("--chart", default=str(default_chart_path("postgres_bench")),
                   help="the throughput table as a PNG chart "
                        "(benchmarks/charts/postgres_bench.png)")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    if args.quick and args.smoke:
        p.error("--quick or --smoke, not both")
    args.warmup, args.tiny_warmup = 1, 3  # warm-up runs per contender, tiny batches
    if args.quick:
        args.rows, args.runs, args.tiny_batches = 200_000, 1, 15
    if args.smoke:  # the timed runs check every contender: no warm-up run before them
        args.rows, args.runs, args.tiny_batches, args.warmup, args.tiny_warmup = 5_000, 1, 1, 0, 0
    return args


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "cpus": str(os.cpu_count())}
    for dist in ("pyspark", "pyarrow", "psycopg", "pgpq"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "?"
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    conninfo = load_service_env("EOS_POSTGRES_CONNINFO", args.conninfo)
    if not conninfo:
        print("No PostgreSQL: run scripts/services start or pass --conninfo", file=sys.stderr)
        return 2
    started = time.monotonic()
    load_before = os.getloadavg()

    # ---- PostgreSQL and its settings
    conn = connect(conninfo)
    sync_commit = str(conn.execute("SHOW synchronous_commit").fetchone()[0])  # type: ignore[index]
    if sync_commit != "on":
        print(f"synchronous_commit is {sync_commit!r}, the benchmark wants 'on'", file=sys.stderr)
        return 2
    pg_version = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
    checkpoint = can_checkpoint(conn)

    # ---- Spark with the PostgreSQL JDBC driver
    jar = fetch_maven_jar(
        "org.postgresql",
        "postgresql",
        args.jdbc_version,
        dirname=f"postgresql-jdbc-{args.jdbc_version}",
    )
    from connectors.spark import session_builder

    spark = session_builder(
        "postgres-bench",
        master=f"local[{args.partitions}]",
        components=[],
        conf={
            "spark.jars": str(jar),
            "spark.driver.memory": args.driver_memory,
            "spark.sql.session.timeZone": "UTC",
            "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
            "spark.executorEnv.PYTHONPATH": str(REPO_ROOT),
        },
    ).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if args.types:
        from benchmarks import _pg_types_variant

        args.checkpoint = checkpoint
        try:
            lines = _pg_types_variant.run(args, spark, conninfo, conn)
        finally:
            n_prepared = prepared_xacts(conn)
            conn.close()
            spark.catalog.clearCache()
            spark.stop()
        for line in lines:
            print(f"* {line}")
        print(f"* PostgreSQL {pg_version}, " + ", ".join(f"{k} {v}" for k, v in
                                                       versions().items())
              + f"; prepared transactions left: {n_prepared}; 1-min load average "
              f"{load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after")
        return 0

    params = conninfo_to_dict(conninfo)
    url = (
        f"jdbc:postgresql://{params.get('host', 'localhost')}:{params.get('port', 5432)}/"
        f"{params.get('dbname', '')}"
    )
    jdbc_props = {
        "user": str(params.get("user", "")),
        "password": str(params.get("password", "")),
        "driver": "org.postgresql.Driver",
    }
    observed_schema: dict[str, str] = {}
    contenders = [
        Contender(
            "jdbc",
            "Spark JDBC, defaults",
            "df.write.jdbc, batchsize=1000 (default)",
            jdbc_writer(url, jdbc_props),
        ),
        Contender(
            "jdbc-tuned",
            "Spark JDBC, tuned",
            "reWriteBatchedInserts=true, batchsize=10000",
            jdbc_writer(url + "?reWriteBatchedInserts=true", {**jdbc_props, "batchsize": "10000"}),
        ),
        Contender(
            "copy-binary",
            "COPY BINARY (pgpq), no 2PC",
            "mapInArrow + psycopg COPY FORMAT BINARY",
            copy_writer(conninfo, "BINARY", observed_schema),
        ),
        Contender(
            "copy-csv",
            "COPY CSV (pyarrow), no 2PC",
            "mapInArrow + pyarrow.csv + COPY FORMAT CSV",
            copy_writer(conninfo, "CSV", observed_schema),
        ),
    ]
    runner, sink_error = make_sink(conninfo)
    if runner is not None:
        contenders.append(
            Contender(
                "postgres-sink",
                "PostgresSink (exactly-once)",
                "connectors.postgres.PostgresSink, mode=append",
                runner,
            )
        )
        import connectors

        if "connectors.postgres" in connectors.register(spark):
            contenders.append(
                Contender(
                    "postgres-datasource",
                    "PostgresSink, DataSource form",
                    'df.write.format("connectors.postgres"), option run_id',
                    DataSourceRunner({"conninfo": conninfo, "table": TABLE,
                                      "sink_id": SINK_ID_DS, "ledger_table": LEDGER}),
                )
            )
    if args.only:
        wanted = {k.strip() for k in args.only.split(",") if k.strip()}
        contenders = [c for c in contenders if c.key in wanted]

    tiny_times: dict[str, list[float]] = {}
    cleanup_notes: list[str] = []
    try:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        conn.execute(DDL)
        drop_ledger(conn)  # a leftover of an interrupted run would hold old run ids

        # ---- data, materialised before anything is timed
        df = materialise(make_df(spark, args.rows, args.partitions))
        assert df.rdd.getNumPartitions() == args.partitions
        expected = spark_checksum(df)
        tiny_df = materialise(make_df(spark, args.tiny_rows, args.partitions))

        # ---- warm-up: JVM classes, Python workers, connections; checks every contender
        if args.warmup:
            warm_df = materialise(make_df(spark, min(args.rows, 20_000), args.partitions))
            warm_expected = spark_checksum(warm_df)
            for c in contenders:
                run_once(c, warm_df, warm_expected, conn, checkpoint=False)
                print(f"warm-up ok: {c.key}", flush=True)

        # ---- timed runs, interleaved, rotating who goes first
        for r in range(args.runs):
            order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
            for c in order:
                secs = run_once(c, df, expected, conn, checkpoint=checkpoint)
                c.seconds.append(secs)
                print(
                    f"run {r + 1}/{args.runs} {c.key:14s} {secs:8.2f} s "
                    f"{args.rows / secs:12,.0f} rows/s",
                    flush=True,
                )

        # ---- tiny batches: per-batch overhead
        by_key = {c.key: c for c in contenders}
        tiny_keys = [k for k in ("copy-binary", "postgres-sink", "postgres-datasource",
                                 "jdbc-tuned") if k in by_key]
        if tiny_keys and args.tiny_batches > 0:
            tiny_times = tiny_batches(
                [(k, by_key[k].write) for k in tiny_keys],
                tiny_df,
                args.tiny_batches,
                warmup=args.tiny_warmup,
                conn=conn,
            )
    finally:
        with contextlib.suppress(Exception):
            conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        ours: list[str] = []
        if runner is not None:
            ours = sink_prepared(runner.sink)
            with contextlib.suppress(Exception):
                runner.sink.close()
            if "postgres-datasource" in {c.key for c in contenders}:
                from connectors.postgres import PostgresSink

                form = PostgresSink.operator(conninfo, sink_id=SINK_ID_DS, ledger_table=LEDGER)
                ours += sink_prepared(form)
                form.close()
        with contextlib.suppress(Exception):
            dropped = drop_ledger(conn)
            if dropped:
                cleanup_notes.append("the sink's ledger " + ", ".join(dropped))
        n_prepared = prepared_xacts(conn)
        conn.close()
        spark.catalog.clearCache()
        spark.stop()

    # ---- report
    elapsed_total = time.monotonic() - started
    load_after = os.getloadavg()
    rows = args.rows
    by_key = {c.key: c for c in contenders}

    def rate(key: str) -> float:
        return by_key[key].rows_per_s(rows) if key in by_key else float("nan")

    headers = [
        "contender",
        "setting",
        "runs (s)",
        "median rows/s",
        "best rows/s",
        "vs JDBC tuned",
        "vs COPY bin",
    ]
    table_rows = []
    for c in contenders:
        own = c.rows_per_s(rows)
        table_rows.append(
            [
                c.label,
                c.note,
                " / ".join(f"{s:.2f}" for s in c.seconds),
                f"{own:,.0f}",
                f"{rows / min(c.seconds):,.0f}" if c.seconds else "-",
                fmt_ratio(own, rate("jdbc-tuned")),
                fmt_ratio(own, rate("copy-binary")),
            ]
        )
    env = versions()
    print()
    print(
        f"## Throughput: {rows:,} rows x {args.runs} run(s), {args.partitions} partitions, "
        f"synchronous_commit={sync_commit}"
    )
    print()
    print(format_table(headers, table_rows, align="llrrrrr"))
    print()
    if args.chart and "jdbc-tuned" in by_key:
        base = by_key["jdbc-tuned"].seconds
        panel = Panel(f"Throughput, {rows:,} rows, {args.partitions} partitions", {
            c.label: [a / b for a, b in zip(base, c.seconds, strict=False)]
            for c in contenders if c.key != "jdbc-tuned"},
            "Spark JDBC tuned's time / the contender's (per round)")
        chart = draw_chart(args.chart, "postgres_bench: PostgresSink and others vs Spark "
                           "JDBC (tuned)", [panel])
        print(f"chart: {chart}")
        print()

    smoke = bool(args.smoke)
    verdicts: list[str] = [SMOKE_NOTE] if smoke else []
    if "postgres-sink" in by_key:
        sink_rate = rate("postgres-sink")
        for other, target in (
            ("jdbc-tuned", TARGET_VS_JDBC_TUNED),
            ("copy-binary", TARGET_VS_COPY),
        ):
            if other in by_key:
                ratio = sink_rate / rate(other)
                stretch = STRETCH_VS_JDBC_TUNED if other == "jdbc-tuned" else STRETCH_VS_COPY
                theirs, mine = by_key[other].seconds, by_key["postgres-sink"].seconds
                # Over the rounds: total time of theirs / total time of the sink's.
                lo, hi = ratio_interval(theirs, mine)
                paired = sorted(a / b for a, b in zip(theirs, mine, strict=True))
                verdicts.append(
                    f"PostgresSink / {other}: {ratio:.2f}x (95 % bootstrap interval over "
                    f"{len(mine)} rounds {lo:.2f}x-{hi:.2f}x; paired per round median "
                    f"{median(paired):.2f}x, {paired[0]:.2f}x-{paired[-1]:.2f}x; target >= "
                    f"{target}x: {judged('met' if ratio >= target else 'NOT met', smoke)}, "
                    f"stretch >= {stretch}x: "
                    f"{judged('met' if ratio >= stretch else 'not met', smoke)})"
                )
        if "postgres-datasource" in by_key:
            form_s = by_key["postgres-datasource"].seconds
            call = by_key["postgres-sink"].seconds
            lo, hi = ratio_interval(form_s, call)
            paired = sorted(a / b for a, b in zip(form_s, call, strict=True))
            ratio = median(form_s) / median(call)
            verdicts.append(
                f"DataSource form / callable, time: {ratio:.3f}x (95 % bootstrap interval "
                f"over {len(call)} rounds {lo:.3f}x-{hi:.3f}x; paired per round median "
                f"{median(paired):.3f}x, {paired[0]:.3f}x-{paired[-1]:.3f}x; target <= "
                f"{TARGET_DATASOURCE}x: "
                f"{judged('met' if ratio <= TARGET_DATASOURCE else 'NOT met', smoke)})")
        if runner is not None:
            summary = phase_summary(runner.metrics, rows)
            if summary:
                verdicts.append(f"PostgresSink phases, big runs (median ms): {summary}")
    elif sink_error:
        verdicts.append(f"PostgresSink not measured: {sink_error}")

    if tiny_times:
        print(
            f"## Per-batch latency: {args.tiny_batches} batches of {args.tiny_rows} rows, "
            f"{args.partitions} partitions, interleaved"
        )
        print()
        base = tiny_times.get("copy-binary", [])
        tiny_rows_out = []
        for key, values in tiny_times.items():
            # Batch i of every contender ran back to back: pair them, so that load changes
            # during the loop cancel out.
            paired = [v - b for v, b in zip(values, base, strict=False)]
            tiny_rows_out.append(
                [
                    by_key[key].label,
                    f"{median(values):.1f}",
                    f"{percentile(values, 0.9):.1f}",
                    f"{min(values):.1f}",
                    f"{median(values) - median(base):+.1f}" if base else "-",
                    f"{median(paired):+.1f}" if base else "-",
                ]
            )
        print(
            format_table(
                [
                    "contender",
                    "median ms",
                    "p90 ms",
                    "min ms",
                    "median - COPY median",
                    "median of paired diffs",
                ],
                tiny_rows_out,
            )
        )
        print()
        summary = phase_summary(runner.metrics, args.tiny_rows) if runner else None
        if summary and "postgres-sink" in tiny_times:
            verdicts.append(f"PostgresSink phases, tiny batches (median ms): {summary}")
        if "postgres-datasource" in tiny_times and "postgres-sink" in tiny_times:
            form_ms, call_ms = tiny_times["postgres-datasource"], tiny_times["postgres-sink"]
            verdicts.append(
                f"DataSource form per batch over the callable: "
                f"{median(form_ms) - median(call_ms):+.1f} ms (difference of medians), "
                f"{median([a - b for a, b in zip(form_ms, call_ms, strict=False)]):+.1f} ms "
                "(median of paired differences): a planning and a commit worker per batch")
        if "postgres-sink" in tiny_times and base:
            sink_ms = tiny_times["postgres-sink"]
            overhead = median(sink_ms) - median(base)
            paired_overhead = median([v - b for v, b in zip(sink_ms, base, strict=False)])
            met = judged("met" if max(overhead, paired_overhead) <= TARGET_OVERHEAD_MS
                         else "NOT met", smoke)
            verdicts.append(
                f"PostgresSink per-batch overhead over COPY: {overhead:+.1f} ms (difference of "
                f"medians), {paired_overhead:+.1f} ms (median of paired differences); target "
                f"<= {TARGET_OVERHEAD_MS:.0f} ms: {met}"
            )
    for line in verdicts:
        print(f"* {line}")
    print(
        f"* Arrow batches seen by the COPY tasks: {observed_schema.get('BINARY', 'n/a')} "
        f"(spark.sql.execution.arrow.maxRecordsPerBatch default)"
    )
    print(
        f"* PostgreSQL {pg_version}, JDBC driver {args.jdbc_version}, "
        + ", ".join(f"{k} {v}" for k, v in env.items())
        + f"; CHECKPOINT before each timed run: {'yes' if checkpoint else 'no (not allowed)'}"
    )
    print(
        f"* cleanup: dropped {TABLE}"
        + (f"; {'; '.join(cleanup_notes)}" if cleanup_notes else "")
        + f"; prepared transactions left: {n_prepared} (this sink's: {len(ours)})"
    )
    print(
        f"* total wall time {elapsed_total:.0f} s; 1-min load average {load_before[0]:.1f} "
        f"before, {load_after[0]:.1f} after (on {os.cpu_count()} CPUs: above that, other "
        "processes competed for the CPUs and the numbers are noisy)"
    )

    results = {
        "rows": rows,
        "runs": args.runs,
        "partitions": args.partitions,
        "contenders": {
            c.key: {"seconds": c.seconds, "rows_per_s": c.rows_per_s(rows)} for c in contenders
        },
        "tiny_ms": tiny_times,
        "sink_metrics": runner.metrics if runner is not None else [],
        "verdicts": verdicts,
        "versions": {**env, "postgres": pg_version, "jdbc": args.jdbc_version},
        "prepared_left": n_prepared,
        "load_average": [load_before[0], load_after[0]],
    }
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2, default=str)
    return 1 if ours else 0


if __name__ == "__main__":
    sys.exit(main())
