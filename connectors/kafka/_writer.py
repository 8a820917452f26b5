"""Executor side of :class:`~connectors.kafka.KafkaSink`: a slot's transaction up to its
commit, :class:`SlotWriter`. ``open_slot`` (a producer for the slot's ``transactional.id``,
fencing any earlier owner, or the producer this worker kept), ``read_marker`` (the slot's
marker partition, ``read_committed``), ``write`` (every record checked by
:class:`~connectors.kafka._checks.RecordChecks`, then produced by
:mod:`connectors.kafka._produce`). The commit is :mod:`connectors.kafka._committer`."""

from __future__ import annotations

import logging
import time
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Producer

from connectors.core.errors import ConnectorError, FatalError
from connectors.core.templates.tasks import DETERMINISTIC_ERRORS, SlotMarker, SlotTransaction
from connectors.kafka._checks import RecordChecks
from connectors.kafka._clients import KafkaClients
from connectors.kafka._io import auth_failure, init_transactions
from connectors.kafka._owned import OwnedBatch, OwnedProducer
from connectors.kafka._placement import MURMUR2_PARTITIONERS
from connectors.kafka._pool import SLOT_OWNERS, PooledProducer, SlotProducers
from connectors.kafka._produce import FastProducer, fast_producer, produce_batch
from connectors.kafka._slot_producer import SlotProducer, owned_library
from connectors.kafka._task_slot import (
    REPLAYED,
    Alignment,
    Slot,
    client_errors,
    probe_key,
    retrying,
)

__all__ = ["SlotWriter"]

logger = logging.getLogger(__name__)


