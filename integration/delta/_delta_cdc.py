"""A deterministic change stream into Delta, and what the tables must hold after it.

Run as a program (``python -m integration.delta._delta_cdc --root DIR --checkpoint CKPT
--batches N --rows-per-batch R [--sinks cond,fn,replace,dynamic]``) it streams Spark's
``rate-micro-batch`` source through :func:`changes` (value ``v`` becomes one change) into
up to four ``DeltaSink`` s fed by one ``foreachBatch`` (``DeltaSinks``), tables under
``DIR``:

- ``cond`` (sink ``cdc-cond``): the condition form: ``merge_on=["id"]``,
  ``sequence_column="seq"``, ``delete_when="s.op = 'd'"``, ``update_when="s.seq > t.seq"``,
  ``exclude_columns=["op"]`` (the table has no ``op``);
- ``fn`` (sink ``cdc-fn``): the function form (:func:`apply_changes`, the batch
  deduplicated on ``id`` by ``seq`` first), which keeps ``op`` in the table;
- ``replace`` (sink ``cdc-replace``): ``mode="overwrite", replace_where="bucket >= 0"``
  (rows with a negative bucket, seeded by the test, stay);
- ``dynamic`` (sink ``cdc-dynamic``): ``mode="overwrite",
  partition_overwrite_mode="dynamic", partition_by=["bucket"]``.

The change of ``v`` (:func:`change`): ``seq = v``; ``op = 'd'`` when ``v % 5 == 3``, else
``'u'``; ``id = 1000 + v`` when ``v % 10 == 8`` (a delete of a key never seen), else
``v % 37`` (several changes per key within a batch and across batches, deletes of existing
keys, a delete then a re-insert); ``bucket = (v // R + v % 2) % 3`` (two partitions per
batch, changing from batch to batch).
"""

from __future__ import annotations

from typing import Any

KEYS = 37
SINKS = {"cond": "cdc-cond", "fn": "cdc-fn", "replace": "cdc-replace",
         "dynamic": "cdc-dynamic"}
#: Columns of a change, in the batch's order.
COLUMNS = ["id", "op", "seq", "name", "amount", "bucket"]


def change(v: int, rows_per_batch: int) -> tuple[Any, ...]:
    """The change the stream makes of value ``v`` (``COLUMNS``)."""
    op = "d" if v % 5 == 3 else "u"
    key = 1000 + v if v % 10 == 8 else v % KEYS
    return (key, op, v, f"c-{v}", v * 0.5, (v // rows_per_batch + v % 2) % 3)


def changes(df: Any, rows_per_batch: int) -> Any:
    """The rate source's ``(timestamp, value)`` as changes (the same as :func:`change`)."""
    from pyspark.sql import functions as F

    v = F.col("value")
    return df.select(
        F.when(v % 10 == 8, v + 1000).otherwise(v % KEYS).alias("id"),
        F.when(v % 5 == 3, F.lit("d")).otherwise(F.lit("u")).alias("op"),
        v.alias("seq"),
        F.concat(F.lit("c-"), v.cast("string")).alias("name"),
        (v * F.lit(0.5)).alias("amount"),
        ((F.floor(v / rows_per_batch) + v % 2) % 3).cast("long").alias("bucket"),
    )


def apply_changes(target: Any, source: Any) -> Any:
    """The function form's MERGE: a delete deletes, anything else upserts every column."""
    return (target.alias("t").merge(source.alias("s"), "t.id = s.id")
            .whenMatchedDelete("s.op = 'd'")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll("s.op != 'd'"))


def expected_merge(values: range, rows_per_batch: int) -> dict[int, tuple[Any, ...]]:
    """id -> the row the table holds after every change of ``values`` in ``seq`` order (a
    plain application of the whole input, the last change of a key winning): ``COLUMNS``."""
    state: dict[int, tuple[Any, ...]] = {}
    for v in values:
        row = change(v, rows_per_batch)
        if row[1] == "d":
            state.pop(row[0], None)
        else:
            state[row[0]] = row
    return state


def expected_dynamic(batches: int, rows_per_batch: int) -> list[tuple[Any, ...]]:
    """Dynamic partition overwrite: per bucket, the rows of the last batch holding it."""
    last: dict[int, list[tuple[Any, ...]]] = {}
    for b in range(batches):
        rows = [change(v, rows_per_batch) for v in range(b * rows_per_batch,
                                                          (b + 1) * rows_per_batch)]
        for bucket in {r[5] for r in rows}:
            last[bucket] = [r for r in rows if r[5] == bucket]
    return sorted(r for rows in last.values() for r in rows)


def make_sinks(root: str, names: list[str], query_name: str | None = None) -> Any:
    import functools

    from connectors.delta import DeltaSink as Sink
    from connectors.delta import DeltaSinks

    # (under Spark Connect a sink knows its query by name)
    DeltaSink = functools.partial(Sink, query_name=query_name)

    made = {
        "cond": lambda: DeltaSink(
            f"{root}/cond", sink_id=SINKS["cond"], merge_on=["id"], sequence_column="seq",
            delete_when="s.op = 'd'", update_when="s.seq > t.seq", exclude_columns=["op"],
            create_table=True),
        "fn": lambda: DeltaSink(
            f"{root}/fn", sink_id=SINKS["fn"], merge_on=["id"], sequence_column="seq",
            merge=apply_changes, create_table=True),
        "replace": lambda: DeltaSink(
            f"{root}/replace", sink_id=SINKS["replace"], mode="overwrite",
            replace_where="bucket >= 0", create_table=True),
        "dynamic": lambda: DeltaSink(
            f"{root}/dynamic", sink_id=SINKS["dynamic"], mode="overwrite",
            partition_overwrite_mode="dynamic", partition_by=["bucket"], create_table=True),
    }
    return DeltaSinks([made[n]() for n in names])


def main(argv: list[str] | None = None) -> int:
    import logging
    import sys

    from examples._runner import job_parser, parse_job_args, run_timed, stream
    from examples.stream_to_delta import build_session

    parser = job_parser("a deterministic change stream into Delta", sources=("rate",))
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--root", required=True, help="the tables' directory")
    parser.add_argument("--sinks", default="cond,fn,replace,dynamic")
    args = parse_job_args(parser, ["--source", "rate", *(argv if argv is not None else
                                                           sys.argv[1:])])
    log = logging.getLogger("integration.delta._delta_cdc")

    def run(args: Any) -> int:
        sinks = make_sinks(args.root, [s for s in args.sinks.split(",") if s],
                           args.query_name or None)
        spark = build_session(args.master, args.conf, connect=args.connect)
        return stream(spark, args, sinks,
                      rate=lambda df: changes(df, args.rows_per_batch))

    return run_timed(run, args, log)


if __name__ == "__main__":
    raise SystemExit(main())
