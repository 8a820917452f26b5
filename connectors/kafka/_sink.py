"""``KafkaSink``: exactly-once into Kafka with one transactional producer per slot.

librdkafka has no KIP-939 (no prepared transaction that outlives its producer) and exposes
no producer id/epoch, so a Kafka transaction is committed in the task that wrote it
(protocol family ``COMMIT_IN_TASK``). A replay is made idempotent by a **marker**: every
slot's transaction also writes ``(sink, generation, batch, slot, fingerprint)`` to the
slot's own partition of a compacted marker topic; a retried task or a replayed batch reads
that partition after fencing and writes nothing for a slot already committed.

Executor side, once per slot (see :func:`connectors.core.tasks.slot_task`):
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
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, KafkaException, Producer

from connectors.core.batch import BatchContext, BatchInput, TaskBarrier, TaskInfo, TaskOutcome
from connectors.core.errors import (
    BadInputError,
    ConfigurationError,
    ConnectorError,
    FatalError,
    NonDeterministicReplayError,
    TransientError,
)
from connectors.core.fingerprint import Fingerprint, without_row_hash
from connectors.core.ledger import Ledger, TaskCommit
from connectors.core.metrics import BatchMetrics
from connectors.core.naming import slot_name
from connectors.core.tasks import DETERMINISTIC_ERRORS, SlotMarker, SlotTransaction
from connectors.core.template import TaskCommitSink
from connectors.kafka._config import (
    DEFAULT_TRANSACTION_TIMEOUT_MS,
    TIMEOUT_WARN_RATIO,
    KafkaConfig,
    KafkaOptions,
)
from connectors.kafka._errors import FENCED_CODES, kafka_error, translate
from connectors.kafka._io import Admin, auth_failure, init_transactions, read_committed
from connectors.kafka._ledger import PLACEMENT_KEY, PLACEMENT_ROW, KafkaLedger
from connectors.kafka._pool import SLOT_OWNERS, PooledProducer, SlotProducers, config_key
from connectors.kafka._records import (
    PRODUCE_PATHS,
    RecordLimits,
    check_schema,
    describe_record,
    fast_producer,
    merge_topics,
    produce_batch,
    scan_batch,
)
from connectors.kafka._scan import bad_input_message
from connectors.kafka._spark import ErrorMappingBatch, FrameChecks

if TYPE_CHECKING:
    from connectors.spark.batch import Handover

__all__ = ["KafkaSink", "marker_key"]

logger = logging.getLogger("connectors.kafka")

#: Offsets read back from the end of a marker partition before reading all of it: each
#: batch adds one marker and one commit control record, each aborted attempt two more.
MARKER_TAIL = 64
#: Clusters of at most this many brokers: the sink's clients connect to every broker at
#: once (``enable.sparse.connections=false``). librdkafka's sparse connections drop the
#: bootstrap connection after the first metadata and space the next new connection by half
#: of ``reconnect.backoff.ms`` (11 ms at least): a new producer's ``init_transactions``
#: waits for it, ~17 ms instead of ~5 ms. A slot producer connects to every partition
#: leader of its topic anyway; on larger clusters, connecting to every broker (TLS and SASL
#: handshakes included) per new producer may cost more than it saves.
DENSE_MAX_BROKERS = 16
#: librdkafka defaults (used when the config does not set them).
_CLIENT_MAX_MESSAGE_BYTES = 1_000_000
_TOPIC_MAX_MESSAGE_BYTES = 1_048_588
#: Attempts at a slot's transaction within one task (abort-and-redo, new producer).
_TXN_ATTEMPTS = 3
_OK, _FAILED, _REPLAYED = "ok", "failed", "replayed"


def marker_key(slot: int) -> bytes:
    """The key of a slot's markers: compaction keeps each slot's last marker forever."""
    return f"slot/{slot}".encode()


def probe_key(slot: int) -> bytes:
    """The key of the record that proves a kept producer still owns its slot (not a marker)."""
    return f"slot/{slot}/probe".encode()


@dataclass
class _Slot:
    """One slot's open transaction inside a task."""

    ctx: SlotTransaction
    producer: Producer
    started: float
    batches: list[pa.RecordBatch] = field(default_factory=list)
    rows: int = 0
    errors: list[KafkaError] = field(default_factory=list)
    topics: dict[str, int] = field(default_factory=dict)  # checked topic -> partitions
    gathered: bool = False
    wait_ms: float = 0.0
    failure: str = ""
    open: bool = True
    #: The producer this worker kept from an earlier task (not fenced by this task).
    reused: bool = False
    #: A kept producer failed while producing: the commit starts the slot over.
    stale: bool = False
    #: Another attempt had committed the slot (found when starting over): commit nothing.
    committed_by_other: bool = False
    pooled: PooledProducer | None = None
    #: Rows enqueued per produce path (``native``, ``batch``, ``record``).
    paths: dict[str, int] = field(default_factory=dict)


