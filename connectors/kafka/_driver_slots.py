"""Driver side of :class:`~connectors.kafka.KafkaSink`: the slots' bookkeeping.

:class:`DriverSlots` keeps the slot count and placement rule (stored in the ledger, fixed
while a batch is unfinished), the marker topic with one partition per slot, and fences
every slot the sink ever used. Each action that touches the ledger or the cluster is one
method with explicit arguments: :meth:`~DriverSlots.fence_all`,
:meth:`~DriverSlots.unfinished`, :meth:`~DriverSlots.record_slots`; :meth:`~DriverSlots.plan`
decides a batch's slots from them. The coordinator orders them: ``PlanSlots`` then
``RecordSlots`` (through its guard) before the batch's tasks, ``FenceAll`` at a start.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import KafkaException

from connectors.core.batch import BatchInput
from connectors.core.errors import ConfigurationError
from connectors.core.naming import slot_name
from connectors.core.protocol.transactions import SlotPlan
from connectors.core.templates.tasks import SlotMarker
from connectors.kafka._clients import KafkaClients
from connectors.kafka._io import init_transactions
from connectors.kafka._ledger import PLACEMENT_KEY, PLACEMENT_ROW, KafkaLedger
from connectors.kafka._pool import SLOT_OWNERS

__all__ = ["PLACEMENT_KEY", "PLACEMENT_ROW", "DriverSlots", "check_barrier"]

logger = logging.getLogger(__name__)


class DriverSlots:
    """Driver: the slots (see the module docstring)."""

    def __init__(self, clients: KafkaClients) -> None:
        self.clients = clients
        #: The most slots the sink ever used (fenced at every (re)start).
        self.slots_ever = 0
        #: The slot count the marker topic was checked for in this driver run.
        self.marker_ready = 0

    def fence_all(self, ledger_slots: int | None) -> int:
        """``init_transactions`` on every slot id the sink ever used: the marker topic's
        partitions, ``ledger_slots`` (the ledger's slot count) and every count this driver
        used. Each aborts the open transaction a dead task or driver left on that id, so no
        ``read_committed`` consumer stays stalled. Returns how many were fenced."""
        clients = self.clients
        clients.check_broker()
        self.marker_ready = 0  # a (re)start or a failed batch checks the marker topic again
        info = clients.admin().topic(clients.options.marker_topic)
        count = max(info.partitions if info else 0, ledger_slots or 0, self.slots_ever)
        self.slots_ever = count
        if count == 0:
            return 0
        started = time.monotonic()
        # A metadata request for a missing topic may create it: ask for every topic then.
        known = clients.options.marker_topic if info is not None else None

        def fence(slot: int) -> None:
            tid = slot_name(clients.sink_id, slot)
            try:
                init_transactions(clients.producer(tid), known, clients.timeout)
                SLOT_OWNERS.claim(clients.pool_key(tid))
            except KafkaException as exc:
                raise clients.error(exc, f"fencing slot {slot} (init_transactions)",
                                    transaction_id=tid) from None

        with ThreadPoolExecutor(min(8, count)) as pool:
            list(pool.map(fence, range(count)))
        logger.info("sink %s: fenced %d slot(s) in %.0f ms", clients.sink_id, count,
                    (time.monotonic() - started) * 1000)
        return count

    def last_markers(self) -> dict[int, SlotMarker | None]:
        """Every slot's newest committed marker (by the marker topic's partitions)."""
        info = self.clients.admin().topic(self.clients.options.marker_topic)
        return {slot: self.clients.last_marker(slot)
                for slot in range(info.partitions if info else 0)}

    def unfinished(self, ledger: KafkaLedger, generation: int) -> int | None:
        """A batch of ``generation`` some slot committed (its marker) but ``ledger`` does
        not record."""
        for marker in self.last_markers().values():
            if marker is None or marker.generation != generation:
                continue
            if ledger.get(marker.batch_id) is None:
                return marker.batch_id
        return None

    def record_slots(self, ledger: KafkaLedger, plan: SlotPlan) -> None:
        """The marker topic with (at least) ``plan.slots`` partitions, then the plan stored
        in ``ledger`` where it differs from what the ledger has."""
        slots, placement = plan.slots, plan.placement
        options, admin = self.clients.options, self.clients.admin()
        info = admin.topic(options.marker_topic)
        if info is None:
            admin.create_topic(options.marker_topic, slots, options.replication_factor,
                               {"cleanup.policy": "compact"})
        elif info.partitions < slots:
            admin.add_partitions(options.marker_topic, slots)
        if ledger.slots != slots or ledger.placement != placement:
            ledger.record_slots(slots, placement)
        self.marker_ready = slots
        self.slots_ever = max(self.slots_ever, slots, info.partitions if info else 0)

    def plan(self, ledger: KafkaLedger, generation: int, wanted: int,
             placement: str) -> SlotPlan:
        """Driver, every batch: the slot count and placement rule (``wanted`` and
        ``placement`` unless a batch is unfinished); ``record`` where they change or the
        marker topic was not checked in this driver run (:meth:`record_slots`)."""
        sink_id = self.clients.sink_id
        stored, placed = ledger.slots, ledger.placement
        unfinished = None
        if (stored is not None and stored != wanted) or (placed not in (None, placement)):
            unfinished = self.unfinished(ledger, generation)
        if stored is not None and stored != wanted:
            if unfinished is not None:
                raise ConfigurationError(
                    f"the sink's slot count is {stored}; it cannot change to {wanted} while "
                    f"batch {unfinished} is unfinished (some slots committed it, the ledger "
                    "does not record it complete). Restart with the old slot count until that "
                    "batch is complete, then change it", sink_id=sink_id)
            logger.warning("sink %s: slot count changes from %d to %d", sink_id, stored,
                           wanted)
        if placed is not None and placed != placement:
            if unfinished is not None:
                logger.warning(
                    "sink %s: batch %d was started with the %r placement of rows into slots; "
                    "it is finished with it, later batches use the %r placement", sink_id,
                    unfinished, placed, placement)
                placement = placed
            else:
                logger.info("sink %s: rows are placed into slots by the %r rule from now on "
                            "(was %r)", sink_id, placement, placed)
        checked = stored == wanted and placed == placement and self.marker_ready == wanted
        return SlotPlan(wanted, placement, record=not checked)


def check_barrier(batch: BatchInput, slots: int, sink_id: str) -> None:
    """Barrier mode needs ``slots`` concurrent task slots and an engine that runs it."""
    refusal = batch.barrier_refusal()
    if refusal is not None:
        raise ConfigurationError(
            f"barrier=True cannot run here: {refusal}. Or pass barrier=False", sink_id=sink_id)
    cores = batch.task_slots()
    if cores is not None and slots > cores:
        raise ConfigurationError(
            f"barrier=True needs one free task slot per sink slot: slots={slots}, but "
            f"the cluster offers {cores} (spark default parallelism). Use slots<={cores}, "
            "more executor cores, or barrier=False", sink_id=sink_id)
