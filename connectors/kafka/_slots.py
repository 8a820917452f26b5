"""Driver side of :class:`~connectors.kafka.KafkaSink`: the slots. Their count
and placement rule (stored in the ledger, fixed while a batch is unfinished), the marker
topic with one partition per slot, the barrier's prerequisites, and fencing every slot
the sink ever used."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import KafkaException

from connectors.core.batch import BatchInput
from connectors.core.errors import ConfigurationError
from connectors.core.naming import slot_name
from connectors.core.tasks import SlotMarker
from connectors.kafka._base import KafkaSinkBase
from connectors.kafka._io import init_transactions
from connectors.kafka._ledger import PLACEMENT_KEY, PLACEMENT_ROW
from connectors.kafka._pool import SLOT_OWNERS

logger = logging.getLogger(__name__)


class SlotManager(KafkaSinkBase):
    """Driver: the slots (see the module docstring)."""

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
            found[slot] = self._last_marker(slot)
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


def _check_barrier(sink: KafkaSinkBase, batch: BatchInput) -> None:
    """Barrier mode needs ``slots`` concurrent task slots and an engine that runs it."""
    refusal = batch.barrier_refusal()
    if refusal is not None:
        raise ConfigurationError(
            f"barrier=True cannot run here: {refusal}. Or pass barrier=False",
            sink_id=sink.sink_id)
    cores = batch.task_slots()
    if cores is not None and sink.slots > cores:
        raise ConfigurationError(
            f"barrier=True needs one free task slot per sink slot: slots={sink.slots}, but "
            f"the cluster offers {cores} (spark default parallelism). Use slots<={cores}, "
            "more executor cores, or barrier=False", sink_id=sink.sink_id)
