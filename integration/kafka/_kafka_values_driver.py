"""A streaming driver whose one micro-batch holds a bad record with a distinctive key and
value, for integration/kafka/test_kafka_values_in_errors.py: the query fails, and the test
greps everything the driver printed (its traceback, its log lines, the JVM's stderr).

``python -m integration.kafka._kafka_values_driver --input DIR --checkpoint DIR --topic T
--sink-id S --bootstrap B --case {too_large,partition,topic_column} [--barrier]
[--values-in-errors]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pyspark.sql import functions as sf

from connectors.kafka import KafkaSink
from examples._runner import build_session, run_available_now, setup_logging

#: What a bad record carries; the test looks for these strings.
SECRET_KEY = "KEY-9f81c-distinctive"
SECRET_VALUE = "VALUE-4e7d2-distinctive"
#: Bytes that make a record too large (the sink's ``message.max.bytes`` below is 10,000).
LARGE = 20_000


def write_input(directory: Path, case: str) -> None:
    """One JSON file: 50 good rows and the bad one."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = [{"k": f"good-{i}", "v": f"fine-{i}", "p": 0} for i in range(50)]
    bad: dict[str, object] = {"k": SECRET_KEY, "v": SECRET_VALUE, "p": 0}
    if case in ("too_large", "topic_column"):
        bad["v"] = SECRET_VALUE + "x" * LARGE
    else:
        bad["p"] = 7  # the topic has 2 partitions
    rows.insert(20, bad)
    (directory / "part-0.json").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("--input", "--checkpoint", "--topic", "--sink-id", "--bootstrap", "--case"):
        parser.add_argument(name, required=True)
    parser.add_argument("--barrier", action="store_true")
    parser.add_argument("--values-in-errors", action="store_true")
    args = parser.parse_args()
    setup_logging()
    write_input(Path(args.input), args.case)
    spark = build_session("local[2]", [])
    df = spark.readStream.schema("k STRING, v STRING, p INT").json(args.input)
    columns = [sf.col("k").alias("key"), sf.col("v").alias("value")]
    if args.case == "partition":
        columns.append(sf.col("p").alias("partition"))
    if args.case == "topic_column":
        columns.append(sf.lit(args.topic).alias("topic"))
    sink = KafkaSink(
        None if args.case == "topic_column" else args.topic,
        {"bootstrap.servers": args.bootstrap, "message.max.bytes": 10_000},
        sink_id=args.sink_id, slots=2, barrier=args.barrier,
        values_in_errors=args.values_in_errors,
    )
    # Raises: the bad record fails the batch.
    return run_available_now(df.select(*columns), sink, args.checkpoint)


if __name__ == "__main__":
    raise SystemExit(main())
