"""The DataSource form: a prepared-transaction sink as a Spark Python data source.

``df.writeStream.format("connectors.postgres").option(...).start()`` and
``df.write.format("connectors.postgres").option("run_id", ...).save()`` write through the
same sink, participants, ledger and transaction ids as ``foreachBatch(sink)``; the batch's
steps are :mod:`connectors.core.driver.planned`'s, in the three processes Spark gives a data
source (design and measurements: ``docs/datasource.md``):

- the planning worker (the driver's, before the batch's tasks) constructs the data source
  and calls ``streamWriter``: ``sink.driver.plan`` (open a run, RECONCILING, the sink's
  checks of the schema); the writer it returns carries the run to the tasks;
- each task: ``write`` prepares under that run; its message carries the outcome, the run,
  and the batch and query ids the task read from Spark's local properties
  (``streaming.sql.batchId``, which PySpark's own ``foreach`` reads for its epoch id, and
  ``sql.streaming.queryId``); a property missing refuses the batch;
- the commit worker (the driver's, after the tasks) unpickles the data source (its
  ``__init__`` does not run there, which tells the two ``streamWriter`` calls apart) and
  calls ``commit(messages, batch_id)``: ``sink.driver.commit``; or ``abort``.

The sink is built from the options by its class's ``from_options`` and kept per worker
process (Spark reuses its planning and commit workers): one driver connection per sink
and worker, not one per batch.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

import pyarrow as pa

try:
    from pyspark.sql.datasource import WriterCommitMessage
except ImportError:  # pyspark 3.5 has no Python data sources: data_source_for refuses
    WriterCommitMessage = object  # type: ignore[misc,assignment]

from connectors.core.batch import TaskOutcome
from connectors.core.driver.planned import RunTicket
from connectors.core.errors import ConfigurationError, GracefulStop, ProtocolStateError
from connectors.core.ledgers.ledger import BATCH_JOB_QUERY_ID
from connectors.core.metrics import MetricsExporter, adopt_exporters, registered_exporters
from connectors.core.protocol.crash import set_kill_scope_to_group
from connectors.core.templates.options import Options
from connectors.core.templates.tasks import prepare_task
from connectors.spark._rows import arrow_schema, flat_schema
from connectors.spark._tasks import run_in_task

if TYPE_CHECKING:
    from connectors.core.templates.families import PreparedTransactionSink

__all__ = ["BATCH_ID_PROPERTY", "QUERY_ID_PROPERTY", "Prepared", "data_source_for", "register"]

logger = logging.getLogger(__name__)

#: The task's local property naming its micro-batch (PySpark's ``foreach`` reads it too).
BATCH_ID_PROPERTY = "streaming.sql.batchId"
#: The task's local property naming its streaming query (Spark's StreamExecution sets it).
QUERY_ID_PROPERTY = "sql.streaming.queryId"
#: Where the write's Arrow batches carry their timestamps (only the schema's checks use it).
_ZONE = "UTC"


@dataclass
class Prepared(WriterCommitMessage):
    """A task's commit message: its outcome, the run it prepared under, and the batch and
    query it read from Spark (``None`` where Spark did not say)."""

    outcome: bytes
    ticket: RunTicket
    batch_id: int | None
    query_id: str | None


@functools.lru_cache(maxsize=16)
def _cached_sink(cls: type[PreparedTransactionSink[Any]], options: tuple[tuple[str, str], ...]
                 ) -> PreparedTransactionSink[Any]:
    reader = Options(dict(options))
    sink = cast("PreparedTransactionSink[Any]", cls.from_options(reader))
    reader.sink_id = sink.sink_id
    reader.check_all_read()
    return sink


def _sink(cls: type[PreparedTransactionSink[Any]], options: Mapping[str, str]
          ) -> PreparedTransactionSink[Any]:
    return _cached_sink(cls, tuple(sorted((str(k).lower(), str(v)) for k, v in options.items())))


@functools.cache
def _worker_logging(level: int | None) -> None:
    """In a Spark worker (planning, task, commit), log ``connectors`` lines at ``level`` on
    stderr, as the driver that registered the source did: Spark configures no logging in
    its Python workers, so the commit's metrics line would otherwise go nowhere. Once per
    process; nothing when the driver logged nothing, or when the worker has handlers."""
    root = logging.getLogger()
    if level is None or root.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    package = logging.getLogger("connectors")
    package.addHandler(handler)
    package.setLevel(level)


def _driver_log_level() -> int | None:
    """The level ``connectors`` logs at in this (driver) process, if anything shows it."""
    package = logging.getLogger("connectors")
    shown = any(not isinstance(h, logging.NullHandler)
                for lg in (package, logging.getLogger()) for h in lg.handlers)
    return package.getEffectiveLevel() if shown else None


def _refuse_if_stopping(sink: PreparedTransactionSink[Any]) -> None:
    """The planning step of a query whose graceful stop was requested on this host
    (:func:`connectors.stop_gracefully`): refuse the batch before anything is written;
    Spark replays it at the next start."""
    from connectors.spark._stop import host_stop_flag

    flags = host_stop_flag("-").parent
    if not flags.is_dir() or not any(flags.iterdir()):
        return  # no stop requested on this host: no ledger read on the batch's path
    query_id = sink.create_ledger().bound_query()
    if query_id is not None and host_stop_flag(query_id).exists():
        logger.info("sink %s: graceful stop requested: the next batch is not started; it "
                    "is replayed when the query starts again", sink.sink_id)
        raise GracefulStop(f"a graceful stop of query {query_id} was requested: the next "
                           "batch was not started (it is replayed when the query starts "
                           "again)", sink_id=sink.sink_id)


def _check_schema(sink: PreparedTransactionSink[Any], schema: Any) -> pa.Schema:
    if not flat_schema(schema):
        raise ConfigurationError(
            "the DataSource form hashes rows in its tasks, which take columns of atomic "
            "types and arrays of them, not structs or maps: flatten them (select the "
            "fields, to_json) or use the foreachBatch form", sink_id=sink.sink_id)
    return arrow_schema(schema, timezone=_ZONE)


def _prepare(sink: PreparedTransactionSink[Any], ticket: RunTicket, schema: pa.Schema,
             batch_id: int | None, query_id: str | None,
             batches: Iterator[pa.RecordBatch]) -> Prepared:
    """A task: prepare the partition's rows under the planning step's run."""
    if batch_id is None or query_id is None:
        missing = BATCH_ID_PROPERTY if batch_id is None else QUERY_ID_PROPERTY
        error = ConfigurationError(
            f"Spark did not give the task its {missing!r} property, by which the DataSource "
            "form names the batch and binds to the query: this Spark version is not "
            "supported in this form; use df.writeStream.foreachBatch(sink)",
            sink_id=sink.sink_id)
        return Prepared(TaskOutcome(error=error).to_bytes(), ticket, batch_id, query_id)
    fn = functools.partial(prepare_task, sink, ticket.run_id, batch_id, schema)
    outcome = run_in_task(fn, batches)
    return Prepared(outcome.to_bytes(), ticket, batch_id, query_id)


def _outcomes(sink_id: str, messages: list[Any], batch_id: int
              ) -> tuple[RunTicket | None, str | None, list[TaskOutcome]]:
    """The tasks' run, query and outcomes; refused when the messages disagree."""
    found = [m for m in messages if isinstance(m, Prepared)]
    tickets = {m.ticket for m in found}
    queries = {m.query_id for m in found}
    batches = {m.batch_id for m in found}
    if len(tickets) > 1 or len(queries) > 1 or batches - {batch_id}:
        raise ProtocolStateError(
            f"the tasks of batch {batch_id} wrote under {len(tickets)} runs, for batches "
            f"{sorted(b for b in batches if b is not None)}: refusing to decide",
            sink_id=sink_id, batch_id=batch_id)
    ticket = next(iter(tickets)) if tickets else None
    query = next(iter(queries)) if queries else None
    return ticket, query, [TaskOutcome.from_bytes(m.outcome) for m in found]


