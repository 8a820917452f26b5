"""A streaming job as users submit it to a cluster: ``spark-submit ... submitted_job.py``.

Self-contained on purpose (the standard library, pyspark and the installed package only):
spark-submit runs it with the packed environment's Python, outside this repository.
Spark's ``rate-micro-batch`` source (replayable: a batch replays the same rows) into a
PostgresSink, ``--batches`` micro-batches, then the query stops. Before it starts, the job
records where its executors' Python runs and which ``connectors`` it imports (``--report``,
JSON): the test proves both lie in the shipped archive.

    spark-submit --master spark://host:7077 --archives env.tar.gz#environment \\
        --conf spark.pyspark.python=./environment/bin/python submitted_job.py \\
        --conninfo ... --table t --sink-id s --checkpoint /ckpt --batches 4 --report r.json
"""

from __future__ import annotations

import argparse
import json
import sys
import threading

from pyspark.sql import DataFrame, SparkSession

import connectors
from connectors import PostgresSink


def where_executors_run(spark: SparkSession) -> list[list[str]]:
    """``[sys.executable, connectors.__file__]`` of the executors' Python workers."""
    slots = int(spark.conf.get("spark.cores.max", "2"))

    def probe(_: object) -> tuple[str, str]:
        import connectors as shipped

        return sys.executable, str(shipped.__file__)

    found = spark.sparkContext.parallelize(range(4 * slots), 4 * slots).map(probe).collect()
    return sorted(map(list, set(found)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    for name in ("--conninfo", "--table", "--sink-id", "--checkpoint", "--report"):
        parser.add_argument(name, required=True)
    parser.add_argument("--ledger-table", default="public.eos_ledger")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--rows-per-batch", type=int, default=500)
    args = parser.parse_args()

    spark = SparkSession.builder.appName("submitted-job").getOrCreate()  # spark-submit's master
    with open(args.report, "w") as out:
        json.dump({"driver": [sys.executable, connectors.__file__],
                   "master": spark.sparkContext.master,
                   "executors": where_executors_run(spark)}, out)

    sink = PostgresSink(args.conninfo, args.table, sink_id=args.sink_id, create_table=True,
                        ledger_table=args.ledger_table)
    done = threading.Event()

    def write_planned(batch: DataFrame, batch_id: int) -> None:
        if batch_id >= args.batches:
            done.set()  # past the planned batches: write nothing
            return
        sink(batch, batch_id)

    rows = (spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", args.rows_per_batch).option("numPartitions", 2)
            .option("startTimestamp", 0).load()
            .selectExpr("value AS id", "concat('n', CAST(value AS STRING)) AS name"))
    query = (rows.writeStream.foreachBatch(write_planned)
             .option("checkpointLocation", args.checkpoint)
             .trigger(processingTime="100 milliseconds").start())
    while not done.wait(0.2):
        if not query.isActive:
            query.awaitTermination()  # raises the query's error
            return 1
    query.stop()
    sink.close()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
