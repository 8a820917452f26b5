"""Executor side of :class:`~connectors.kafka.KafkaSink`: a slot's commit, :class:`SlotCommitter`.
The marker produced and flushed, in barrier mode every slot's status gathered first, the
transaction committed (redone, or started over with a new producer, where Kafka allows),
or aborted."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from connectors.core.errors import (
    BadInputError,
    ConnectorError,
    NonDeterministicReplayError,
    TransientError,
)
from connectors.core.protocol.replay import check_replay
from connectors.core.templates.tasks import DETERMINISTIC_ERRORS, SlotMarker
from connectors.kafka._clients import KafkaClients
from connectors.kafka._config import TIMEOUT_WARN_RATIO, KafkaOptions
from connectors.kafka._errors import FENCED_CODES, kafka_error
from connectors.kafka._figures import slot_task_figures
from connectors.kafka._produce import produce_batch
from connectors.kafka._task_slot import (
    FAILED,
    OK,
    REPLAYED,
    TXN_ATTEMPTS,
    Alignment,
    Slot,
    client_errors,
    marker_key,
    retrying,
)
from connectors.kafka._writer import SlotWriter

__all__ = ["SlotCommitter"]

logger = logging.getLogger(__name__)


class SlotCommitter:
    """Task: commit or abort a slot's transaction. ``writer`` makes the slot's producers
    and reads its marker; ``on_replay_mismatch``: the sink's option (``"fail"``/``"warn"``)."""

    def __init__(self, clients: KafkaClients, writer: SlotWriter, alignment: Alignment, *,
                 on_replay_mismatch: str) -> None:
        self.clients = clients
        self.writer = writer
        self.alignment = alignment
        self.on_replay_mismatch = on_replay_mismatch

    @property
    def sink_id(self) -> str:
        return self.clients.sink_id

    @property
    def options(self) -> KafkaOptions:
        return self.clients.options

    def _marker_value(self, handle: Slot, marker: SlotMarker) -> bytes:
        return json.dumps(marker.to_json()).encode()

    def _flush(self, handle: Slot, marker: SlotMarker) -> None:
        """Produce the marker, flush, and turn delivery errors into the library's errors."""
        producer = handle.producer
        producer.produce(self.options.marker_topic, self._marker_value(handle, marker),
                         marker_key(marker.slot), partition=marker.slot)
        with client_errors():
            left = producer.flush(self.options.transaction_timeout_ms / 1000)
        if left:
            raise TransientError(
                f"{left} record(s) of slot {marker.slot} not delivered within "
                "transaction.timeout.ms", sink_id=self.sink_id, batch_id=marker.batch_id,
                transaction_id=handle.ctx.name)
        if handle.errors:
            first = handle.errors[0]
            if first.code() == KafkaError._PURGE_QUEUE:
                raise KafkaException(self._purge_cause(producer) or first)
            raise KafkaException(first)

    def _into(self) -> str:
        """The topics a slot writes, for messages."""
        rows = (repr(self.options.topic) if self.options.topic is not None
                else "the topics of its rows' 'topic' column")
        return f"{rows} (and its marker into {self.options.marker_topic!r})"

    @staticmethod
    def _purge_cause(producer: Any) -> KafkaError | None:
        """Why librdkafka purged the transaction's records (the delivery reports do not
        say): the transaction failed, e.g. the broker refused to add a partition to it (no
        WRITE on the topic). ``begin_transaction`` on a failed transaction raises that
        cause (``txn_requires_abort``); on a live one it raises a state error. It changes
        nothing either way, and commits nothing."""
        try:
            producer.begin_transaction()
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if err is not None and err.txn_requires_abort():
                return err
        return None

    def _redo(self, handle: Slot, new_producer: bool) -> None:
        """Abort (or drop the producer) and write the slot's transaction again."""
        if new_producer:
            self._replace_producer(handle)
        else:
            handle.producer.abort_transaction(self.clients.timeout)
            handle.errors.clear()
        self._write_again(handle)

    def _replace_producer(self, handle: Slot) -> None:
        """A new producer for the slot (``init_transactions`` fences the old one)."""
        fresh = self.writer.new_producer(handle.ctx.name)
        handle.producer, handle.errors, handle.pooled = fresh.producer, fresh.errors, fresh

    def _write_again(self, handle: Slot) -> None:
        """Begin a transaction and produce every record batch of the slot again.

        Record by record, with a delivery report for each: if the first attempt failed on
        a delivery that the accelerator does not report (:mod:`connectors.kafka._native`),
        this attempt names the failure."""
        handle.producer.begin_transaction()
        handle.open = True
        handle.rows = 0
        handle.paths.clear()
        with client_errors():
            for batch in handle.batches:
                rows, path = produce_batch(handle.producer.produce, handle.producer.poll,
                                           batch, self.options.topic)
                handle.rows += rows
                handle.paths[path] = handle.paths.get(path, 0) + rows

    def commit_slot(self, handle: Slot, marker: SlotMarker, slots: int) -> Mapping[str, float]:
        """Task: write the marker with the rows, align with the other slots, commit; return
        the slot's figures (:func:`~connectors.kafka._figures.slot_task_figures`).

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
                self._start_over(handle, marker, slots)
            else:
                try:
                    self._flush(handle, marker)
                except KafkaException:
                    if not handle.reused:
                        raise
                    self._start_over(handle, marker, slots)  # kept, and fenced or broken since
        except (KafkaException, NonDeterministicReplayError) as exc:
            failure = (exc if isinstance(exc, ConnectorError)
                       else self.clients.error(exc, f"writing slot {ctx.slot} into {self._into()}",
                                        **ids))
            if isinstance(failure, DETERMINISTIC_ERRORS):
                raise self.alignment.fail(handle, failure, slots) from None
            raise failure from None
        # Step 2
        statuses = self.alignment.gather(handle, OK, slots)
        failed = [s.split("|", 1)[1] for s in statuses if s.startswith(FAILED + "|")]
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
        for attempt in range(TXN_ATTEMPTS):
            if handle.committed_by_other:
                break
            try:
                retrying(lambda: handle.producer.commit_transaction(self.clients.timeout))
                handle.open = False
                break
            except KafkaException as exc:
                err = kafka_error(exc)
                if handle.reused and (err is None or err.fatal() or err.code() in FENCED_CODES):
                    # Kept from an earlier task and fenced since: this transaction cannot
                    # commit. Start over with a new producer (marker read again).
                    try:
                        self._start_over(handle, marker, slots)
                    except KafkaException as again:
                        raise self.clients.error(again, f"starting slot {ctx.slot} over",
                                          **ids) from None
                    continue
                if err is not None and (err.code() in FENCED_CODES):
                    handle.open = False
                    raise TransientError(
                        f"slot {ctx.slot} was taken over by another attempt (a retried or "
                        "speculative task, or a newer driver) before it committed; that "
                        "attempt writes the slot", sink_id=self.sink_id, **ids) from None
                if err is None or attempt == TXN_ATTEMPTS - 1 or not (
                    err.txn_requires_abort() or err.fatal()
                ):
                    raise self.clients.error(exc, f"committing slot {ctx.slot}", **ids) from None
                logger.warning("sink %s batch %d slot %d: %s; redoing the transaction",
                               self.sink_id, ctx.batch_id, ctx.slot, err.name())
                try:
                    self._redo(handle, new_producer=err.fatal())
                    self._flush(handle, marker)
                except KafkaException as again:
                    raise self.clients.error(again, f"redoing slot {ctx.slot}", **ids) from None
        else:
            raise TransientError(f"slot {ctx.slot} did not commit in {TXN_ATTEMPTS} attempts",
                                 sink_id=self.sink_id, **ids)
        if not handle.committed_by_other and handle.pooled is not None:
            # The slot's newest committed marker is now ours (see _newest_marker).
            handle.pooled.newest_marker, handle.pooled.knows_newest = marker, True
        self.writer.keep(handle)
        return slot_task_figures(handle, (time.monotonic() - handle.started) * 1000)

    def _start_over(self, handle: Slot, marker: SlotMarker, slots: int) -> None:
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
        found = self.writer.committed_marker(handle, slots)
        if found is not None:  # the replay rule (warns and goes on under "warn")
            check_replay(self.sink_id, self.on_replay_mismatch, ctx.batch_id,
                         found.fingerprint, marker.fingerprint,
                         what=f"slot {ctx.slot} by another attempt", transaction_id=ctx.name)
            handle.committed_by_other = True
            return
        self._write_again(handle)
        self._flush(handle, marker)

    def abort_slot(self, handle: Slot, slots: int) -> None:
        """Task: abort the slot's open transaction (after telling the other slots)."""
        status = REPLAYED if handle.failure == REPLAYED else (
            f"{FAILED}|{handle.failure or 'slot ' + str(handle.ctx.slot) + ' failed'}")
        try:
            self.alignment.gather(handle, status, slots)
        finally:
            if handle.open:
                handle.open = False
                try:
                    handle.producer.abort_transaction(self.clients.timeout)
                    if status == REPLAYED:
                        self.writer.keep(handle)  # a clean end: the slot was committed before
                except KafkaException as exc:
                    # The next init_transactions of this slot id (a retry, fence_all)
                    # aborts it.
                    logger.warning("sink %s: abort of slot %d failed (%s)", self.sink_id,
                                   handle.ctx.slot, type(exc).__name__)