class SlotWriter:
    """Task: open a slot, read its marker, write its records."""

    def __init__(self, clients: KafkaClients, checks: RecordChecks,
                 alignment: Alignment) -> None:
        self.clients = clients
        self.checks = checks
        self.alignment = alignment

    @property
    def sink_id(self) -> str:
        return self.clients.sink_id

    def new_producer(self, transactional_id: str) -> PooledProducer:
        """A producer for the slot's transactional id, ``init_transactions`` done: every
        earlier owner is fenced and its open transaction completed. The owned librdkafka
        handle where :func:`~connectors.kafka._slot_producer.owned_library` gives one, else
        confluent-kafka's ``Producer``."""
        errors: list[KafkaError] = []
        reported: list[KafkaError] = []
        options = self.clients.options
        settings = self.clients.producer_config(transactional_id)
        library = owned_library(options.producer, options.produce_mode, settings)
        producer: SlotProducer | None = None
        try:
            producer = (OwnedProducer(settings, library, errors=errors, reported=reported)
                        if library is not None
                        else self._confluent(transactional_id, errors, reported))
            retrying(lambda: init_transactions(producer, self.clients.options.marker_topic,
                                               self.clients.timeout))
        except KafkaException:
            # A refused authentication shows in error_cb; the call only says "timed out".
            cause = auth_failure(producer, reported) if producer is not None else None
            if cause is not None:
                raise cause from None
            raise
        SLOT_OWNERS.claim(self.clients.pool_key(transactional_id))
        fast: FastProducer | None
        config = self.clients.config
        partitioner, refresh_ms = config.partitioner()
        if isinstance(producer, OwnedProducer):
            fast = OwnedBatch(producer, self.clients.timeout,
                              by_key=partitioner in MURMUR2_PARTITIONERS, refresh_ms=refresh_ms)
        else:
            fast = fast_producer(producer, options.produce_mode, self.clients.timeout,
                                 partitioner=partitioner, refresh_ms=refresh_ms,
                                 queue_limit=config.queue_limit())
        return PooledProducer(producer, errors, reported, fast)

    def _confluent(self, transactional_id: str, errors: list[KafkaError],
                   reported: list[KafkaError]) -> Producer:
        """A new confluent-kafka ``Producer`` for the slot: failed deliveries into
        ``errors``, error events (``error_cb``) into ``reported``."""

        def on_delivery(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                errors.append(err)

        return self.clients.producer(
            transactional_id, on_delivery=on_delivery, error_cb=reported.append,
            **{"delivery.report.only.error": True})

    def open_slot(self, slot: SlotTransaction, slots: int) -> Slot:
        """Task: a producer for the slot's transactional id; fence the previous owner.
        ``slots``: the sink's slot count for this batch.

        With ``reuse_producers``, the producer this worker kept from the slot's previous
        task begins the transaction instead (see :mod:`connectors.kafka._pool`).
        """
        if self.clients.options.reuse_producers:
            key = self.clients.pool_key(slot.name)
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
                    handle = Slot(slot, kept.producer, time.monotonic(), errors=kept.errors,
                                  reused=True, pooled=kept)
                    handle.topics.update(self.checks.known_topics)
                    return handle
        try:
            fresh = self.new_producer(slot.name)
            fresh.producer.begin_transaction()
        except KafkaException as exc:
            err = self.clients.error(exc, f"starting slot {slot.slot}'s transaction",
                                     batch_id=slot.batch_id, transaction_id=slot.name)
            if isinstance(err, DETERMINISTIC_ERRORS):
                raise self.alignment.fail(None, err, slots, slot.barrier) from None
            raise err from None
        handle = Slot(slot, fresh.producer, time.monotonic(), errors=fresh.errors, pooled=fresh)
        handle.topics.update(self.checks.known_topics)
        return handle

    def _probe(self, kept: PooledProducer, slot: SlotTransaction) -> None:
        """Prove that a kept producer still owns the slot before anything is read or
        written with it: one small record (key ``slot/<n>/probe``, which marker reads
        skip) into the slot's marker partition, flushed. Adding that partition to the
        transaction fails if another producer of the slot id started since (another worker
        ran the slot, or the driver fenced it). Costs a round trip (~2-5 ms) instead of
        ``init_transactions``. Compaction keeps one probe per slot."""
        producer = kept.producer
        with client_errors():
            producer.produce(self.clients.options.marker_topic, b"", probe_key(slot.slot),
                             partition=slot.slot)
            left = producer.flush(self.clients.timeout)
        if left or kept.errors:
            raise KafkaException(kept.errors[0] if kept.errors else KafkaError(
                KafkaError._TIMED_OUT, "the probe of a kept producer was not delivered"))

    def keep(self, handle: Slot) -> None:
        """After a clean end of the slot's transaction: keep its producer for the next task."""
        if (self.clients.options.reuse_producers and handle.pooled is not None
                and not handle.open):
            SlotProducers.give_back(self.clients.pool_key(handle.ctx.name), handle.pooled)
        handle.pooled = None

    def read_marker(self, handle: Slot, slots: int) -> SlotMarker | None:
        """Task, after fencing: this slot's marker for this batch, if it is committed."""
        marker = self.committed_marker(handle, slots)
        if marker is None:
            return None
        handle.failure = REPLAYED
        return marker

    def _newest_marker(self, handle: Slot) -> SlotMarker | None:
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
        newest = self.clients.last_marker(handle.ctx.slot, batch_id=handle.ctx.batch_id)
        if pooled is not None:
            pooled.newest_marker, pooled.knows_newest = newest, True
        return newest

    def committed_marker(self, handle: Slot, slots: int) -> SlotMarker | None:
        """The slot's marker for this batch (or a later one: an error), if committed."""
        ctx = handle.ctx
        marker = self._newest_marker(handle)
        if marker is None or (marker.generation, marker.batch_id) < (
            ctx.generation, ctx.batch_id
        ):
            return None
        if (marker.generation, marker.batch_id) > (ctx.generation, ctx.batch_id):
            raise self.alignment.fail(handle, FatalError(
                f"slot {ctx.slot} already committed batch {marker.batch_id} (generation "
                f"{marker.generation}), after this batch {ctx.batch_id}: Spark is running "
                "an older batch than the sink wrote (another checkpoint?). Use the original "
                "checkpoint, or a new sink_id", sink_id=self.sink_id, batch_id=ctx.batch_id,
                transaction_id=ctx.name), slots)
        return marker

    def write(self, handle: Slot, batch: pa.RecordBatch, slots: int) -> None:
        """Task: check the records of ``batch``, then produce them into the transaction."""
        try:
            self.checks.check_slot_batch(batch, handle.topics, handle.producer,
                                         batch_id=handle.ctx.batch_id,
                                         transaction_id=handle.ctx.name)
        except ConnectorError as exc:
            if isinstance(exc, DETERMINISTIC_ERRORS):
                raise self.alignment.fail(handle, exc, slots) from None
            raise
        handle.batches.append(batch)
        if handle.stale:
            return  # the commit starts the slot over with every batch kept
        try:
            with client_errors():
                fast = handle.pooled.fast if handle.pooled is not None else None
                rows, path = produce_batch(handle.producer.produce, handle.producer.poll,
                                           batch, self.clients.options.topic, fast)
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
            err = self.clients.error(exc, f"producing slot {handle.ctx.slot}'s records",
                                     batch_id=handle.ctx.batch_id,
                                     transaction_id=handle.ctx.name)
            if isinstance(err, DETERMINISTIC_ERRORS):
                raise self.alignment.fail(handle, err, slots) from None
            raise err from None
