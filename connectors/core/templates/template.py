"""``TwoPhaseCommitSink``: the template connector authors subclass.

An instance is the callable given to ``df.writeStream.foreachBatch(sink)``; it also works in
a batch job as ``sink(df, run_id)`` with an increasing integer ``run_id``. The template
does, once for every target: binding the sink to its query, reconciling what a previous
run left, the ledger check that turns a replay into a no-op, running the tasks, collecting
committables, the decision, committing with retries, sweeping stray transactions, the
replay fingerprint check, crash points, and metrics.

Connector authors subclass one of the three protocol families
(:mod:`connectors.core.templates.families`) and implement its hooks. Each hook's docstring
says who calls it (a task on an executor, or the driver), when, and which idempotency it
must guarantee.

The hooks of a prepared-transaction sink, in outline (a complete, runnable sink is
``examples/fs_sink.py``; the README's ``my_sink.py`` is a driver-commit one)::

    class MySink(PreparedTransactionSink[MyTxn]):
        def create_ledger(self): ...
        def begin_transaction(self, txn): ...
        def write(self, handle, batch): ...
        def pre_commit(self, handle, fingerprint): ...
        def abort_transaction(self, handle): ...
        def commit(self, commit): ...
        def abort(self, transaction_id): ...
        def list_prepared(self): ...

    query = df.writeStream.foreachBatch(MySink(sink_id="mine")).start()
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Literal

import pyarrow as pa

from connectors.core.batch import BatchContext, BatchInput
from connectors.core.driver.sink_driver import SinkDriver
from connectors.core.engine import EngineCall, batch_input_for
from connectors.core.errors import ConfigurationError
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers.ledger import Ledger
from connectors.core.metrics import BatchMetrics, registered_exporters
from connectors.core.naming import validate_sink_id
from connectors.core.policies.binding import ResumePoint, resume_option
from connectors.core.policies.restarts import DEFAULT_OUTAGE_TIMEOUT, Outage
from connectors.core.policies.retry import DEFAULT_COMMIT_RETRY, RetryPolicy
from connectors.core.states import Family
from connectors.core.templates.options import Options

__all__ = ["TwoPhaseCommitSink"]

logger = logging.getLogger(__name__)
ReplayPolicy = Literal["fail", "warn"]

#: Like Spark's ``spark.sql.streaming.minBatchesToRetain`` (100): decisions kept in the
#: ledger, enough for ``doctor`` to compare with Spark's commit log.
DEFAULT_KEEP_BATCHES = 100


class TwoPhaseCommitSink(ABC):
    """Base of every sink: the ``foreachBatch`` entry point and the shared machinery.

    Args:
        sink_id: stable name of the sink; root of every transaction id and ledger key.
            Required; 1-40 characters of ``A-Za-z0-9_-``.
        retry: retry policy for transient commit errors (bounded; then the batch fails).
        reset_binding: bind the sink to a new streaming query (a new checkpoint) and forget
            its ledger. Without it, a sink bound to another query refuses to write.
        resume_from: a savepoint of the sink (:class:`connectors.savepoints.Savepoint`,
            or the path of its JSON document, ``connectors savepoint --output``; the
            DataSource form's option of the same name): the new query (a new checkpoint, changed
            code) takes the sink over where the savepoint ended, checked before anything is
            written: the sink's last decision is the savepoint's batch and the new query's
            sources start exactly where the savepoint's ended (a gap or an overlap is
            refused, naming both positions). Needs ``checkpoint_location``; excludes
            ``reset_binding``. A restart of the resumed query resumes nothing.
        checkpoint_location: the new query's checkpoint (as given to
            ``.option("checkpointLocation", ...)``), where ``resume_from`` reads the
            sources' starting positions: a local directory or ``file:`` URI.
        on_replay_mismatch: ``"fail"`` (default) raises
            :class:`~connectors.core.errors.NonDeterministicReplayError` when a replayed
            batch differs from the committed one; ``"warn"`` logs and keeps the committed
            rows (the operator's override).
        keep_batches: decisions retained in the ledger.
        values_in_errors: let errors and log lines quote row values (the target's
            ``DETAIL: Failing row contains (...)``, a record's key, a rejected value).
            Default ``False``: errors name the table, column, constraint, topic or
            partition, never a row's contents, so job logs keep no personal data.
        query_name: the name of the streaming query that runs the sink
            (``.queryName(...)``). Required under Spark Connect, whose ``foreachBatch``
            worker is not told which query calls it: the sink binds to the active query of
            that name. Unused in classic PySpark, where Spark tells the sink the query's id.
        outage_timeout: seconds a target (database, broker, table store) may stay
            unavailable without ending the query (default 120, a managed failover): a batch
            that failed with a transient error runs again, as a new driver run that first
            settles what the failed attempt left, with backoff (1 s doubling to 10 s), until
            it lands or the target has been unavailable that long since the batch's first
            failure; then :class:`~connectors.core.errors.RetriesExhaustedError` names the
            target and the bound. ``0``: the first failed attempt ends the batch.
    """

    #: The protocol family; set by the three family classes below.
    family: ClassVar[Family]
    #: Whether tasks hash their rows for the fingerprint themselves (vectorised, in
    #: Python) instead of receiving the JVM's ``xxhash64`` of every row as an extra column.
    #: Cheaper for rows of numbers and short strings (no extra projection and Arrow
    #: column); nested types always use the JVM. Must not change while a batch may be
    #: replayed: a replay's fingerprint is computed the same way (see
    #: :mod:`connectors.spark.frames`).
    hash_rows_in_tasks: ClassVar[bool] = False
    #: COMMIT_ON_DRIVER only: see :class:`DriverCommitSink`.
    fingerprint_in_commit: ClassVar[bool] = False
    #: The name of the sink's DataSource form (``format(...)``; see :meth:`from_options`
    #: and ``connectors.register``), if it has one.
    data_source_name: ClassVar[str | None] = None

    def __init__(
        self,
        *,
        sink_id: str,
        retry: RetryPolicy = DEFAULT_COMMIT_RETRY,
        reset_binding: bool = False,
        resume_from: ResumePoint | str | None = None,
        checkpoint_location: str | None = None,
        on_replay_mismatch: ReplayPolicy = "fail",
        keep_batches: int = DEFAULT_KEEP_BATCHES,
        values_in_errors: bool = False,
        query_name: str | None = None,
        outage_timeout: float = DEFAULT_OUTAGE_TIMEOUT,
    ) -> None:
        self.sink_id = validate_sink_id(sink_id)
        if query_name is not None and (not isinstance(query_name, str) or not query_name):
            raise ConfigurationError(
                "query_name must be the streaming query's name (a non-empty string, as "
                "given to .queryName(...))", sink_id=sink_id)
        if not isinstance(retry, RetryPolicy):
            raise ConfigurationError(
                "retry must be a RetryPolicy such as ExponentialBackoff()", sink_id=sink_id
            )
        if on_replay_mismatch not in ("fail", "warn"):
            raise ConfigurationError(
                f"on_replay_mismatch must be 'fail' or 'warn', not {on_replay_mismatch!r}",
                sink_id=sink_id,
            )
        if not isinstance(keep_batches, int) or keep_batches < 1:
            raise ConfigurationError("keep_batches must be an int >= 1", sink_id=sink_id)
        try:
            #: How a batch rides out an unavailable target (``outage_timeout``).
            self.outage = Outage(timeout=outage_timeout)
        except ConfigurationError as exc:
            raise ConfigurationError(f"outage_timeout: {exc}", sink_id=sink_id) from None
        self.retry = retry
        self.reset_binding = bool(reset_binding)
        #: ``resume_from`` and the new query's checkpoint (see the arguments).
        self.resume = resume_option(sink_id, resume_from, checkpoint_location,
                                    self.reset_binding)
        self.on_replay_mismatch: ReplayPolicy = on_replay_mismatch
        self.keep_batches = keep_batches
        #: Whether errors and logs may quote row values (see ``values_in_errors``).
        self.values_in_errors = bool(values_in_errors)
        #: The streaming query's name (``.queryName``), if the user gave it.
        self.query_name = query_name
        #: Metrics of the last batch this sink handled on this driver.
        self.last_metrics: BatchMetrics | None = None
        self._driver: SinkDriver | None = None

    # ---- pickling: executors get the configuration, never the driver's connections ----
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_driver"] = None
        state["last_metrics"] = None
        # The process's metrics exporters travel with the sink: a driver elsewhere (Spark
        # Connect's foreachBatch worker) starts them on its first batch.
        state["_exporters"] = tuple(e for e in registered_exporters() if e.travels)
        return state

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sink_id={self.sink_id!r})"

    # ---- the DataSource form: a sink built from text options ----
    @classmethod
    def from_options(cls, options: Options) -> TwoPhaseCommitSink:
        """A sink from the DataSource form's options (``.option(key, value)``, read with
        :class:`~connectors.core.templates.options.Options`; :meth:`template_options` reads the
        template's own). Default: this sink has no DataSource form."""
        raise ConfigurationError(
            f"{cls.__name__} has no DataSource form (it defines no from_options): use "
            "df.writeStream.foreachBatch(sink)")

    @staticmethod
    def template_options(options: Options) -> dict[str, Any]:
        """The template's keyword arguments from ``options``: ``reset_binding``,
        ``on_replay_mismatch``, ``keep_batches``, ``values_in_errors``,
        ``outage_timeout`` (the names of :class:`TwoPhaseCommitSink`'s arguments)."""
        mismatch = options.text("on_replay_mismatch", "fail")
        return {
            "reset_binding": options.flag("reset_binding"),
            "resume_from": options.optional("resume_from"),
            "checkpoint_location": options.optional("checkpoint_location"),
            "on_replay_mismatch": mismatch,
            "keep_batches": options.integer("keep_batches", DEFAULT_KEEP_BATCHES),
            "values_in_errors": options.flag("values_in_errors"),
            "outage_timeout": options.number("outage_timeout", DEFAULT_OUTAGE_TIMEOUT),
        }

    # ---- hooks shared by every family ----
    @abstractmethod
    def create_ledger(self) -> Ledger:
        """Driver, once, when the driver's first run starts (after :meth:`begin_run`): the
        sink's durable ledger (no I/O needed yet)."""

    def create_ledger_for(self, sink_id: str) -> Ledger:
        """Driver, once, for a fan-out whose first target this sink is: a ledger of this
        sink's kind, in its store, for the decisions of ``sink_id`` (another id than the
        sink's). Default: none; the fan-out then needs ``ledger=``."""
        raise ConfigurationError(
            f"{type(self).__name__} keeps no ledger for others: pass ledger= to the FanOut "
            f"{sink_id!r}, or put a target that does first", sink_id=sink_id)

    def validate_input(self, schema: pa.Schema) -> None:  # noqa: B027 - optional hook
        """Driver, before any task of a batch runs: refuse input that cannot be written.

        Raise :class:`~connectors.core.errors.BadInputError` naming the problem and the
        fix; nothing of the batch is written then.
        """

    def partition_input(self, batch: BatchInput) -> BatchInput:
        """Driver, after :meth:`validate_input`: how the batch is split into tasks.

        The default keeps Spark's partitioning. A sink that must route rows (e.g. every
        key to one task, so that two prepared transactions never wait on each other's row
        locks) returns ``batch.slotted(n, columns)``.
        """
        return batch

    def plan_input(self, batch: BatchInput, ctx: BatchContext) -> BatchInput:
        """Driver, once per new batch (never for a replay the ledger already has), before
        any task runs: check the input and split it into the tasks the protocol runs.

        The default calls :meth:`validate_input`, then the family's split
        (:meth:`partition_input`; a task-commit sink's slots). A sink that needs more
        (its target's metadata, a check of every record before any slot runs) overrides
        it and calls ``super()``, or returns a batch of the same rows.
        """
        self.validate_input(batch.schema)
        return self.partition_input(batch)

    def check_input(self, batch: BatchInput, ctx: BatchContext) -> None:  # noqa: B027
        """Driver, in a fan-out (:class:`~connectors.core.templates.fanout.FanOut`) after
        :meth:`plan_input`, before the fan-out decides; not for PREPARE_IN_TASK, whose
        tasks have prepared by then. Raise :class:`~connectors.core.errors.BadInputError`
        for what the target would refuse only while committing (a task-commit sink's
        record checks left to its slots' job; a table's constraints on values): in a
        fan-out that commit comes after the other targets committed. ``batch`` is what
        :meth:`plan_input` returned. Default: nothing."""

    def fingerprint_input(self, batch: BatchInput) -> Fingerprint | None:
        """Driver: the batch's fingerprint for the replay check (``None`` skips the check).

        The default runs one job over the batch; override to derive it more cheaply.
        """
        return batch.fingerprint()

    def begin_run(self, ctx: BatchContext) -> None:  # noqa: B027 - optional hook
        """Driver, when a driver run starts (its first batch, and the batch after a failed
        one), before the ledger is opened or read: ``ctx.batch`` is the batch that starts
        it (a sink whose ledger needs the engine takes it from there: a session's
        configuration, a catalog). Drop what an earlier run believed about the target
        (caches of its state), since a failed step's outcome is known only to the target."""

    def describe_target(self) -> str:
        """What the sink writes to, for messages (no secret): e.g. ``PostgreSQL
        db.example:5432/app``. Default: the sink's class name."""
        return type(self).__name__

    def report_metrics(self, metrics: BatchMetrics) -> None:  # noqa: B027 - optional hook
        """Driver, after every batch (also a failed one), before its metrics line is
        logged: add the sink's own figures to ``metrics.extra`` (what its tasks returned,
        e.g. :meth:`TaskCommitSink.commit_slot
        <connectors.core.templates.families.TaskCommitSink.commit_slot>`'s figures, are in
        ``metrics.task_figures``)."""

    # ---- the entry point ----
    def __call__(self, df: Any, batch_id: int) -> None:
        """``foreachBatch`` entry point: write ``df`` as batch ``batch_id``, exactly once."""
        self._call(df, batch_id, batch_job=False)

    def run_batch(self, df: Any, run_id: int) -> BatchMetrics:
        """Write ``df`` once in a batch job (not a stream), as run ``run_id``.

        Rerunning the job with the same ``run_id`` after a crash finishes that run exactly
        once; a new run needs a greater ``run_id``. ``sink(df, run_id)`` does the same in
        classic PySpark; under Spark Connect a streaming call and a batch call look alike,
        and this says which one it is.
        """
        return self._call(df, run_id, batch_job=True)

    def _call(self, df: Any, batch_id: int, *, batch_job: bool) -> BatchMetrics:
        if getattr(df, "isStreaming", False):
            raise ConfigurationError(
                "the sink got a streaming DataFrame: use it as "
                "df.writeStream.foreachBatch(sink), or call it with a batch DataFrame",
                sink_id=self.sink_id,
            )
        call = EngineCall(self.sink_id, self.hash_rows_in_tasks, self.query_name, batch_job)
        batch, query_id = batch_input_for(df, call)
        return self.write_batch(batch, batch_id, query_id=query_id)

    def write_batch(
        self, batch: BatchInput, batch_id: int, *, query_id: str | None = None
    ) -> BatchMetrics:
        """Write one batch exactly once; the engine-independent entry point.

        ``query_id`` is the streaming query's id (``None`` for a batch job). A streaming
        batch is refused with :class:`~connectors.core.errors.GracefulStop`, before any side
        effect, once a graceful stop of its query was requested
        (:func:`connectors.stop_gracefully`).
        Returns the batch's metrics (also kept in :attr:`last_metrics`).
        """
        if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
            raise ConfigurationError(
                f"batch id must be an int >= 0, got {batch_id!r}; in a batch job pass an "
                "increasing run id",
                sink_id=self.sink_id,
            )
        return self.driver.write(batch_id, {self.sink_id: batch}, query_id)[self.sink_id]

    @property
    def driver(self) -> SinkDriver:
        """The sink's driver side (:class:`~connectors.core.driver.sink_driver.SinkDriver`): its
        run and ledger on this driver, and the one place its batches run."""
        if self._driver is None:
            self._driver = SinkDriver(self)
        return self._driver

    def close(self) -> None:
        """Driver: release the ledger's resources. The sink may be used again."""
        if self._driver is not None:
            self._driver.close()
            self._driver = None

