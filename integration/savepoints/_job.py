"""A driver for the savepoint tests: Kafka -> PostgresSink, ``Trigger.AvailableNow``.

``--variant 1`` is the old query; ``--variant 2`` the changed one (another projection that
gives the same columns, 5 shuffle partitions instead of 2 and a shuffle on ``id``): what a
savepoint lets a user deploy on a new checkpoint. ``--starting-offsets`` is the Kafka
source's ``startingOffsets`` (a savepoint's, or ``earliest``); ``--resume-from FILE`` passes
the savepoint in FILE to the sink (``resume_from``, with the query's checkpoint);
``--reset`` rebinds the sink instead. ``--on-sigterm`` installs
``connectors.stop_on_sigterm``.

    python -m integration.savepoints._job --conninfo ... --table t --sink-id s --topic in \\
        --checkpoint /ck --variant 1 --starting-offsets earliest
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from pyspark.sql import functions as sf


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    for name in ("--conninfo", "--table", "--sink-id", "--topic", "--checkpoint",
                 "--starting-offsets"):
        p.add_argument(name, required=True)
    p.add_argument("--ledger-table", default="public.eos_ledger")
    p.add_argument("--variant", type=int, choices=[1, 2], default=1)
    p.add_argument("--max-offsets", type=int, default=300)
    p.add_argument("--reset", action="store_true")
    p.add_argument("--resume-from", metavar="FILE")
    p.add_argument("--on-sigterm", action="store_true")
    p.add_argument("--trigger", choices=["available-now", "continuous"],
                   default="available-now")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)

    from connectors import PostgresSink, await_termination, load_savepoint, stop_on_sigterm
    from connectors.spark import get_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    partitions = "2" if args.variant == 1 else "5"
    spark = get_session("savepoint-job", master="local[2]", components=["kafka"],
                        conf={"spark.sql.shuffle.partitions": partitions,
                              "spark.ui.enabled": "false"})
    source = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", os.environ["EOS_KAFKA_BOOTSTRAP"])
              .option("subscribe", args.topic)
              .option("startingOffsets", args.starting_offsets)
              .option("maxOffsetsPerTrigger", args.max_offsets)
              .load())
    if args.variant == 1:
        rows = source.select(
            sf.get_json_object(sf.col("value").cast("string"), "$.id").cast("bigint").alias("id"),
            sf.col("partition").cast("int").alias("src_partition"))
    else:
        rows = (source
                .select(sf.from_json(sf.col("value").cast("string"), "id BIGINT").alias("v"),
                        sf.col("partition"))
                .select(sf.col("v.id").alias("id"),
                        sf.col("partition").cast("int").alias("src_partition"))
                .repartition("id"))
    resume = {} if args.resume_from is None else {
        "resume_from": load_savepoint(args.resume_from), "checkpoint_location": args.checkpoint}
    sink = PostgresSink(args.conninfo, args.table, sink_id=args.sink_id, create_table=True,
                        ledger_table=args.ledger_table, reset_binding=args.reset, **resume)
    writer = rows.writeStream.foreachBatch(sink).option("checkpointLocation", args.checkpoint)
    if args.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="500 milliseconds")
    query = writer.start()
    print(f"QUERY {query.id}", flush=True)
    if args.on_sigterm:
        stop_on_sigterm(query)
    started = time.monotonic()
    await_termination(query)
    print(f"DONE in {time.monotonic() - started:.1f} s", flush=True)
    sink.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