def data_source_for(sink_class: type[PreparedTransactionSink[Any]], name: str,
                    log_level: int | None = None,
                    exporters: tuple[MetricsExporter, ...] = ()) -> type:
    """A Spark data source class named ``name`` for ``sink_class`` (a
    :class:`~connectors.core.templates.families.PreparedTransactionSink` subclass with
    ``from_options``); its workers log at ``log_level`` (``None``: not at all) and its
    commit worker hands each batch's metrics to ``exporters`` (those of the registering
    process that travel, e.g. a Prometheus text file)."""
    try:
        from pyspark.sql.datasource import (
            DataSource,
            DataSourceArrowWriter,
            DataSourceStreamArrowWriter,
        )
    except ImportError:  # 3.5: no Python data sources; 4.0: streaming writers get Rows
        import pyspark

        raise ConfigurationError(
            "the DataSource form needs pyspark >= 4.1 (its streaming writers take Arrow "
            f"batches), and this pyspark is {pyspark.__version__}; with it use "
            "df.writeStream.foreachBatch(sink)") from None

    class StreamWriter(DataSourceStreamArrowWriter):
        def __init__(self, sink: PreparedTransactionSink[Any], ticket: RunTicket | None,
                     schema: pa.Schema) -> None:
            self.sink, self.ticket, self.schema = sink, ticket, schema

        def write(self, iterator: Iterator[pa.RecordBatch]) -> Prepared:
            from pyspark import TaskContext

            _worker_logging(log_level)
            if self.ticket is None:  # pragma: no cover - the commit side never writes
                raise ProtocolStateError("a commit worker's writer asked to write")
            ctx = TaskContext.get()
            batch = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx else None
            query = ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx else None
            return _prepare(self.sink, self.ticket, self.schema,
                            int(batch) if batch else None, query or None, iterator)

        def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's
            _worker_logging(log_level)
            adopt_exporters(exporters)
            set_kill_scope_to_group()
            ticket, query, outcomes = _outcomes(self.sink.sink_id, messages, batchId)
            if ticket is None or query is None:
                logger.info("sink %s batch %d: no task wrote (no partition): nothing to "
                            "decide", self.sink.sink_id, batchId)
                return
            self.sink.driver.commit(ticket, batchId, query, self.schema, outcomes)

        def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's
            _worker_logging(log_level)
            set_kill_scope_to_group()
            ticket, _, _ = _outcomes(self.sink.sink_id, messages, batchId)
            self.sink.driver.abort(ticket, batchId)

    class BatchWriter(DataSourceArrowWriter):
        def __init__(self, sink: PreparedTransactionSink[Any], ticket: RunTicket,
                     schema: pa.Schema, run_id: int) -> None:
            self.sink, self.ticket, self.schema, self.run_id = sink, ticket, schema, run_id

        def write(self, iterator: Iterator[pa.RecordBatch]) -> Prepared:
            _worker_logging(log_level)
            return _prepare(self.sink, self.ticket, self.schema, self.run_id,
                            BATCH_JOB_QUERY_ID, iterator)

        def commit(self, messages: list[Any]) -> None:
            _worker_logging(log_level)
            adopt_exporters(exporters)
            set_kill_scope_to_group()
            ticket, query, outcomes = _outcomes(self.sink.sink_id, messages, self.run_id)
            self.sink.driver.commit(ticket or self.ticket, self.run_id,
                                         query or BATCH_JOB_QUERY_ID, self.schema, outcomes)

        def abort(self, messages: list[Any]) -> None:
            _worker_logging(log_level)
            set_kill_scope_to_group()
            self.sink.driver.abort(self.ticket, self.run_id)

    source = name  # (``name`` is a method in the class body below)

    class SinkSource(DataSource):
        source_name: ClassVar[str] = source
        sink_type: ClassVar[type[PreparedTransactionSink[Any]]] = sink_class

        @classmethod
        def name(cls) -> str:
            return cls.source_name

        def __init__(self, options: dict[str, str]) -> None:
            super().__init__(options)
            self._planning = True  # dropped when pickled: the commit worker unpickles

        def __getstate__(self) -> dict[str, Any]:
            state = dict(self.__dict__)
            state.pop("_planning", None)
            return state

        def _sink(self) -> PreparedTransactionSink[Any]:
            _worker_logging(log_level)
            options = {k: v for k, v in self.options.items() if k.lower() != "run_id"}
            return _sink(self.sink_type, options)

        def streamWriter(self, schema: Any, overwrite: bool) -> StreamWriter:  # noqa: N802
            sink = self._sink()
            if overwrite:
                raise ConfigurationError(
                    "the DataSource form appends (outputMode 'append'); the complete mode "
                    "rewrites the target, which this sink does not", sink_id=sink.sink_id)
            arrow = _check_schema(sink, schema)
            if not self.__dict__.get("_planning"):  # the commit worker: the run comes later
                return StreamWriter(sink, None, arrow)
            _refuse_if_stopping(sink)
            return StreamWriter(sink, sink.driver.plan(arrow), arrow)

        def writer(self, schema: Any, overwrite: bool) -> BatchWriter:
            sink = self._sink()
            reader = Options(dict(self.options), sink.sink_id)
            if not reader.has("run_id"):
                raise ConfigurationError(
                    'a batch write needs .option("run_id", N): rerunning the job with the '
                    "same N after a crash finishes that run exactly once; a new run needs a "
                    "greater N", sink_id=sink.sink_id)
            run_id = reader.integer("run_id", 0)
            if overwrite:
                raise ConfigurationError(
                    "the DataSource form appends (mode 'append'); overwrite rewrites the "
                    "target, which this sink does not", sink_id=sink.sink_id)
            arrow = _check_schema(sink, schema)
            return BatchWriter(sink, sink.driver.plan(arrow), arrow, run_id)

    SinkSource.__name__ = SinkSource.__qualname__ = f"{sink_class.__name__}Source"
    return SinkSource