class KafkaSink(TaskCommitSink[_Slot]):
    """Exactly-once sink into Kafka topics, for ``foreachBatch`` and batch jobs.

    Columns as Spark's own Kafka sink: ``value`` (string or binary, required), optional
    ``key``, ``headers`` (``array<struct<key: string, value: binary>>``), ``partition`` and
    ``topic``. Other columns are ignored (but take part in the replay fingerprint).

    Args:
        topic: the topic to write, or ``None`` to take each record's topic from a ``topic``
            column (a given topic wins over the column, as in Spark's sink).
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
            task slots, no dynamic allocation, and costs about 1 s per batch: Spark's
            ``BarrierTaskContext`` polls its coordinator once a second (see docs/kafka.md).
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
            ``init_transactions`` (~31 ms) and no marker read (~15-25 ms) per slot and
            batch. A flushed probe record into the slot's marker partition proves a kept
            producer still owns the slot before each batch (and so that the newest marker
            is still the one it committed); one fenced later is found out by its commit,
            and the slot starts over.
        batch_produce: how a slot enqueues its records. ``True`` (default): in batches of
            up to 16,384 records, one partition per call, through a ctypes accelerator
            (``rd_kafka_produce_batch`` straight from the Arrow buffers) where this
            confluent-kafka release's layout is verified (an allow-list, plus a check in a
            throwaway process), else through the public ``Producer.produce_batch``, with
            one WARNING per process; ``"public"``: ``Producer.produce_batch`` only;
            ``False``: one ``Producer.produce()`` per record. Records with ``headers`` are
            always produced one by one. ``CONNECTORS_ACCELERATORS=off`` in the environment
            turns the accelerator off. Rows per path are the batch metrics
            ``produce_native_rows``, ``produce_batch_rows`` and ``produce_record_rows``.
            See docs/kafka.md, "Batch produce".
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
        **options: Any,
    ) -> None:
        super().__init__(
            sink_id=sink_id, slots=slots if slots is not None else 1,
            slot_columns=slot_columns, barrier=barrier, **options,
        )
        self.config = KafkaConfig(config)
        timeout_ms = self.config.get("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS)
        try:
            timeout_ms = int(timeout_ms)
        except (TypeError, ValueError):
            raise ConfigurationError("transaction.timeout.ms must be an int (milliseconds)",
                                     sink_id=sink_id) from None
        try:
            self.options = KafkaOptions(
                topic=topic,
                marker_topic=marker_topic or f"_connectors.{self.sink_id}.markers",
                ledger_topic=ledger_topic or f"_connectors.{self.sink_id}.ledger",
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
        self.limits = RecordLimits(
            int(self.config.get("message.max.bytes", _CLIENT_MAX_MESSAGE_BYTES))
        )
        #: Partition counts of topics the driver checked (shipped to the tasks).
        self.known_topics: dict[str, int] = {}
        self._admin: Admin | None = None
        self._ledger: KafkaLedger | None = None
        self._slots_ever = 0
        self._checked_broker = False
        self._validated: set[str] = set()
        self._marker_ready = 0
        #: The record checks of ``barrier=False`` on a DataFrame, and the row bound.
        self._frames = FrameChecks(self.sink_id, self.values_in_errors)
        #: The batch in flight's Arrow hand-over and row bound, for its metrics.
        self._handover: Handover | None = None
        self._bound: int | None = None

    def __repr__(self) -> str:
        return (
            f"KafkaSink({self.options.topic!r}, {self.config!r}, sink_id={self.sink_id!r}, "
            f"slots={self.slots if not self._auto_slots else 'auto'}, barrier={self.barrier})"
        )

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_admin"] = None  # driver clients never travel to executors
        state["_ledger"] = None
        state["_frames"] = self._frames.shipped()  # holds JVM references
        state["_handover"] = None  # likewise
        return state

    # ------------------------------------------------------------------ helpers
    def _error(self, exc: BaseException, doing: str, **ids: Any) -> ConnectorError:
        return translate(exc, doing=doing, secrets=self.config.secrets,
                         bootstrap=self.config.bootstrap, sink_id=self.sink_id, **ids)

    @property
    def _timeout(self) -> float:
        return self.options.operation_timeout_s

    def _admin_client(self) -> Admin:
        if self._admin is None:
            self._admin = Admin(self.config, self._timeout, self.sink_id)
        return self._admin

    def _producer(self, transactional_id: str, **extra: Any) -> Producer:
        conf = self.config.producer(transactional_id, self.options.transaction_timeout_ms)
        conf.update(extra)
        return Producer(conf)

    # ------------------------------------------------------------------ driver side
    def create_ledger(self) -> Ledger:
        self._ledger = KafkaLedger(
            self.config, self.options.ledger_topic, sink_id=self.sink_id,
            admin=self._admin_client(), replication_factor=self.options.replication_factor,
            transaction_timeout_ms=self.options.transaction_timeout_ms, timeout=self._timeout,
            preflight=self._check_broker,
        )
        return self._ledger

    def _check_broker(self) -> None:
        """``transaction.timeout.ms`` must not exceed the broker's maximum. On a cluster of
        at most :data:`DENSE_MAX_BROKERS` brokers, the clients the sink starts from now on
        connect to every broker at once (``enable.sparse.connections=false``, unless the
        config sets it): a new slot producer is ready in ~5 ms instead of ~17 ms."""
        if self._checked_broker:
            return
        broker, brokers = self._admin_client().broker_config()
        if brokers <= DENSE_MAX_BROKERS:
            self.config = self.config.with_default("enable.sparse.connections", False)
        limit = int(broker.get("transaction.max.timeout.ms", 900_000))
        mine = self.options.transaction_timeout_ms
        if mine > limit:
            raise ConfigurationError(
                f"transaction.timeout.ms={mine} is above the broker's transaction.max.timeout.ms"
                f"={limit}: every slot's producer would fail to start. Lower "
                f"transaction.timeout.ms to at most {limit}, or raise the broker maximum",
                sink_id=self.sink_id)
        self._checked_broker = True

    def fence_all(self) -> int:
        """Driver: ``init_transactions`` on every slot id the sink ever used.

        Each aborts the open transaction a dead task or driver left on that id, so no
        ``read_committed`` consumer stays stalled. The ids are bounded: one per slot ever
        configured (the marker topic's partition count).
        """
        self._check_broker()
        self._validated.clear()  # a (re)start or a failed batch checks the topics again
        self._marker_ready = 0
        info = self._admin_client().topic(self.options.marker_topic)
        ledger_slots = self._ledger.slots if self._ledger is not None else None
        count = max(info.partitions if info else 0, ledger_slots or 0, self._slots_ever)
        self._slots_ever = count
        if count == 0:
            return 0
        started = time.monotonic()

        # A metadata request for a missing topic may create it: ask for every topic then.
        known = self.options.marker_topic if info is not None else None

        def fence(slot: int) -> None:
            tid = slot_name(self.sink_id, slot)
            try:
                init_transactions(self._producer(tid), known, self._timeout)
                SLOT_OWNERS.claim(self._pool_key(tid))
            except KafkaException as exc:
                raise self._error(exc, f"fencing slot {slot} (init_transactions)",
                                  transaction_id=tid) from None

        with ThreadPoolExecutor(min(8, count)) as pool:
            list(pool.map(fence, range(count)))
        logger.info("sink %s: fenced %d slot(s) in %.0f ms", self.sink_id, count,
                    (time.monotonic() - started) * 1000)
        return count

    def _last_markers(self) -> dict[int, SlotMarker | None]:
        info = self._admin_client().topic(self.options.marker_topic)
        found: dict[int, SlotMarker | None] = {}
        for slot in range(info.partitions if info else 0):
            found[slot] = _last_marker(self, slot)
        return found

    def _resolve_slots(self, batch: BatchInput, generation: int) -> None:
        """Driver, every batch: the slot count and placement rule (stored, fixed while a
        batch is unfinished), the marker topic with one partition per slot, and the barrier
        prerequisites."""
        assert self._ledger is not None
        admin = self._admin_client()
        stored = self._ledger.slots
        wanted = self.slots
        if self._auto_slots:
            wanted = stored or batch.task_slots() or 1
        placed = self._ledger.placement
        placement = PLACEMENT_KEY if self.slot_columns is None else PLACEMENT_ROW
        unfinished = None
        if (stored is not None and stored != wanted) or (placed not in (None, placement)):
            unfinished = self._unfinished(generation)
        if stored is not None and stored != wanted:
            if unfinished is not None:
                raise ConfigurationError(
                    f"the sink's slot count is {stored}; it cannot change to {wanted} while "
                    f"batch {unfinished} is unfinished (some slots committed it, the ledger "
                    "does not record it complete). Restart with the old slot count until that "
                    "batch is complete, then change it", sink_id=self.sink_id)
            logger.warning("sink %s: slot count changes from %d to %d", self.sink_id,
                           stored, wanted)
        if placed is not None and placed != placement:
            if unfinished is not None:
                logger.warning(
                    "sink %s: batch %d was started with the %r placement of rows into slots; "
                    "it is finished with it, later batches use the %r placement", self.sink_id,
                    unfinished, placed, placement)
                placement = placed
            else:
                logger.info("sink %s: rows are placed into slots by the %r rule from now on "
                            "(was %r)", self.sink_id, placement, placed)
        # Keyed records by their key: one slot keeps a key's records in input order.
        self.slot_key = "key" if placement == PLACEMENT_KEY else None
        if stored == wanted and placed == placement and self._marker_ready == wanted:
            self.slots = wanted  # checked in this driver run
            if self.barrier:
                _check_barrier(self, batch)
            return
        info = admin.topic(self.options.marker_topic)
        if info is None:
            admin.create_topic(self.options.marker_topic, wanted,
                               self.options.replication_factor,
                               {"cleanup.policy": "compact"})
        elif info.partitions < wanted:
            admin.add_partitions(self.options.marker_topic, wanted)
        if stored != wanted or placed != placement:
            self._ledger.record_slots(wanted, placement)
        self.slots = wanted
        self._marker_ready = wanted
        self._slots_ever = max(self._slots_ever, wanted, info.partitions if info else 0)
        if self.barrier:
            _check_barrier(self, batch)

    def _unfinished(self, generation: int) -> int | None:
        """A batch some slot committed (its marker) but the ledger does not record."""
        assert self._ledger is not None
        for marker in self._last_markers().values():
            if marker is None or marker.generation != generation:
                continue
            if self._ledger.get(marker.batch_id) is None:
                return marker.batch_id
        return None

    def validate_input(self, schema: pa.Schema) -> None:
        """Driver, before any task: columns and types; the topic exists (or is created)."""
        check_schema(schema, fixed_topic=self.options.topic is not None)
        topic = self.options.topic
        if topic is None or topic in self._validated:
            return  # checked in this driver run (a failed batch starts a new check)
        admin = self._admin_client()
        info = admin.topic(topic)
        if info is None:
            if not self.options.create_topic:
                raise BadInputError(
                    f"topic {topic!r} does not exist: create it, or pass create_topic=True "
                    "(with topic_partitions=N)", sink_id=self.sink_id)
            admin.create_topic(topic, self.options.topic_partitions,
                               self.options.replication_factor, {})
            info = admin.topic(topic)
            if info is None:
                raise TransientError(f"topic {topic!r} was created but is not visible yet",
                                     sink_id=self.sink_id)
        self.known_topics[topic] = info.partitions
        topic_max = int(admin.topic_config(topic).get("max.message.bytes",
                                                       _TOPIC_MAX_MESSAGE_BYTES))
        client_max = int(self.config.get("message.max.bytes", _CLIENT_MAX_MESSAGE_BYTES))
        self.limits = RecordLimits(min(client_max, topic_max))
        self._validated.add(topic)

    def _prescan(self, batch: BatchInput, batch_id: int) -> BatchInput:
        """``barrier=False``: check every record before any slot runs, so that a bad batch
        commits nothing. Returns the batch to write: on a DataFrame, the checks run in the
        slotting shuffle's map stage (:meth:`~connectors.kafka._spark.FrameChecks.prescan`);
        otherwise a job of plain tasks checks them first."""
        schema = batch.schema
        check_schema(schema, fixed_topic=self.options.topic is not None)
        self.validate_input(schema)
        topics: dict[str, int] = {}
        topic = self.options.topic
        on_frame = self._frames.prescan(batch, batch_id, self.limits, topic,
                                        self.known_topics.get(topic) if topic else None)
        if on_frame is not None:
            batch, topics = on_frame
        else:
            for outcome in batch.run_tasks(partial(_scan_task, self, batch_id)):
                if outcome.error is not None:
                    raise outcome.error
                assert outcome.commit is not None
                merge_topics(topics, json.loads(outcome.commit.payload))
        admin = self._admin_client()
        for topic, top in sorted(topics.items()):
            partitions = self.known_topics.get(topic)
            if partitions is None:
                info = admin.topic(topic)
                if info is None:
                    raise BadInputError(
                        f"topic {topic!r} (from the 'topic' column) does not exist: create it",
                        sink_id=self.sink_id, batch_id=batch_id)
                partitions = self.known_topics[topic] = info.partitions
            if top >= partitions:
                raise BadInputError(
                    f"the 'partition' column holds {top}, but topic {topic!r} has "
                    f"{partitions} partitions", sink_id=self.sink_id, batch_id=batch_id)
        return batch

    def prepare_input(self, batch: BatchInput, ctx: BatchContext) -> BatchInput:
        """Driver, a new batch: the slot count and placement, every record checked before
        any slot runs (``barrier=False``), then the rows placed into the slots."""
        self._resolve_slots(batch, ctx.generation)
        if self.barrier:
            self.validate_input(batch.schema)
        else:
            batch = self._prescan(batch, ctx.batch_id)
        self._handover = batch.handover
        self._bound = self._frames.row_bound  # raised by a guard that fails the job
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

    def report_metrics(self, metrics: BatchMetrics) -> None:
        """Slots, barrier, Arrow hand-over, produce paths and transaction durations."""
        metrics.extra["slots"] = self.slots
        metrics.extra["barrier"] = self.barrier
        handover, self._handover = self._handover, None
        # Rows per Arrow batch without Spark's per-row size check; 0: Spark's batching.
        metrics.extra["arrow_batch_rows"] = (
            handover.rows if handover is not None and self._frames.row_bound == self._bound
            else 0)
        if metrics.outcome != "failed" and self._ledger is not None:
            self._check_durations(self._ledger, metrics.batch_id, metrics)
        metrics.extra["sink_ms"] = metrics.extra.get("total_ms", 0.0)

    def _check_durations(self, ledger: Ledger, batch_id: int, metrics: BatchMetrics) -> None:
        """Warn when a slot's transaction reached 80% of ``transaction.timeout.ms``."""
        entry = ledger.get(batch_id)
        if entry is None:
            return
        longest, waited = 0.0, 0.0
        # Rows per produce path: produce_native_rows / produce_batch_rows / produce_record_rows.
        produced = dict.fromkeys(PRODUCE_PATHS, 0)
        for commit in entry.commits:
            if commit.payload:
                info = json.loads(commit.payload)
                longest = max(longest, float(info.get("txn_ms", 0)))
                waited = max(waited, float(info.get("wait_ms", 0)))
                for path, rows in dict(info.get("produce_rows", {})).items():
                    produced[path] = produced.get(path, 0) + int(rows)
        for path, rows in produced.items():
            metrics.extra[f"produce_{path}_rows"] = rows
        metrics.extra["txn_ms"] = round(longest, 1)
        metrics.extra["barrier_wait_ms"] = round(waited, 1)
        limit = self.options.transaction_timeout_ms
        if longest >= TIMEOUT_WARN_RATIO * limit:
            logger.warning(
                "sink %s batch %d: a slot's transaction took %.0f ms (barrier wait %.0f ms), "
                "%.0f%% of transaction.timeout.ms=%d: raise transaction.timeout.ms (at most "
                "the broker's transaction.max.timeout.ms), use more slots or smaller batches",
                self.sink_id, batch_id, longest, waited, 100 * longest / limit, limit)

    def close(self) -> None:
        super().close()
        self._ledger = None
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    # ------------------------------------------------------------------ executor side
    def _gather(self, handle: _Slot | None, status: str,
                barrier: TaskBarrier | None = None) -> list[str]:
        """Barrier mode: exchange every slot's status (exactly once per task)."""
        if handle is not None:
            if handle.gathered:
                return [status]
            handle.gathered = True
            barrier = handle.ctx.barrier
        if not self.barrier or barrier is None:
            return [status]
        running = barrier.tasks()
        if running < self.slots:
            # Spark resubmitted only some partitions of the barrier stage (a slot's success
            # from the failed attempt arrived after its failure was handled). The barrier
            # would wait for all partitions forever; the missing slots completed their
            # task, so they committed (or returned their error to the driver).
            logger.warning(
                "sink %s: this barrier stage attempt runs %d of %d slots (Spark resubmitted "
                "only the missing ones); the slot commits without aligning", self.sink_id,
                running, self.slots)
            return [status]
        started = time.monotonic()
        statuses = barrier.all_gather(status)
        if handle is not None:
            handle.wait_ms = (time.monotonic() - started) * 1000
        return statuses

    def _fail(self, handle: _Slot | None, exc: ConnectorError,
              barrier: TaskBarrier | None = None) -> ConnectorError:
        """A deterministic failure of this slot: tell the other slots before raising."""
        if handle is not None:
            handle.failure = str(exc)
        self._gather(handle, f"{_FAILED}|{exc}", barrier)
        return exc

    def _pool_key(self, transactional_id: str) -> str:
        conf = self.config.producer(transactional_id, self.options.transaction_timeout_ms)
        return config_key(conf, transactional_id)

    def _new_producer(self, transactional_id: str) -> PooledProducer:
        """A producer for the slot's transactional id, ``init_transactions`` done: every
        earlier owner is fenced and its open transaction completed."""
        errors: list[KafkaError] = []
        reported: list[KafkaError] = []

        def on_delivery(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                errors.append(err)

        producer: Producer | None = None
        try:
            producer = self._producer(transactional_id, on_delivery=on_delivery,
                                      error_cb=reported.append,
                                      **{"delivery.report.only.error": True})
            _retrying(lambda: init_transactions(producer, self.options.marker_topic,
                                                self._timeout))
        except KafkaException:
            # A refused authentication shows in error_cb; the call only says "timed out".
            cause = auth_failure(producer, reported) if producer is not None else None
            if cause is not None:
                raise cause from None
            raise
        SLOT_OWNERS.claim(self._pool_key(transactional_id))
        partitioner, refresh_ms = self.config.partitioner()
        fast = fast_producer(producer, self.options.produce_mode, self._timeout,
                             partitioner=partitioner, refresh_ms=refresh_ms,
                             queue_limit=self.config.queue_limit())
        return PooledProducer(producer, errors, reported, fast)

    def open_slot(self, slot: SlotTransaction) -> _Slot:
        """Task: a producer for the slot's transactional id; fence the previous owner.

        With ``reuse_producers``, the producer this worker kept from the slot's previous
        task begins the transaction instead (see :mod:`connectors.kafka._pool`).
        """
        if self.options.reuse_producers:
            key = self._pool_key(slot.name)
            kept = SlotProducers.take(key)
            if kept is not None and SLOT_OWNERS.taken_over(key):
                # Another worker of this host started the slot's newest producer: this one
                # is fenced; dropped without a probe (no round trip, no FATAL log line).
                logger.info("sink %s: slot %d ran in another worker since; a new producer "
                            "takes it", self.sink_id, slot.slot)
                kept = None
            if kept is not None:
                kept.reset()  # callbacks' lists of the previous task
                try:
                    kept.producer.begin_transaction()
                    self._probe(kept, slot)
                except KafkaException as exc:  # fenced, or broken: a new producer below
                    logger.info("sink %s: the kept producer of slot %d is unusable (%s)",
                                self.sink_id, slot.slot, type(exc).__name__)
                else:
                    handle = _Slot(slot, kept.producer, time.monotonic(), errors=kept.errors,
                                   reused=True, pooled=kept)
                    handle.topics.update(self.known_topics)
                    return handle
        try:
            fresh = self._new_producer(slot.name)
            fresh.producer.begin_transaction()
        except KafkaException as exc:
            err = self._error(exc, f"starting slot {slot.slot}'s transaction",
                              batch_id=slot.batch_id, transaction_id=slot.name)
            if isinstance(err, DETERMINISTIC_ERRORS):
                raise self._fail(None, err, slot.barrier) from None
            raise err from None
        handle = _Slot(slot, fresh.producer, time.monotonic(), errors=fresh.errors, pooled=fresh)
        handle.topics.update(self.known_topics)
        return handle

    def _probe(self, kept: PooledProducer, slot: SlotTransaction) -> None:
        """Prove that a kept producer still owns the slot before anything is read or
        written with it: one small record (key ``slot/<n>/probe``, which marker reads
        skip) into the slot's marker partition, flushed. Adding that partition to the
        transaction fails if another producer of the slot id started since (another worker
        ran the slot, or the driver fenced it). Costs a round trip (~2-5 ms) instead of
        ``init_transactions``. Compaction keeps one probe per slot."""
        producer = kept.producer
        with _client_errors():
            producer.produce(self.options.marker_topic, b"", probe_key(slot.slot),
                             partition=slot.slot)
            left = producer.flush(self._timeout)
        if left or kept.errors:
            raise KafkaException(kept.errors[0] if kept.errors else KafkaError(
                KafkaError._TIMED_OUT, "the probe of a kept producer was not delivered"))

    def _keep(self, handle: _Slot) -> None:
        """After a clean end of the slot's transaction: keep its producer for the next task."""
        if self.options.reuse_producers and handle.pooled is not None and not handle.open:
            SlotProducers.give_back(self._pool_key(handle.ctx.name), handle.pooled)
        handle.pooled = None

    def read_marker(self, handle: _Slot) -> SlotMarker | None:
        """Task, after fencing: this slot's marker for this batch, if it is committed."""
        marker = self._committed_marker(handle)
        if marker is None:
            return None
        handle.failure = _REPLAYED
        return marker

    def _newest_marker(self, handle: _Slot) -> SlotMarker | None:
        """The slot's newest committed marker.

        A kept producer whose probe passed knows it without a read: only the slot's
        producers write its marker partition, any other producer of the slot id would have
        fenced this one (the probe would have failed), so the newest committed marker is
        still the one this producer committed, or read, last. Any other producer reads
        the partition (after ``init_transactions``, which completed every older owner's
        transaction) and remembers what it found."""
        pooled = handle.pooled
        if handle.reused and pooled is not None and pooled.knows_newest:
            return pooled.newest_marker
        newest = _last_marker(self, handle.ctx.slot, batch_id=handle.ctx.batch_id)
        if pooled is not None:
            pooled.newest_marker, pooled.knows_newest = newest, True
        return newest

    def _committed_marker(self, handle: _Slot) -> SlotMarker | None:
        ctx = handle.ctx
        marker = self._newest_marker(handle)
        if marker is None or (marker.generation, marker.batch_id) < (
            ctx.generation, ctx.batch_id
        ):
            return None
        if (marker.generation, marker.batch_id) > (ctx.generation, ctx.batch_id):
            raise self._fail(handle, FatalError(
                f"slot {ctx.slot} already committed batch {marker.batch_id} (generation "
                f"{marker.generation}), after this batch {ctx.batch_id}: Spark is running "
                "an older batch than the sink wrote (another checkpoint?). Use the original "
                "checkpoint, or a new sink_id", sink_id=self.sink_id, batch_id=ctx.batch_id,
                transaction_id=ctx.name))
        return marker

    def _check(self, handle: _Slot, batch: pa.RecordBatch) -> None:
        ctx = handle.ctx

        def error(message: str) -> BadInputError:
            return BadInputError(message, sink_id=self.sink_id, batch_id=ctx.batch_id,
                                 transaction_id=ctx.name)

        scan = scan_batch(batch, self.limits, self.options.topic, error,
                          values_in_errors=self.values_in_errors)
        for topic, top in scan.topics.items():
            partitions = handle.topics.get(topic)
            if partitions is None:
                try:
                    meta = handle.producer.list_topics(topic, timeout=self._timeout)
                except KafkaException as exc:
                    raise self._error(exc, f"reading the metadata of {topic!r}",
                                      batch_id=ctx.batch_id) from None
                found = meta.topics.get(topic)
                if found is None or found.error is not None or not found.partitions:
                    raise error(f"topic {topic!r} does not exist: create it first")
                partitions = handle.topics[topic] = len(found.partitions)
            if top >= partitions:
                what = (_partition_record(batch, partitions) if self.values_in_errors
                        else "")
                raise error(f"the 'partition' column holds {top}{what}, but topic {topic!r} "
                            f"has {partitions} partitions")

    def write(self, handle: _Slot, batch: pa.RecordBatch) -> None:
        """Task: check the records of ``batch``, then produce them into the transaction."""
        try:
            self._check(handle, batch)
        except ConnectorError as exc:
            if isinstance(exc, DETERMINISTIC_ERRORS):
                raise self._fail(handle, exc) from None
            raise
        handle.batches.append(batch)
        if handle.stale:
            return  # the commit starts the slot over with every batch kept
        try:
            with _client_errors():
                fast = handle.pooled.fast if handle.pooled is not None else None
                rows, path = produce_batch(handle.producer.produce, handle.producer.poll,
                                           batch, self.options.topic, fast)
                handle.rows += rows
                handle.paths[path] = handle.paths.get(path, 0) + rows
                handle.producer.poll(0)
        except KafkaException as exc:
            if handle.reused:
                # Kept from an earlier task and fenced (or broken) since: nothing of this
                # transaction can commit; the commit starts over with a new producer.
                logger.info("sink %s batch %d slot %d: the kept producer failed (%s); the "
                            "slot starts over", self.sink_id, handle.ctx.batch_id,
                            handle.ctx.slot, type(exc).__name__)
                handle.stale = True
                return
            err = self._error(exc, f"producing slot {handle.ctx.slot}'s records",
                              batch_id=handle.ctx.batch_id, transaction_id=handle.ctx.name)
            if isinstance(err, DETERMINISTIC_ERRORS):
                raise self._fail(handle, err) from None
            raise err from None

    def _marker_value(self, handle: _Slot, marker: SlotMarker) -> bytes:
        return json.dumps(marker.to_json()).encode()

    def _flush(self, handle: _Slot, marker: SlotMarker) -> None:
        """Produce the marker, flush, and turn delivery errors into the library's errors."""
        producer = handle.producer
        producer.produce(self.options.marker_topic, self._marker_value(handle, marker),
                         marker_key(marker.slot), partition=marker.slot)
        with _client_errors():
            left = producer.flush(self.options.transaction_timeout_ms / 1000)
        if left:
            raise TransientError(
                f"{left} record(s) of slot {marker.slot} not delivered within "
                "transaction.timeout.ms", sink_id=self.sink_id, batch_id=marker.batch_id,
                transaction_id=handle.ctx.name)
        if handle.errors:
            first = handle.errors[0]
            raise KafkaException(first)

    def _redo(self, handle: _Slot, new_producer: bool) -> None:
        """Abort (or drop the producer) and write the slot's transaction again."""
        if new_producer:
            self._replace_producer(handle)
        else:
            handle.producer.abort_transaction(self._timeout)
            handle.errors.clear()
        self._write_again(handle)

    def _replace_producer(self, handle: _Slot) -> None:
        """A new producer for the slot (``init_transactions`` fences the old one)."""
        fresh = self._new_producer(handle.ctx.name)
        handle.producer, handle.errors, handle.pooled = fresh.producer, fresh.errors, fresh

    def _write_again(self, handle: _Slot) -> None:
        """Begin a transaction and produce every record batch of the slot again.

        Record by record, with a delivery report for each: if the first attempt failed on
        a delivery that the accelerator does not report (:mod:`connectors.kafka._native`),
        this attempt names the failure."""
        handle.producer.begin_transaction()
        handle.open = True
        handle.rows = 0
        handle.paths.clear()
        with _client_errors():
            for batch in handle.batches:
                rows, path = produce_batch(handle.producer.produce, handle.producer.poll,
                                           batch, self.options.topic)
                handle.rows += rows
                handle.paths[path] = handle.paths.get(path, 0) + rows

    def commit_slot(self, handle: _Slot, marker: SlotMarker) -> bytes | None:
        """Task: write the marker with the rows, align with the other slots, commit.

        Steps:
          1. produce the marker into the slot's partition of the marker topic; flush;
          2. barrier mode: ``allGather`` every slot's status; if any slot failed, abort;
          3. ``commit_transaction``; ``retriable()`` errors retry the commit,
             ``txn_requires_abort()`` aborts and redoes the transaction, ``fatal()`` takes
             a new producer (which fences the old one) and redoes it; fenced: another
             attempt owns the slot, this one fails (Spark keeps the other). A producer
             kept from an earlier task that fails (fenced since it was kept) instead starts
             the slot over (:meth:`_start_over`), in step 1 or 3.
        """
        ctx = handle.ctx
        ids: dict[str, Any] = {"batch_id": ctx.batch_id, "transaction_id": ctx.name}
        # Step 1
        try:
            if handle.stale:
                self._start_over(handle, marker)
            else:
                try:
                    self._flush(handle, marker)
                except KafkaException:
                    if not handle.reused:
                        raise
                    self._start_over(handle, marker)  # kept, and fenced or broken since
        except (KafkaException, NonDeterministicReplayError) as exc:
            failure = (exc if isinstance(exc, ConnectorError)
                       else self._error(exc, f"writing slot {ctx.slot}", **ids))
            if isinstance(failure, DETERMINISTIC_ERRORS):
                raise self._fail(handle, failure) from None
            raise failure from None
        # Step 2
        statuses = self._gather(handle, _OK)
        failed = [s.split("|", 1)[1] for s in statuses if s.startswith(_FAILED + "|")]
        if failed:
            handle.failure = "another slot failed"
            raise BadInputError(
                f"slot {ctx.slot} wrote its records but did not commit, because "
                f"{len(failed)} other slot(s) failed: {failed[0]}. Nothing of this batch was "
                "committed", sink_id=self.sink_id, **ids)
        elapsed_ms = (time.monotonic() - handle.started) * 1000
        limit = self.options.transaction_timeout_ms
        if elapsed_ms >= TIMEOUT_WARN_RATIO * limit:
            logger.warning(
                "sink %s batch %d slot %d: the transaction is %.0f ms old (barrier wait %.0f ms)"
                ", %.0f%% of transaction.timeout.ms=%d", self.sink_id, ctx.batch_id, ctx.slot,
                elapsed_ms, handle.wait_ms, 100 * elapsed_ms / limit, limit)
        # Step 3
        for attempt in range(_TXN_ATTEMPTS):
            if handle.committed_by_other:
                break
            try:
                _retrying(lambda: handle.producer.commit_transaction(self._timeout))
                handle.open = False
                break
            except KafkaException as exc:
                err = kafka_error(exc)
                if handle.reused and (err is None or err.fatal() or err.code() in FENCED_CODES):
                    # Kept from an earlier task and fenced since: this transaction cannot
                    # commit. Start over with a new producer (marker read again).
                    try:
                        self._start_over(handle, marker)
                    except KafkaException as again:
                        raise self._error(again, f"starting slot {ctx.slot} over",
                                          **ids) from None
                    continue
                if err is not None and (err.code() in FENCED_CODES):
                    handle.open = False
                    raise TransientError(
                        f"slot {ctx.slot} was taken over by another attempt (a retried or "
                        "speculative task, or a newer driver) before it committed; that "
                        "attempt writes the slot", sink_id=self.sink_id, **ids) from None
                if err is None or attempt == _TXN_ATTEMPTS - 1 or not (
                    err.txn_requires_abort() or err.fatal()
                ):
                    raise self._error(exc, f"committing slot {ctx.slot}", **ids) from None
                logger.warning("sink %s batch %d slot %d: %s; redoing the transaction",
                               self.sink_id, ctx.batch_id, ctx.slot, err.name())
                try:
                    self._redo(handle, new_producer=err.fatal())
                    self._flush(handle, marker)
                except KafkaException as again:
                    raise self._error(again, f"redoing slot {ctx.slot}", **ids) from None
        else:
            raise TransientError(f"slot {ctx.slot} did not commit in {_TXN_ATTEMPTS} attempts",
                                 sink_id=self.sink_id, **ids)
        if not handle.committed_by_other and handle.pooled is not None:
            # The slot's newest committed marker is now ours (see _newest_marker).
            handle.pooled.newest_marker, handle.pooled.knows_newest = marker, True
        self._keep(handle)
        txn_ms = (time.monotonic() - handle.started) * 1000
        return json.dumps({"txn_ms": round(txn_ms, 1), "wait_ms": round(handle.wait_ms, 1),
                           "rows": handle.rows, "reused": handle.reused,
                           "by_other": handle.committed_by_other,
                           "produce_path": _path_name(handle.paths),
                           "produce_rows": handle.paths}).encode()

    def _start_over(self, handle: _Slot, marker: SlotMarker) -> None:
        """The kept producer was fenced (or broke) after this task began with it: take a new
        producer (its ``init_transactions`` fences every other owner and completes their
        commits), read the marker again, and write the transaction again unless another
        attempt committed the slot meanwhile (then its content must be ours)."""
        ctx = handle.ctx
        logger.info("sink %s batch %d slot %d: starting the slot over with a new producer",
                    self.sink_id, ctx.batch_id, ctx.slot)
        handle.reused = handle.stale = False
        handle.open = False  # the old producer's transaction dies with its epoch
        self._replace_producer(handle)
        found = self._committed_marker(handle)
        if found is not None:
            if found.fingerprint != marker.fingerprint:
                err = NonDeterministicReplayError(
                    f"slot {ctx.slot} was committed by another attempt with "
                    f"{found.fingerprint}, this attempt has {marker.fingerprint}. The query "
                    "is not deterministic (rand(), uuid(), a changed source?). Make it "
                    'deterministic, or pass on_replay_mismatch="warn" to keep the committed '
                    "rows", sink_id=self.sink_id, batch_id=ctx.batch_id, transaction_id=ctx.name)
                if self.on_replay_mismatch == "fail":
                    raise err
                logger.warning("%s", err)
            handle.committed_by_other = True
            return
        self._write_again(handle)
        self._flush(handle, marker)

    def abort_slot(self, handle: _Slot) -> None:
        """Task: abort the slot's open transaction (after telling the other slots)."""
        status = _REPLAYED if handle.failure == _REPLAYED else (
            f"{_FAILED}|{handle.failure or 'slot ' + str(handle.ctx.slot) + ' failed'}")
        try:
            self._gather(handle, status)
        finally:
            if handle.open:
                handle.open = False
                try:
                    handle.producer.abort_transaction(self._timeout)
                    if status == _REPLAYED:
                        self._keep(handle)  # a clean end: the slot was committed before
                except KafkaException as exc:
                    # The next init_transactions of this slot id (a retry, fence_all)
                    # aborts it.
                    logger.warning("sink %s: abort of slot %d failed (%s)", self.sink_id,
                                   handle.ctx.slot, type(exc).__name__)


# ---------------------------------------------------------------------- helpers

@contextlib.contextmanager
def _client_errors() -> Iterator[None]:
    """confluent-kafka raises ``SystemError`` when a client call (``flush``, ``poll``) meets
    a fatal error (fenced) and then runs ``error_cb``; the ``KafkaException`` is its cause."""
    try:
        yield
    except SystemError as exc:
        if isinstance(exc.__cause__, KafkaException):
            raise exc.__cause__ from None
        raise


def _partition_record(batch: pa.RecordBatch, partitions: int) -> str:
    """`` (record i (key ..., value ...))`` of the first record of ``batch`` whose
    partition is ``>= partitions`` (``values_in_errors=True`` only)."""
    column = batch.column(batch.schema.names.index("partition"))
    found = pc.index(pc.greater_equal(pc.fill_null(column, -1), partitions), True).as_py()
    if found is None or found < 0:
        return ""
    return f" (record {found}{describe_record(batch, int(found))})"


def _path_name(paths: dict[str, int]) -> str:
    """The ``produce_path`` metric: the path that enqueued rows (several joined by ``+``;
    ``""`` when no row was produced)."""
    return "+".join(sorted(p for p, rows in paths.items() if rows))


def _retrying(call: Any, attempts: int = 5) -> Any:
    """Call a transactional API; retry it while librdkafka says the error is retriable."""
    delay = 0.1
    for attempt in range(attempts):
        try:
            return call()
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is None or not err.retriable() or attempt == attempts - 1:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
    return None


def _last_marker(sink: KafkaSink, slot: int, batch_id: int | None = None) -> SlotMarker | None:
    """The newest committed marker of ``slot`` (its partition of the marker topic)."""
    tail: int | None = MARKER_TAIL
    while True:
        records = read_committed(sink.config, sink.options.marker_topic, slot, tail=tail,
                                 timeout=sink.options.operation_timeout_s,
                                 reuse=sink.options.reuse_producers,
                                 sink_id=sink.sink_id, batch_id=batch_id)
        for record in reversed(records):
            if record.key != marker_key(slot) or record.value is None:
                continue
            marker = SlotMarker.from_json(json.loads(record.value))
            if marker.sink_id == sink.sink_id and marker.slot == slot:
                return marker
        if tail is None:
            return None
        tail = None  # nothing in the tail: read the whole (compacted) partition


def _check_barrier(sink: KafkaSink, batch: BatchInput) -> None:
    """Barrier mode needs ``slots`` concurrent task slots and an engine that runs it."""
    refusal = batch.barrier_refusal()
    if refusal is not None:
        raise ConfigurationError(
            f"barrier=True (the default) cannot run here: {refusal}. Or pass barrier=False",
            sink_id=sink.sink_id)
    cores = batch.task_slots()
    if cores is not None and sink.slots > cores:
        raise ConfigurationError(
            f"barrier=True needs one free task slot per sink slot: slots={sink.slots}, but "
            f"the cluster offers {cores} (spark default parallelism). Use slots<={cores}, "
            "more executor cores, or barrier=False", sink_id=sink.sink_id)


def _scan_task(
    sink: KafkaSink, batch_id: int, info: TaskInfo, batches: Iterator[pa.RecordBatch]
) -> TaskOutcome:
    """``barrier=False``: one partition's records checked, nothing written."""
    topics: dict[str, int] = {}

    def error(message: str) -> BadInputError:
        return BadInputError(message, sink_id=sink.sink_id, batch_id=batch_id)

    rows = 0
    try:
        for batch in batches:
            scan = scan_batch(without_row_hash(batch), sink.limits, sink.options.topic, error,
                              values_in_errors=sink.values_in_errors)
            rows += scan.rows
            merge_topics(topics, scan.topics)
    except BadInputError as exc:
        return TaskOutcome(error=exc)
    payload = json.dumps(topics).encode()
    return TaskOutcome(commit=TaskCommit("scan", info.partition, info.task_attempt_id,
                                         Fingerprint(rows, 0), payload))

