"""A driver for the savepoint tests: a Kafka topic or a Delta table into PostgresSink,
KafkaSink, DeltaSink or a FanOut of the three, ``Trigger.AvailableNow`` by default.

``--variant 1`` is the old query; ``--variant 2`` the changed one: another projection that
gives the same ids, 5 shuffle partitions instead of 2 and a shuffle on ``id``, and (into
Kafka and Delta, whose rows take it) a deterministic column added, ``twice = 2 * id``
(DeltaSink with ``merge_schema``). What a savepoint lets a user deploy on a new checkpoint.

Sources: ``--source kafka --topic T --starting-offsets JSON|earliest`` (``maxOffsetsPerTrigger``
``--max-offsets``), or ``--source delta --source-path P --starting-version V``. Sinks:
``--sink postgres`` (``--conninfo``, ``--table``, ``--ledger-table``), ``kafka``
(``--out-topic``), ``delta`` (``--out-path``), ``fanout`` (all three, sink ids
``<sink-id>-pg``, ``-kafka``, ``-delta``; the fan-out's is ``--sink-id``).
``--resume-from FILE`` passes the savepoint in FILE to the sink (``resume_from``, with the
query's checkpoint); ``--reset`` rebinds instead. ``--form datasource`` writes PostgresSink's
DataSource form (``format("connectors.postgres")``, the savepoint as an option).
``--on-sigterm`` installs ``connectors.stop_on_sigterm``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--sink-id", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--source", choices=["kafka", "delta"], default="kafka")
    p.add_argument("--topic")
    p.add_argument("--starting-offsets", default="earliest")
    p.add_argument("--max-offsets", type=int, default=300)
    p.add_argument("--source-path")
    p.add_argument("--starting-version")
    p.add_argument("--sink", choices=["postgres", "kafka", "delta", "fanout"],
                   default="postgres")
    p.add_argument("--conninfo")
    p.add_argument("--table")
    p.add_argument("--ledger-table", default="public.eos_ledger")
    p.add_argument("--out-topic")
    p.add_argument("--out-path")
    p.add_argument("--variant", type=int, choices=[1, 2], default=1)
    p.add_argument("--reset", action="store_true")
    p.add_argument("--resume-from", metavar="FILE")
    p.add_argument("--on-sigterm", action="store_true")
    p.add_argument("--form", choices=["callable", "datasource"], default="callable")
    p.add_argument("--trigger", choices=["available-now", "continuous"],
                   default="available-now")
    return p


def _source(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    if args.source == "delta":
        return (spark.readStream.format("delta")
                .option("startingVersion", args.starting_version).load(args.source_path)
                .select(sf.to_json(sf.struct(sf.col("id"))).alias("value"),
                        sf.lit(-1).alias("partition")))
    return (spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", os.environ["EOS_KAFKA_BOOTSTRAP"])
            .option("subscribe", args.topic)
            .option("startingOffsets", args.starting_offsets)
            .option("maxOffsetsPerTrigger", args.max_offsets)
            .load())


def _rows(source: DataFrame, variant: int) -> DataFrame:
    if variant == 1:
        return source.select(
            sf.get_json_object(sf.col("value").cast("string"), "$.id").cast("bigint").alias("id"),
            sf.col("partition").cast("int").alias("src_partition"))
    return (source
            .select(sf.from_json(sf.col("value").cast("string"), "id BIGINT").alias("v"),
                    sf.col("partition"))
            .select(sf.col("v.id").alias("id"),
                    sf.col("partition").cast("int").alias("src_partition"))
            .repartition("id"))


def _records(df: DataFrame) -> DataFrame:
    """KafkaSink's records: the id as the key, every column as JSON in the value."""
    return df.select(sf.col("id").cast("string").alias("key"),
                     sf.to_json(sf.struct(*df.columns)).alias("value"))


def _sinks(args: argparse.Namespace, resume: dict[str, Any]) -> Any:
    from connectors import DeltaSink, FanOut, KafkaSink, PostgresSink

    kafka = {"bootstrap.servers": os.environ["EOS_KAFKA_BOOTSTRAP"]}
    common = dict(reset_binding=args.reset, **resume)
    if args.sink == "postgres":
        return PostgresSink(args.conninfo, args.table, sink_id=args.sink_id, create_table=True,
                            ledger_table=args.ledger_table, **common)
    if args.sink == "kafka":
        return KafkaSink(args.out_topic, kafka, sink_id=args.sink_id, **common)
    if args.sink == "delta":
        return DeltaSink(args.out_path, sink_id=args.sink_id, create_table=True,
                         merge_schema=True, **common)
    targets = (PostgresSink(args.conninfo, args.table, sink_id=f"{args.sink_id}-pg",
                            create_table=True, ledger_table=args.ledger_table),
               (KafkaSink(args.out_topic, kafka, sink_id=f"{args.sink_id}-kafka"), _records),
               DeltaSink(args.out_path, sink_id=f"{args.sink_id}-delta", create_table=True,
                         merge_schema=True))
    return FanOut(*targets, sink_id=args.sink_id, reset_binding=args.reset, **resume)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)

    from connectors import await_termination, load_savepoint, stop_on_sigterm
    from connectors.spark import get_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    partitions = "2" if args.variant == 1 else "5"
    spark = get_session("savepoint-job", master="local[2]", components=["kafka", "delta"],
                        conf={"spark.sql.shuffle.partitions": partitions,
                              "spark.ui.enabled": "false"})
    rows = _rows(_source(spark, args), args.variant)
    if args.variant == 2 and args.sink in ("kafka", "delta"):
        rows = rows.withColumn("twice", sf.col("id") * 2)  # a deterministic column added
    if args.sink == "kafka":
        rows = _records(rows)
    resume = {} if args.resume_from is None else {
        "resume_from": load_savepoint(args.resume_from), "checkpoint_location": args.checkpoint}
    sink = _sinks(args, resume)
    if args.form == "datasource":  # the same sink, as text options; the savepoint's file
        import connectors

        connectors.register(spark)
        options = {"conninfo": args.conninfo, "table": args.table, "sink_id": args.sink_id,
                   "ledger_table": args.ledger_table, "create_table": "true"}
        if args.resume_from is not None:
            options.update(resume_from=args.resume_from, checkpoint_location=args.checkpoint)
        writer = rows.writeStream.format("connectors.postgres").options(**options)
    else:
        writer = rows.writeStream.foreachBatch(sink)
    writer = writer.option("checkpointLocation", args.checkpoint)
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
