"""The streaming job loop every example driver shares; each example keeps only its sink.

What is the same in ``examples/stream_to_*.py`` (and the integration drivers built on them):

- the common flags: :func:`job_parser` adds the source flags (``--source``, ``--input``,
  and for the Kafka source ``--input-topic``, ``--max-offsets-per-trigger``) first,
  :func:`add_run_flags` the run flags (``--master``, ``--batches``, ``--rows-per-batch``,
  ``--conf``) last; the example adds its own in between;
- the logging set-up and the ``finished in %.1f s`` line (:func:`run_timed`);
- a small local session (:func:`build_session`), classic or, with ``--connect``, a Spark
  Connect client (of a local Connect server, or of ``--master sc://host:port``);
- the replayable sources and the query over them (:func:`stream`): ``files`` and ``kafka``
  run with ``Trigger.AvailableNow`` (:func:`run_available_now`), ``rate`` writes
  ``--batches`` micro-batches, then the program stops the query (:func:`run_batches`).
  The query is named ``--query-name``, and the examples give their sinks that name
  (``query_name=``): under Spark Connect that is how a sink knows its query;
- ``--batch-run RUN_ID`` (with ``--source rate``): no streaming query, a batch job instead
  (:func:`run_batch_job`): the rate source's batch ``RUN_ID`` read as a static DataFrame
  (:func:`rate_batch`) and written once as ``sink(df, RUN_ID)``; after a crash, rerun
  with the same ``RUN_ID`` (``--checkpoint`` is not used).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

import connectors

__all__ = [
    "INPUT_SCHEMA",
    "BatchWriter",
    "ClosableSink",
    "DataSourceForm",
    "add_run_flags",
    "build_session",
    "check_source_flags",
    "conf_items",
    "connect_builder",
    "job_parser",
    "parse_job_args",
    "rate_as_input_rows",
    "rate_batch",
    "read_files",
    "read_kafka",
    "read_rate",
    "run_available_now",
    "run_batch_job",
    "run_batches",
    "run_timed",
    "setup_logging",
    "stream",
]

#: The columns of the files source (``examples.stream_to_files.make_input_files``).
INPUT_SCHEMA = "id LONG, name STRING, amount DOUBLE, ts TIMESTAMP"

#: What ``foreachBatch`` calls: a sink, or a function that hands the batch to one.
BatchWriter = Callable[[DataFrame, int], None]


class ClosableSink(Protocol):
    """A sink that holds connections: ``close()`` once the query is over."""

    def __call__(self, df: DataFrame, batch_id: int) -> None: ...

    def close(self) -> None: ...


def _same(df: DataFrame) -> DataFrame:
    return df


def job_parser(
    description: str, sources: Sequence[str] = ("files", "rate")
) -> argparse.ArgumentParser:
    """A parser with the source flags; the example adds its own, then :func:`add_run_flags`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--source", choices=list(sources), default="files")
    parser.add_argument("--input", help="input directory of JSON files (files source)")
    if "kafka" in sources:
        parser.add_argument("--input-topic", help="topic to read (kafka source)")
        parser.add_argument("--max-offsets-per-trigger", type=int, default=500)
    return parser


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """The flags after the example's own: Spark master, rate source sizes, Spark conf."""
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--batches", type=int, default=5, help="rate source: batches to write")
    parser.add_argument("--rows-per-batch", type=int, default=1000)
    parser.add_argument("--conf", action="append", default=[], help="extra Spark conf k=v")
    parser.add_argument("--connect", action="store_true",
                        help="run as a Spark Connect client: of a local Connect server "
                             "(--master local[...]) or of the server --master sc://host:port")
    parser.add_argument("--query-name", default="connectors-job",
                        help="the streaming query's name, given to the sink too")
    parser.add_argument("--on-sigterm", choices=["graceful", "plain"], default=None,
                        help="rate source: on SIGTERM stop the query gracefully "
                             "(connectors.stop_on_sigterm) or with a plain query.stop(), "
                             "then exit 0")
    add_metrics_flag(parser)
    _add_batch_run_flag(parser)


def add_metrics_flag(parser: argparse.ArgumentParser) -> None:
    """``--prometheus-textfile PATH``, read by :func:`run_timed`; every example has it."""
    parser.add_argument("--prometheus-textfile", default=None, metavar="PATH",
                        help="export the sinks' metrics to this Prometheus textfile "
                             "(connectors.PrometheusMetrics, docs/metrics.md)")


