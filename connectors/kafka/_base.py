"""The state and clients every role of :class:`~connectors.kafka.KafkaSink` shares."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from confluent_kafka import Producer

from connectors.core.batch import TaskBarrier
from connectors.core.errors import ConnectorError
from connectors.core.families import TaskCommitSink
from connectors.core.tasks import SlotMarker
from connectors.kafka._config import (
    KafkaConfig,
    KafkaOptions,
)
from connectors.kafka._errors import translate
from connectors.kafka._io import Admin, read_committed
from connectors.kafka._ledger import KafkaLedger
from connectors.kafka._pool import PooledProducer
from connectors.kafka._records import RecordLimits
from connectors.kafka._slot import (
    MARKER_TAIL,
    _Slot,
    marker_key,
)
from connectors.kafka._spark import FrameChecks

logger = logging.getLogger(__name__)


class KafkaSinkBase(TaskCommitSink[_Slot]):
    """What the roles of :class:`~connectors.kafka.KafkaSink` share: its state and its
    clients. The roles (:mod:`._slots`, :mod:`._input`, :mod:`._writer`,
    :mod:`._committer`) subclass it; ``KafkaSink`` combines them."""

    options: KafkaOptions
    config: KafkaConfig
    limits: RecordLimits
    #: Partition counts of topics the driver checked (shipped to the tasks).
    known_topics: dict[str, int]
    _admin: Admin | None
    _ledger: KafkaLedger | None
    _auto_slots: bool
    _slots_ever: int
    _checked_broker: bool
    _validated: set[str]
    _marker_ready: int
    _frames: FrameChecks

    if TYPE_CHECKING:  # defined by the roles, called across them
        def _fail(self, handle: _Slot | None, exc: ConnectorError,
                  barrier: TaskBarrier | None = None) -> ConnectorError: ...
        def _gather(self, handle: _Slot | None, status: str,
                    barrier: TaskBarrier | None = None) -> list[str]: ...
        def _new_producer(self, transactional_id: str) -> PooledProducer: ...
        def _pool_key(self, transactional_id: str) -> str: ...
        def _keep(self, handle: _Slot) -> None: ...
        def _committed_marker(self, handle: _Slot) -> SlotMarker | None: ...
        def _check_broker(self) -> None: ...

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

    def _last_marker(self, slot: int, batch_id: int | None = None) -> SlotMarker | None:
        """The newest committed marker of ``slot`` (its partition of the marker topic)."""
        tail: int | None = MARKER_TAIL
        while True:
            records = read_committed(self.config, self.options.marker_topic, slot, tail=tail,
                                     timeout=self.options.operation_timeout_s,
                                     reuse=self.options.reuse_producers,
                                     sink_id=self.sink_id, batch_id=batch_id)
            for record in reversed(records):
                if record.key != marker_key(slot) or record.value is None:
                    continue
                marker = SlotMarker.from_json(json.loads(record.value))
                if marker.sink_id == self.sink_id and marker.slot == slot:
                    return marker
            if tail is None:
                return None
            tail = None  # nothing in the tail: read the whole (compacted) partition
