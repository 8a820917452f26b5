"""A streaming job for the per-key order tests: keyed records tagged (input partition, seq).

Spark's ``rate-micro-batch`` source (replayable, deterministic: a restart replays a batch
with the same rows in the same partitions), ``--partitions`` input partitions, each of
which yields its ``value`` column in increasing order. Every row becomes a record with key
``k<value % keys>`` and the JSON value ``{"p": <input partition>, "seq": <value>, "b":
<batch id>}``: the records of one key come from every input partition, in increasing
``seq`` within each. Batches from ``--batches`` on are not written, then the job stops.

Self-contained on purpose (only pyspark, ``connectors.kafka`` and the examples' job loop,
``examples/_runner.py``, itself pyspark only): the upgrade test runs it on the code of an
earlier release, put first on ``PYTHONPATH``, with this tree's ``_runner.py`` added.
``python integration/kafka/_order_job.py -h``.
"""

from __future__ import annotations

import argparse
import logging

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf

import connectors
from connectors.kafka import KafkaSink
from examples._runner import read_rate, run_batches

log = logging.getLogger("integration.order_job")


def records(df: DataFrame, batch_id: int, keys: int) -> DataFrame:
    """The rate rows as keyed records tagged with their input partition and sequence."""
    return df.select(
        sf.concat(sf.lit("k"), (sf.col("value") % keys).cast("string")).alias("key"),
        sf.to_json(sf.struct(
            sf.spark_partition_id().alias("p"),
            sf.col("value").alias("seq"),
            sf.lit(batch_id).alias("b"),
        )).alias("value"),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--sink-id", required=True)
    parser.add_argument("--slots", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--keys", type=int, default=7)
    parser.add_argument("--rows-per-batch", type=int, default=2400)
    parser.add_argument("--batches", type=int, default=3)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    log.info("connectors from %s", connectors.__file__)
    spark = (SparkSession.builder.master("local[2]").appName("connectors-order-job")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.streaming.stopTimeout", "30s")
             .getOrCreate())
    sink = KafkaSink(args.topic, {"bootstrap.servers": args.bootstrap}, sink_id=args.sink_id,
                     slots=args.slots)

    def write(batch_df: DataFrame, batch_id: int) -> None:
        sink(records(batch_df, batch_id, args.keys), batch_id)

    try:
        return run_batches(read_rate(spark, args.rows_per_batch, args.partitions), write,
                           args.checkpoint, args.batches)
    finally:
        sink.close()
        spark.stop()


if __name__ == "__main__":
    raise SystemExit(main())