def check_source_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit with a usage error (code 2) when the chosen source lacks its input flag."""
    if args.source == "files" and not args.input:
        parser.error("--source files needs --input")
    if args.source == "kafka" and not args.input_topic:
        parser.error("--source kafka needs --input-topic")
    _check_batch_run_flag(parser, args)


def parse_job_args(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    *,
    from_env: tuple[str, str] | None = None,
) -> argparse.Namespace:
    """Add the run flags, parse ``argv`` and check the source flags. ``from_env``
    ``(dest, VARIABLE)``: a flag left out is taken from ``$VARIABLE``, and is required."""
    add_run_flags(parser)
    args = parser.parse_args(argv)
    if from_env is not None:
        dest, variable = from_env
        setattr(args, dest, getattr(args, dest) or os.environ.get(variable))
        if not getattr(args, dest):
            parser.error(f"pass --{dest.replace('_', '-')} or set ${variable}")
    check_source_flags(parser, args)
    return args


def setup_logging() -> None:
    """INFO lines with time and logger name on stderr; py4j's chatter only from WARNING."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)


def run_timed(
    run: Callable[[argparse.Namespace], int], args: argparse.Namespace, log: logging.Logger
) -> int:
    """Set up logging, ``run(args)``, log ``finished in %.1f s`` on ``log``; its exit code."""
    setup_logging()
    if args.prometheus_textfile:
        connectors.export_metrics(connectors.PrometheusMetrics(textfile=args.prometheus_textfile))
    start = time.monotonic()
    code = run(args)
    log.info("finished in %.1f s", time.monotonic() - start)
    return code


def connect_builder(master: str) -> SparkSession.Builder:
    """A Spark Connect client's builder: of a local server (``local[...]``, started by
    PySpark in a JVM of its own, whose Python workers run this interpreter) or of the
    server at ``sc://host:port``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return SparkSession.builder.remote(master)


def conf_items(conf: list[str]) -> dict[str, str]:
    """``--conf`` items ``k=v`` as settings (a later one of a key wins)."""
    return dict(item.partition("=")[::2] for item in conf)


def build_session(master: str, conf: list[str], *, connect: bool = False) -> SparkSession:
    """A small local session; ``conf`` items ``k=v`` (``spark.app.name=...`` too) win.
    ``connect``: a Spark Connect client (:func:`connect_builder`)."""
    base = connect_builder(master) if connect else SparkSession.builder.master(master)
    builder = (
        base
        .appName("connectors-stream-to-files")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopTimeout", "30s")
        # Small splits: every input file becomes several tasks, so a batch has several
        # transactions to prepare and commit.
        .config("spark.sql.files.maxPartitionBytes", "16k")
    )
    for key, value in conf_items(conf).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def read_files(spark: SparkSession, directory: str) -> DataFrame:
    """The files source: JSON files of :data:`INPUT_SCHEMA`, one file per micro-batch."""
    return spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).json(directory)


def read_rate(spark: SparkSession, rows_per_batch: int, partitions: int = 2) -> DataFrame:
    """Spark's ``rate-micro-batch`` source: ``(timestamp, value)``, values ``[b*R, (b+1)*R)``
    in batch ``b``; a restart replays a batch with the same rows in the same partitions."""
    return (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows_per_batch)
        .option("numPartitions", partitions)
        .option("startTimestamp", 0)
        .load()
    )


def read_kafka(spark: SparkSession, bootstrap: str, topic: str, max_offsets: int,
               options: dict[str, str] | None = None) -> DataFrame:
    """Spark's Kafka source from the earliest offset, committed records only, as
    ``(key, value, headers)`` (needs the Kafka jars: ``connectors.spark.resolve_jars``).
    ``options``: more source options (``kafka.security.protocol``, ...)."""
    return (
        spark.readStream.format("kafka")
        .options(**(options or {}))
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", max_offsets)
        .option("kafka.isolation.level", "read_committed")
        .option("includeHeaders", "true")
        .load()
        .select("key", "value", "headers")
    )


def rate_as_input_rows(df: DataFrame) -> DataFrame:
    """The rate source's ``(timestamp, value)`` as the files source's ``(id, name, amount,
    ts)``: ``id = value``, ``name = "rate-<id>"``, ``amount = id * 0.25``."""
    return df.select(
        sf.col("value").alias("id"),
        sf.concat(sf.lit("rate-"), sf.col("value").cast("string")).alias("name"),
        (sf.col("value") * sf.lit(0.25)).alias("amount"),
        sf.col("timestamp").alias("ts"),
    )


class DataSourceForm:
    """A sink's DataSource form (``docs/datasource.md``): the query writes with
    ``format(name).options(**options)`` instead of ``foreachBatch``."""

    def __init__(self, name: str, options: dict[str, str]) -> None:
        self.name, self.options = name, options

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        raise TypeError("a DataSource form is not called: the query writes through it")

    def close(self) -> None:
        """Nothing to release in this program: Spark's workers hold the sink."""


