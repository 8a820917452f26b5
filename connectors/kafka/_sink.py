"""``KafkaSink``: exactly-once into Kafka with one transactional producer per slot.

librdkafka has no KIP-939 (no prepared transaction that outlives its producer) and exposes
no producer id/epoch, so a Kafka transaction is committed in the task that wrote it
(protocol family ``COMMIT_IN_TASK``). A replay is made idempotent by a **marker**: every
slot's transaction also writes ``(sink, generation, batch, slot, fingerprint)`` to the
slot's own partition of a compacted marker topic; a retried task or a replayed batch reads
that partition after fencing and writes nothing for a slot already committed.

Executor side, once per slot (see :func:`connectors.core.templates.tasks.slot_task`):
  1. ``open_slot``: a producer with ``transactional.id = eos1|<sink_id>|slot|<n>``;
     ``init_transactions`` fences any earlier owner and aborts its open transaction (or
     the producer this Python worker kept from the slot's previous batch, once a flushed
     probe record proves it is still the slot's newest; fenced later, it is found out by
     the commit at the latest and the slot starts over with a new producer; see
     :mod:`connectors.kafka._pool`);
  2. ``read_marker``: the slot's marker partition, ``read_committed``, to its end; a marker
     for this batch means "already committed"; a failed read fails the task;
  3. ``write``: check every record (size, topic, partition) before producing it;
  4. ``commit_slot``: produce the marker, flush; in barrier mode ``allGather`` every slot's
     outcome and commit only if every slot flushed and validated; then commit.

Driver side: the ledger (:class:`~connectors.kafka._ledger.KafkaLedger`) records each
batch COMMITTED after all its slots committed; ``fence_all`` fences every slot id the sink
ever used at (re)start and after a failed batch.

The sink is the template's hooks delegating to collaborators, each given what it uses:

- :class:`~connectors.kafka._clients.KafkaClients`: config, options, clients, errors;
- :class:`~connectors.kafka._checks.RecordChecks`: every record check, driver and task;
- :class:`~connectors.kafka._driver_slots.DriverSlots`: driver: slots, placement, markers, fencing;
- :class:`~connectors.kafka._writer.SlotWriter` (open, read marker, write) and
  :class:`~connectors.kafka._committer.SlotCommitter` (commit, abort): a slot's task,
  aligned in barrier mode by :class:`~connectors.kafka._task_slot.Alignment`; records are
  produced by :mod:`connectors.kafka._produce`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar

import pyarrow as pa

from connectors.core.batch import BatchContext, BatchInput
from connectors.core.errors import BadInputError, ConfigurationError, ConnectorError
from connectors.core.ledgers.ledger import Ledger
from connectors.core.metrics import BatchMetrics
from connectors.core.protocol.transactions import SlotPlan
from connectors.core.templates.families import TaskCommitSink
from connectors.core.templates.tasks import SlotMarker, SlotTransaction
from connectors.kafka._checks import RecordChecks
from connectors.kafka._clients import KafkaClients
from connectors.kafka._committer import SlotCommitter
from connectors.kafka._config import (
    DEFAULT_TRANSACTION_TIMEOUT_MS,
    KafkaConfig,
    KafkaOptions,
    default_ledger_topic,
    default_marker_topic,
)
from connectors.kafka._driver_slots import PLACEMENT_KEY, PLACEMENT_ROW, DriverSlots, check_barrier
from connectors.kafka._figures import slot_figures
from connectors.kafka._ledger import KafkaLedger
from connectors.kafka._records import RecordLimits
from connectors.kafka._scan import FrameChecks, bad_input_message
from connectors.kafka._spark import ErrorMappingBatch
from connectors.kafka._task_slot import Alignment, Slot, marker_key
from connectors.kafka._writer import SlotWriter
from connectors.spark.inputs import batch_handover
from connectors.spark.toolkit import Handover, require_spark

__all__ = ["SMALL_BATCH_ROWS", "KafkaSink", "marker_key"]

#: Default ``small_batch_rows``: batches of at most this many records skip the shuffle.
SMALL_BATCH_ROWS = 1000

logger = logging.getLogger(__name__)


class KafkaSink(TaskCommitSink[Slot]):
    """Exactly-once sink into Kafka topics, for ``foreachBatch`` and batch jobs.

    Columns as Spark's own Kafka sink: ``value`` (string or binary, required), optional
    ``key``, ``headers`` (``array<struct<key: string, value: binary>>``), ``partition`` and
    ``topic``. Other columns are ignored (but take part in the replay fingerprint).

    Args:
        topic: the topic to write, or ``None`` to take each record's topic from a ``topic``
            column (a given topic wins over the column, as in Spark's sink). Topic names are
            Kafka's 1-249 characters of ``A-Za-z0-9._-``: others are refused at construction
            or, from the column, per batch before anything is produced.
        config: librdkafka producer config (``bootstrap.servers``, security settings,
            ``transaction.timeout.ms``, ``linger.ms``, ...). The sink owns
            ``transactional.id``, ``enable.idempotence`` and ``acks``. Secret values never
            appear in logs, reprs or errors.
        sink_id: the sink's stable name (1-40 characters of ``A-Za-z0-9_-``): root of the
            transactional ids ``eos1|<sink_id>|slot|<n>`` and of the internal topics.
        slots: number of slots = transactional ids = tasks per batch. Default: Spark's
            default parallelism at the first batch. Stored; it cannot change while a batch
            is unfinished.
        barrier: ``False`` (default): every record is validated (size, topic, partition)
            before any slot runs (in the map stage of the slotting shuffle; with a
            ``topic`` column, in one aggregation job first), so a bad batch commits
            nothing; then each slot commits as soon as it has flushed. ``True``: the slots
            run as one Spark barrier stage and none commits before every slot has written,
            flushed and validated its records, so a slot that fails on the broker's side
            (not only on bad input) aborts every slot of that attempt. It needs ``slots`` free
            task slots, no dynamic allocation, and adds a barrier round to every batch:
            Spark's ``BarrierTaskContext`` polls its coordinator once a second (see
            docs/kafka.md).
        slot_columns: the columns hashed to place rows into slots. Default: a record with
            a ``key`` by its key alone, so the records of one key from one input partition
            keep their order (as with Spark's writer); a keyless one by all its columns.
        create_topic: create ``topic`` when it is missing (``topic_partitions`` partitions).
        marker_topic: default ``_connectors.<sink_id>.markers`` (compacted, one partition
            per slot, created by the sink).
        ledger_topic: default ``_connectors.<sink_id>.ledger`` (compacted, created).
        replication_factor: of the topics the sink creates (-1: the broker default).
        operation_timeout: seconds for one client operation (metadata, init, commit).
        reuse_producers: a Python worker keeps the producer (and the marker reader) of the
            slot it ran for the slot's next task (default ``True``): no
            ``init_transactions`` and no marker read per slot and batch (what they cost:
            benchmarks/README.md). A flushed probe record into the slot's marker partition
            proves a kept producer still owns the slot before each batch (and so that the
            newest marker is still the one it committed); one fenced later is found out by
            its commit, and the slot starts over.
        batch_produce: how a slot enqueues its records. ``True`` (default): in batches of
            up to 16,384 records straight from the Arrow buffers, on a librdkafka handle
            the library owns (``CONNECTORS_KAFKA_PRODUCER``: ``auto``/``owned``/
            ``confluent``), else on confluent-kafka's ``Producer`` through a ctypes
            accelerator where its layout is verified, else ``Producer.produce_batch``;
            ``"public"``: ``Producer.produce_batch`` only; ``False``: one ``produce()`` per
            record. Records with ``headers`` are produced one by one.
            ``CONNECTORS_ACCELERATORS=off`` turns the accelerator off. Rows per path are
            the batch metrics ``produce_owned_rows``, ``produce_native_rows``,
            ``produce_batch_rows`` and ``produce_record_rows``. See docs/kafka.md,
            "The slot producer" and "Batch produce".
        small_batch_rows: a batch of at most this many records (default 1,000) skips the
            slotting shuffle: one Spark job collects its rows to the driver (at most
            ``small_batch_rows + 1`` of each input partition: a batch found larger then
            takes the shuffle), each with the slot the shuffle would have given
            it, and the driver runs the slots' transactions, a thread per slot. A
            100-record batch then takes one Spark job instead of two stages and a Python
            stage. Placement, markers, replays and
            per-key order are those of the shuffle. Tried only while the previous batch
            was this small too; not with ``barrier=True``; 0 turns it off. The batch
            metric ``driver_slots`` says which route a batch took. See docs/kafka.md,
            "Small batches".
        **options: the template's options (``retry``, ``reset_binding``,
            ``on_replay_mismatch``, ``keep_batches``).

    Example::

        from connectors.kafka import KafkaSink
        sink = KafkaSink(topic, {"bootstrap.servers": bootstrap}, sink_id=sink_id,
                         create_topic=True)
        query = (df.selectExpr("CAST(id AS STRING) AS key", "to_json(struct(*)) AS value")
                 .writeStream.foreachBatch(sink)
                 .option("checkpointLocation", ckpt).start())

    Consumers must read with ``isolation.level=read_committed``. Transaction markers take
    offsets, so a consumer's lag never quite reaches 0.
    """

    #: Building one needs pyspark, but not the one ``admin`` builds to fence the slots.
    _spark_needed: ClassVar[bool] = True

    def __init__(
        self,
        topic: str | None,
        config: dict[str, Any],
        *,
        sink_id: str,
        slots: int | None = None,
        barrier: bool = False,
        slot_columns: list[str] | None = None,
        create_topic: bool = False,
        topic_partitions: int = 1,
        marker_topic: str | None = None,
        ledger_topic: str | None = None,
        replication_factor: int = -1,
        operation_timeout: float = 30.0,
        reuse_producers: bool = True,
        batch_produce: bool | str = True,
        small_batch_rows: int = SMALL_BATCH_ROWS,
        **options: Any,
    ) -> None:
        if self._spark_needed:
            require_spark("KafkaSink")
        super().__init__(
            sink_id=sink_id, slots=slots if slots is not None else 1,
            slot_columns=slot_columns, barrier=barrier, small_batch_rows=small_batch_rows,
            **options,
        )
        kafka_config = KafkaConfig(config)
        timeout_ms = kafka_config.get("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS)
        try:
            timeout_ms = int(timeout_ms)
        except (TypeError, ValueError):
            raise ConfigurationError("transaction.timeout.ms must be an int (milliseconds)",
                                     sink_id=sink_id) from None
        try:
            kafka_options = KafkaOptions(
                topic=topic,
                marker_topic=(marker_topic if marker_topic is not None
                              else default_marker_topic(self.sink_id)),
                ledger_topic=(ledger_topic if ledger_topic is not None
                              else default_ledger_topic(self.sink_id)),
                create_topic=bool(create_topic),
                topic_partitions=topic_partitions,
                replication_factor=replication_factor,
                transaction_timeout_ms=timeout_ms,
                operation_timeout_s=float(operation_timeout),
                reuse_producers=bool(reuse_producers),
                batch_produce=batch_produce,
            )
        except ConfigurationError as exc:
            exc.sink_id = self.sink_id
            raise
        self._auto_slots = slots is None
        self._clients = KafkaClients(kafka_config, kafka_options, sink_id=self.sink_id)
        #: The record checks (the DataFrame ones of ``barrier=False`` hold JVM references).
        self._checks = RecordChecks(self._clients, FrameChecks(self.sink_id,
                                                               self.values_in_errors),
                                    values_in_errors=self.values_in_errors)
        self._slot_book = DriverSlots(self._clients)
        self._alignment = Alignment(self.sink_id, self.barrier)
        self._writer = SlotWriter(self._clients, self._checks, self._alignment)
        self._committer = SlotCommitter(self._clients, self._writer, self._alignment,
                                        on_replay_mismatch=self.on_replay_mismatch)
        self._ledger: KafkaLedger | None = None
        #: The batch in flight's Arrow hand-over and row bound, for its metrics.
        self._handover: Handover | None = None
        self._bound: int | None = None
        #: barrier=True: the batch in flight before its checks (:meth:`check_input`).
        self._unchecked: BatchInput | None = None

    @property
    def config(self) -> KafkaConfig:
        """The librdkafka config (secrets masked in its repr)."""
        return self._clients.config

    @property
    def options(self) -> KafkaOptions:
        return self._clients.options

    @property
    def limits(self) -> RecordLimits:
        """What a record must fit (the driver reads the topic's limit)."""
        return self._checks.limits

    @limits.setter
    def limits(self, limits: RecordLimits) -> None:
        self._checks.limits = limits

    @property
    def known_topics(self) -> dict[str, int]:
        """Partition counts of topics the driver checked (shipped to the tasks)."""
        return self._checks.known_topics

    def describe_target(self) -> str:  # for messages (the bootstrap list holds no secret)
        return f"the Kafka cluster at {self.config.bootstrap}"

    def __repr__(self) -> str:
        return (
            f"KafkaSink({self.options.topic!r}, {self.config!r}, sink_id={self.sink_id!r}, "
            f"slots={self.slots if not self._auto_slots else 'auto'}, barrier={self.barrier})"
        )

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_ledger"] = None  # driver clients never travel to executors (nor the
        state["_handover"] = None  # JVM references: see the collaborators' __getstate__)
        state["_unchecked"] = None
        return state

    # ------------------------------------------------------------------ task side

    def open_slot(self, slot: SlotTransaction) -> Slot:
        return self._writer.open_slot(slot, self.slots)

    def read_marker(self, handle: Slot) -> SlotMarker | None:
        return self._writer.read_marker(handle, self.slots)

    def write(self, handle: Slot, batch: pa.RecordBatch) -> None:
        self._writer.write(handle, batch, self.slots)

    def commit_slot(self, handle: Slot, marker: SlotMarker) -> Mapping[str, float]:
        return self._committer.commit_slot(handle, marker, self.slots)

    def abort_slot(self, handle: Slot) -> None:
        self._committer.abort_slot(handle, self.slots)

    # ------------------------------------------------------------------ driver side

    def create_ledger(self) -> Ledger:
        self._ledger = KafkaLedger(
            self.config, self.options.ledger_topic, sink_id=self.sink_id,
            admin=self._clients.admin(), replication_factor=self.options.replication_factor,
            transaction_timeout_ms=self.options.transaction_timeout_ms,
            timeout=self._clients.timeout, preflight=self._clients.check_broker,
        )
        return self._ledger

    def create_ledger_for(self, sink_id: str) -> Ledger:
        """Driver: a fan-out's decisions in a ledger topic of its own
        (``_connectors.<sink_id>.ledger``) on this sink's cluster."""
        return KafkaLedger(
            self.config, default_ledger_topic(sink_id), sink_id=sink_id,
            admin=self._clients.admin(), replication_factor=self.options.replication_factor,
            transaction_timeout_ms=self.options.transaction_timeout_ms,
            timeout=self._clients.timeout, preflight=self._clients.check_broker)

    def fence_all(self) -> int:
        """Driver: ``init_transactions`` on every slot id the sink ever used (see
        :meth:`~connectors.kafka._driver_slots.DriverSlots.fence_all`); the topics are checked
        again at the next batch."""
        self._checks.forget_topics()
        return self._slot_book.fence_all(self._ledger.slots if self._ledger is not None
                                         else None)

    def validate_input(self, schema: pa.Schema) -> None:
        """Driver, before any task: columns and types; the topic exists (or is created)."""
        self._checks.validate_input(schema)

    def plan_slots(self, batch: BatchInput, ctx: BatchContext) -> SlotPlan:
        """Driver, a new batch: the slot count and placement (the ledger's while a batch
        some slots committed is unfinished: :meth:`DriverSlots.plan`)."""
        assert self._ledger is not None
        wanted = self.slots
        if self._auto_slots:
            wanted = self._ledger.slots or batch.task_slots() or 1
        rule = PLACEMENT_KEY if self.slot_columns is None else PLACEMENT_ROW
        plan = self._slot_book.plan(self._ledger, ctx.generation, wanted, rule)
        self.slots = plan.slots
        # Keyed records by their key: one slot keeps a key's records in input order.
        self.slot_key = "key" if plan.placement == PLACEMENT_KEY else None
        return plan

    def record_slots(self, plan: SlotPlan) -> None:
        """Driver, before the batch's tasks: the marker topic's partitions, and the slot
        count and placement in the ledger where they change."""
        assert self._ledger is not None
        self._slot_book.record_slots(self._ledger, plan)

    def plan_input(self, batch: BatchInput, ctx: BatchContext) -> BatchInput:
        """Driver, a new batch (after :meth:`plan_slots`): every record checked before any
        slot runs (``barrier=False``), then the rows placed into the slots."""
        if self.barrier:
            check_barrier(batch, self.slots, self.sink_id)
            self._checks.validate_input(batch.schema)
            self._unchecked = batch  # its records are checked in the slot tasks
        else:
            batch = self._checks.prescan(batch, ctx.batch_id)
        self._handover = batch_handover(batch)
        self._bound = self._checks.frames.row_bound  # raised by a guard that fails the job
        batch_id = ctx.batch_id

        def translate(exc: Exception) -> BaseException | None:
            if isinstance(exc, ConnectorError):
                return None
            message = bad_input_message(exc)
            if message is None:
                return None
            # A record refused by the check in the shuffle's map stage: no slot ran.
            return BadInputError(message, sink_id=self.sink_id, batch_id=batch_id)

        return ErrorMappingBatch(self.partition_input(batch), translate)

    def check_input(self, batch: BatchInput, ctx: BatchContext) -> None:
        """Driver, in a fan-out before its decision: every record checked by a Spark job
        now (a given topic's checks otherwise run in the slotting shuffle's map stage,
        barrier mode's in the slot tasks), so that a record the topic refuses commits the
        batch in no target."""
        unchecked, self._unchecked = self._unchecked, None
        if unchecked is not None:
            self._checks.prescan(unchecked, ctx.batch_id)  # what barrier=False ran already
        self._checks.frames.run_pending(ctx.batch_id)

    def report_metrics(self, metrics: BatchMetrics) -> None:
        """Slots, barrier, Arrow hand-over, and from the slots' figures (what their
        ``commit_slot`` returned: ``metrics.task_figures``) the produce paths and the
        transaction durations."""
        metrics.extra["slots"] = self.slots
        metrics.extra["barrier"] = self.barrier
        handover, self._handover = self._handover, None
        # Rows per Arrow batch without Spark's per-row size check; 0: Spark's batching.
        metrics.extra["arrow_batch_rows"] = (
            handover.rows if handover is not None and self._checks.frames.row_bound == self._bound
            else 0)
        if metrics.outcome != "failed":
            slot_figures(metrics.task_figures, metrics, self.options.transaction_timeout_ms)
        metrics.extra["sink_ms"] = metrics.extra.get("total_ms", 0.0)

    def close(self) -> None:
        super().close()
        self._ledger = None
        self._clients.close()
