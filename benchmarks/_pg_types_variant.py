"""``python -m benchmarks.postgres_bench --types``: what a uuid and an integer[] column cost.

Two tables, two contenders each, all four interleaved round by round (round ``r`` starts
with contender ``r``), on the same Spark session and the same cached rows:

``copy-binary``         plain binary COPY (pgpq) of ``id, name, amount, ts``
``postgres-sink``       PostgresSink, the same table
``copy-binary-types``   plain binary COPY of the same rows plus ``u uuid`` (a canonical uuid
                        string, as Spark's ``uuid()`` gives) and ``ai integer[]`` (3 ints)
``postgres-sink-types`` PostgresSink, that table

A hand-written COPY must convert the uuid strings too (uuid's binary format is its 16
bytes, pgpq has no uuid encoder): its tasks decode them with the same vectorized numpy
decode the sink uses, into a ``fixed_size_binary(16)`` column, and hand the int arrays to
pgpq as they come. The printed figure is each table's sink/COPY ratio (total COPY time /
total sink time over the rounds), its spread (bootstrap interval, per-round min/max), and
the difference of the two ratios: the target is the ratio with the extra columns within
5 % of the ratio without.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from benchmarks import postgres_bench as pb
from benchmarks._common import format_table, median, ratio_interval, stopwatch

TYPES_TABLE = "public.bench_sink_types"
TYPES_DDL = (f"CREATE TABLE {TYPES_TABLE} (id bigint NOT NULL, name text NOT NULL, "
             "amount double precision NOT NULL, ts timestamptz NOT NULL, u uuid, ai integer[])")
TARGET_RATIO_DROP = 0.05


def make_types_df(spark: Any, rows: int, partitions: int) -> Any:
    """The benchmark's rows plus ``u`` (md5 of the id, as a canonical uuid string) and
    ``ai`` (three ints)."""
    from pyspark.sql import functions as F  # noqa: N812

    h = F.md5(F.col("id").cast("string"))
    u = F.concat_ws("-", *(F.substring(h, start, n) for start, n in
                           ((1, 8), (9, 4), (13, 4), (17, 4), (21, 12))))
    idc = F.col("id")
    ai = F.array((idc % 1000).cast("int"), (idc % 7).cast("int"), idc.cast("int"))
    return pb.make_df(spark, rows, partitions).select("*", u.alias("u"), ai.alias("ai"))


def copy_types_task(conninfo: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[Any]]:
    statement = f"COPY {TYPES_TABLE} (id, name, amount, ts, u, ai) FROM STDIN (FORMAT BINARY)"

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import psycopg
        from pgpq import ArrowToPostgresBinaryEncoder

        from connectors.postgres._encode import encode

        rows = 0
        encoder = None
        with psycopg.connect(conninfo) as conn, conn.cursor() as cur, cur.copy(statement) as cp:
            for batch in batches:
                u = encode("uuid", batch.column("u"))  # the 16 bytes of each uuid
                batch = batch.set_column(batch.schema.get_field_index("u"), "u", u)
                if encoder is None:
                    encoder = ArrowToPostgresBinaryEncoder(batch.schema)
                    cp.write(encoder.write_header())
                cp.write(encoder.write_batch(batch))
                rows += batch.num_rows
            if encoder is not None:
                cp.write(encoder.finish())
        yield pa.record_batch([pa.array([rows], pa.int64()), pa.array([""], pa.string())],
                              names=["rows", "arrow_schema"])

    return task


def types_rows_ok(conn: Any, rows: int) -> None:
    """Every row of the types table is there once, its uuid and array exact."""
    got = conn.execute(
        f"SELECT count(*), count(*) FILTER (WHERE u = md5(id::text)::uuid AND ai = "
        f"ARRAY[(id % 1000)::int, (id % 7)::int, id::int]), count(DISTINCT id) "
        f"FROM {TYPES_TABLE}").fetchone()
    if tuple(got) != (rows, rows, rows):
        raise RuntimeError(f"{TYPES_TABLE}: expected {rows} exact rows, got {got}")


def run(args: argparse.Namespace, spark: Any, conninfo: str, conn: Any) -> list[str]:
    """The four contenders interleaved; returns the report's lines."""
    from connectors.postgres import PostgresSink

    for ddl, table in ((pb.DDL, pb.TABLE), (TYPES_DDL, TYPES_TABLE)):
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(ddl)
    pb.drop_ledger(conn)
    narrow = pb.materialise(pb.make_df(spark, args.rows, args.partitions))
    wide = pb.materialise(make_types_df(spark, args.rows, args.partitions))
    expected = pb.spark_checksum(narrow)
    sinks = {
        "postgres-sink": PostgresSink(conninfo, pb.TABLE, sink_id="bench",
                                      ledger_table=pb.LEDGER),
        "postgres-sink-types": PostgresSink(conninfo, TYPES_TABLE, sink_id="bench-types",
                                            ledger_table=pb.LEDGER),
    }
    run_ids = {k: 0 for k in sinks}
    copy_narrow = pb.copy_task(conninfo, "BINARY")
    copy_wide = copy_types_task(conninfo)

    def write(key: str, df: Any) -> None:
        if key in sinks:
            sinks[key](df, run_ids[key])
            run_ids[key] += 1
        else:
            task = copy_wide if key.endswith("types") else copy_narrow
            df.mapInArrow(task, "rows long, arrow_schema string").collect()

    def once(key: str, rows: int, df: Any) -> float:
        table = TYPES_TABLE if key.endswith("types") else pb.TABLE
        conn.execute(f"TRUNCATE {table}")
        if args.checkpoint:
            conn.execute("CHECKPOINT")
        with stopwatch() as elapsed:
            write(key, df)
        if table == pb.TABLE:
            if not pb.pg_checksum(conn).matches(expected if rows == args.rows else
                                                pb.spark_checksum(df)):
                raise RuntimeError(f"{key}: {pb.TABLE} does not hold the expected rows")
        else:
            types_rows_ok(conn, rows)
        return elapsed[0]

    keys = ["copy-binary", "postgres-sink", "copy-binary-types", "postgres-sink-types"]
    seconds: dict[str, list[float]] = {k: [] for k in keys}
    try:
        warm_rows = min(args.rows, 20_000)
        warm = {False: pb.materialise(pb.make_df(spark, warm_rows, args.partitions)),
                True: pb.materialise(make_types_df(spark, warm_rows, args.partitions))}
        for key in keys:
            once(key, warm_rows, warm[key.endswith("types")])
        for r in range(args.runs):
            for key in keys[r % len(keys):] + keys[: r % len(keys)]:
                secs = once(key, args.rows, wide if key.endswith("types") else narrow)
                seconds[key].append(secs)
                print(f"run {r + 1}/{args.runs} {key:20s} {secs:8.2f} s "
                      f"{args.rows / secs:12,.0f} rows/s", flush=True)
    finally:
        for sink in sinks.values():
            with contextlib.suppress(Exception):
                sink.close()
        for table in (pb.TABLE, TYPES_TABLE):
            with contextlib.suppress(Exception):
                conn.execute(f"DROP TABLE IF EXISTS {table}")
        with contextlib.suppress(Exception):
            pb.drop_ledger(conn)

    table_rows, ratios = [], {}
    for suffix in ("", "-types"):
        copy_s, sink_s = seconds[f"copy-binary{suffix}"], seconds[f"postgres-sink{suffix}"]
        ratio = sum(copy_s) / sum(sink_s)
        lo, hi = ratio_interval(copy_s, sink_s)
        paired = sorted(c / s for c, s in zip(copy_s, sink_s, strict=True))
        ratios[suffix] = ratio
        table_rows.append([
            "id, name, amount, ts" + (" + u uuid, ai integer[]" if suffix else ""),
            f"{args.rows / median(copy_s):,.0f}", f"{args.rows / median(sink_s):,.0f}",
            f"{ratio:.3f}x", f"{lo:.3f}x-{hi:.3f}x",
            f"{paired[0]:.3f}x-{paired[-1]:.3f}x (median {median(paired):.3f}x)"])
    print()
    print(f"## Column types: {args.rows:,} rows x {args.runs} round(s), {args.partitions} "
          "partitions, 4 contenders interleaved")
    print()
    print(format_table(["table", "COPY rows/s", "sink rows/s", "sink/COPY",
                        "95 % bootstrap", "per round"], table_rows, align="lrrrrl"))
    drop = 1 - ratios["-types"] / ratios[""]
    verdict = "met" if drop <= TARGET_RATIO_DROP else "NOT met"
    return [f"sink/COPY with uuid + integer[] {ratios['-types']:.3f}x vs without "
            f"{ratios['']:.3f}x: {-drop * 100:+.1f} % (target: at most "
            f"{TARGET_RATIO_DROP * 100:.0f} % lower: {verdict})",
            f"seconds per run: {({k: [round(s, 3) for s in v] for k, v in seconds.items()})}"]