def register(spark: Any, sink_class: type | None = None, *, name: str | None = None
             ) -> list[str]:
    """Register the DataSource form of sinks with ``spark`` (a classic or Spark Connect
    session); returns the names registered, for ``format(name)``.

    Without ``sink_class``: every built-in sink that has the form (``connectors.postgres``,
    :class:`~connectors.PostgresSink`). With one: that
    :class:`~connectors.sdk.PreparedTransactionSink` subclass, whose ``from_options``
    builds it from the options, under ``name`` (default: its ``data_source_name``).

    Example::

        import connectors

        connectors.register(spark)
        query = (df.writeStream.format("connectors.postgres")
                 .option("conninfo", conninfo).option("table", "public.events")
                 .option("create_table", "true").option("sink_id", sink_id)
                 .option("checkpointLocation", ckpt).start())
    """
    if sink_class is None:
        from connectors.postgres import PostgresSink

        classes: list[type] = [PostgresSink]
    else:
        classes = [sink_class]
    from connectors.core.templates.families import PreparedTransactionSink

    names = []
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, PreparedTransactionSink)):
            raise ConfigurationError(
                f"{getattr(cls, '__name__', cls)!r} has no DataSource form: only "
                "prepared-transaction sinks (PostgresSink, PreparedTransactionSink "
                "subclasses) have one (KafkaSink and DeltaSink need what a data source "
                "cannot have: docs/datasource.md); use df.writeStream.foreachBatch(sink)")
        source = name if sink_class is not None and name else cls.data_source_name
        if not source:
            raise ConfigurationError(
                f"{cls.__name__} has no data_source_name: pass name= to register")
        travelling = tuple(e for e in registered_exporters() if e.travels)
        # built first: it refuses a pyspark without the form, whose session has no dataSource
        form = data_source_for(cls, source, _driver_log_level(), travelling)
        spark.dataSource.register(form)
        names.append(source)
    return names