def run_available_now(df: DataFrame, write: BatchWriter, checkpoint: str,
                      name: str | None = None) -> int:
    """Write every micro-batch there is with ``write`` (``Trigger.AvailableNow``), then end:
    0, or the query's error raised. ``name``: the query's name. A :class:`DataSourceForm`
    writes through its data source."""
    writer = _named(df.writeStream, name)
    if isinstance(write, DataSourceForm):
        writer = writer.format(write.name).options(**write.options)
    else:
        writer = writer.foreachBatch(write)
    query = (
        writer
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    from connectors import await_termination

    await_termination(query)  # the query's error raised (noted when Spark refused to start)
    return 0


def _named(writer: DataStreamWriter, name: str | None) -> DataStreamWriter:
    return writer.queryName(name) if name else writer


def _on_sigterm(query: StreamingQuery, how: str | None) -> threading.Event | None:
    """``--on-sigterm``: install the SIGTERM handler; the event is set once it ran."""
    if how is None:
        return None
    import signal

    # Imported here: an earlier release's tree (upgrade tests) has no stop helpers.
    from connectors import stop_on_sigterm

    stopped = threading.Event()
    if how == "graceful":
        stop_on_sigterm(query)
        stop = signal.getsignal(signal.SIGTERM)

        def graceful(signum: int, frame: object) -> None:
            stopped.set()
            stop(signum, frame)  # type: ignore[operator]

        signal.signal(signal.SIGTERM, graceful)
        return stopped

    def plain(signum: int, frame: object) -> None:  # a user's query.stop(), off the handler
        stopped.set()
        threading.Thread(target=query.stop, daemon=True).start()

    signal.signal(signal.SIGTERM, plain)
    return stopped


def run_batches(df: DataFrame, write: BatchWriter, checkpoint: str, batches: int,
                name: str | None = None, on_sigterm: str | None = None) -> int:
    """Write micro-batches ``0 .. batches-1`` with ``write`` (every 100 ms), then stop the
    query: 0; the query's error raised; 1 if it ended otherwise before. ``on_sigterm``
    (``"graceful"`` or ``"plain"``): a SIGTERM stops the query that way, and then 0.

    Under Spark Connect ``write`` runs in a worker next to the server, so this program
    learns that the planned batches are done from the query's progress, not from ``write``.
    """
    # Under Connect ``write_planned`` is pickled for the worker: no event to set there.
    connect = type(df).__module__.startswith("pyspark.sql.connect.")
    done = None if connect else threading.Event()

    def write_planned(batch_df: DataFrame, batch_id: int) -> None:
        if batch_id >= batches:
            if done is not None:
                done.set()  # past the planned batches: write nothing, let main stop the query
            return
        write(batch_df, batch_id)

    query = (
        _named(df.writeStream, name).foreachBatch(write_planned)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    stopped = _on_sigterm(query, on_sigterm)
    while not (done.wait(0.2) if done is not None else time.sleep(0.2)):
        if not query.isActive:
            if stopped is not None and stopped.is_set():
                from connectors import await_termination

                await_termination(query)  # a graceful stop is a normal end
                return 0
            query.awaitTermination()  # raises the query's error
            return 1
        progress = query.lastProgress
        if progress is not None and int(progress["batchId"]) >= batches:
            break  # a batch past the planned ones has ended: they are all written
    query.stop()
    return 0


def stream(
    spark: SparkSession,
    args: argparse.Namespace,
    sink: ClosableSink,
    *,
    files: Callable[[DataFrame], DataFrame] = _same,
    rate: Callable[[DataFrame], DataFrame] = _same,
    bootstrap: str | None = None,
    source_options: dict[str, str] | None = None,
) -> int:
    """Run the query of ``args.source`` into ``sink``, then close ``sink`` and stop
    ``spark`` (also when the query fails); the exit code.

    ``files`` shapes the files source's stream, ``rate`` each batch of the rate source,
    before ``sink`` gets them; the Kafka source (``bootstrap``) reaches ``sink`` as read.
    """
    try:
        name = getattr(args, "query_name", None)
        if getattr(args, "batch_run", None) is not None:  # a batch job, not a stream
            return run_batch_job(rate(rate_batch(spark, args.batch_run, args.rows_per_batch)),
                                 sink, args.batch_run)
        if args.source == "rate":
            return run_batches(read_rate(spark, args.rows_per_batch),
                               lambda df, batch_id: sink(rate(df), batch_id),
                               args.checkpoint, args.batches, name,
                               getattr(args, "on_sigterm", None))
        if args.source == "kafka":
            if bootstrap is None:
                raise ValueError("the kafka source needs bootstrap servers")
            df = read_kafka(spark, bootstrap, args.input_topic, args.max_offsets_per_trigger,
                            source_options)
        else:
            df = files(read_files(spark, args.input))
        return run_available_now(df, sink, args.checkpoint, name)
    finally:
        if getattr(args, "connect", False):
            _log_connect_metrics(spark, sink)
        sink.close()
        spark.stop()


# ---- batch jobs: --batch-run RUN_ID ---------------------------------------------------


def _add_batch_run_flag(parser: argparse.ArgumentParser) -> None:
    """``--batch-run RUN_ID``: a batch job writing the rate source's batch ``RUN_ID``."""
    parser.add_argument("--batch-run", type=int, default=None, metavar="RUN_ID",
                        help="no streaming query: write the rows of the rate source's batch "
                             "RUN_ID once, as a batch job (sink(df, RUN_ID)); after a crash "
                             "rerun with the same RUN_ID. Needs --source rate")


def _check_batch_run_flag(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit with a usage error (code 2) on a ``--batch-run`` the job cannot run."""
    run_id = getattr(args, "batch_run", None)
    if run_id is None:
        return
    if args.source != "rate":
        parser.error("--batch-run writes the rate source's rows: use it with --source rate")
    if run_id < 0:
        parser.error("--batch-run needs a run id >= 0")


def rate_batch(spark: SparkSession, run_id: int, rows_per_batch: int,
               partitions: int = 2) -> DataFrame:
    """The rows :func:`read_rate` gives in batch ``run_id``, as a static DataFrame:
    ``(timestamp, value)``, values ``[N*R, (N+1)*R)`` for ``N = run_id``, each with the
    batch's timestamp (``startTimestamp`` 0 plus one second per batch), in ``partitions``
    partitions. The same rows on every rerun of a run id, other rows for another."""
    start = run_id * rows_per_batch
    return spark.range(start, start + rows_per_batch, 1, partitions).select(
        sf.timestamp_millis(sf.lit(run_id * 1000)).alias("timestamp"),
        sf.col("id").alias("value"),
    )


def run_batch_job(df: DataFrame, sink: ClosableSink, run_id: int) -> int:
    """Write the static ``df`` once with ``sink`` as run ``run_id`` of a batch job: 0, or
    the sink's error raised. Classic PySpark: ``sink(df, run_id)`` (no streaming query
    calls it, so the sink knows it is a batch job). Spark Connect cannot tell a batch call
    from a streaming one: ``run_batch(df, run_id)`` (a sink's, or a fan-out's such as
    ``DeltaSinks``). A :class:`DataSourceForm`: ``df.write.format(...)`` with the
    ``run_id`` option."""
    if isinstance(sink, DataSourceForm):
        (df.write.format(sink.name).options(**sink.options).option("run_id", str(run_id))
         .mode("append").save())
    elif type(df).__module__.startswith("pyspark.sql.connect."):
        sink.run_batch(df, run_id)  # type: ignore[attr-defined]
    else:
        sink(df, run_id)
    return 0


def _log_connect_metrics(spark: SparkSession, sink: object) -> None:
    """Under Spark Connect the client's sink is a copy that never runs: log the last
    metrics its worker published into the session (``connectors.spark.last_metrics``)."""
    from connectors.spark import last_metrics

    sinks = getattr(sink, "sinks", [sink])
    for one in sinks:
        sink_id = getattr(one, "sink_id", None)
        if sink_id is not None:
            try:
                found = last_metrics(spark, sink_id)
            except Exception as exc:  # the server is gone: nothing to read
                logging.getLogger(__name__).info("no metrics of sink %s: %s", sink_id,
                                                 type(exc).__name__)
                continue
            logging.getLogger(__name__).info("last metrics of sink %s: %s", sink_id, found)
