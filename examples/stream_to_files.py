"""A real Structured Streaming job into the example file-system sink.

Two replayable sources:

- ``files``: JSON files in ``--input`` (one file per micro-batch, ``Trigger.AvailableNow``:
  the query ends by itself when every file is processed);
- ``rate``: Spark's ``rate-micro-batch`` source, ``--rows-per-batch`` rows per batch with
  values ``[b*R, (b+1)*R)`` in batch ``b``; batches from ``--batches`` on are not written
  (the program then stops the query), so the expected output is values ``0 .. N*R-1``.

Run it, kill it (``CONNECTORS_TEST_MODE=1`` with ``CONNECTORS_CRASH_AT`` arms a crash
point), run it again with the same ``--checkpoint``: the output in ``--out`` is exact.
``python -m examples.stream_to_files -h``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from examples.fs_sink import FileSystemSink

INPUT_SCHEMA = "id LONG, name STRING, amount DOUBLE, ts TIMESTAMP"


def make_input_files(directory: str | os.PathLike[str], files: int, rows_per_file: int) -> int:
    """Write ``files`` JSON files of ``rows_per_file`` rows with unique ids; return rows."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    n = 0
    for f in range(files):
        lines = []
        for _ in range(rows_per_file):
            lines.append(json.dumps({
                "id": n, "name": f"name-{n}-é", "amount": n * 0.25,
                "ts": f"2026-01-01T00:{(n // 60) % 60:02d}:{n % 60:02d}Z",
            }))
            n += 1
        tmp = path / f".part-{f:05d}.json.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(path / f"part-{f:05d}.json")
    return n


def build_session(master: str, conf: list[str]) -> SparkSession:
    builder = (
        SparkSession.builder.master(master)
        .appName("connectors-stream-to-files")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopTimeout", "30s")
        # Small splits: every input file becomes several tasks, so a batch has several
        # transactions to prepare and commit.
        .config("spark.sql.files.maxPartitionBytes", "16k")
    )
    for item in conf:
        key, _, value = item.partition("=")
        builder = builder.config(key, value)
    return builder.getOrCreate()


def run(args: argparse.Namespace) -> int:
    spark = build_session(args.master, args.conf)
    sink = FileSystemSink(args.out, sink_id=args.sink_id)
    if args.source == "files":
        df = (
            spark.readStream.schema(INPUT_SCHEMA)
            .option("maxFilesPerTrigger", 1)
            .json(args.input)
        )
        query = (
            df.writeStream.foreachBatch(sink)
            .option("checkpointLocation", args.checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        spark.stop()
        return 0

    done = threading.Event()

    def write(batch_df: DataFrame, batch_id: int) -> None:
        if batch_id >= args.batches:
            done.set()  # past the planned batches: write nothing, let main stop the query
            return
        sink(batch_df, batch_id)

    df = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", args.rows_per_batch)
        .option("numPartitions", 2)
        .option("startTimestamp", 0)
        .load()
    )
    query = (
        df.writeStream.foreachBatch(write)
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    while not done.wait(0.2):
        if not query.isActive:
            query.awaitTermination()  # raises the query's error
            return 1
    query.stop()
    spark.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", choices=["files", "rate"], default="files")
    parser.add_argument("--input", help="input directory of JSON files (files source)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--sink-id", default="files")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--batches", type=int, default=5, help="rate source: batches to write")
    parser.add_argument("--rows-per-batch", type=int, default=1000)
    parser.add_argument("--conf", action="append", default=[], help="extra Spark conf k=v")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    start = time.monotonic()
    code = run(args)
    logging.getLogger("examples").info("finished in %.1f s", time.monotonic() - start)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
