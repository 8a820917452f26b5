"""The record checks of :class:`~connectors.kafka.KafkaSink`, on the driver and in every
slot: :class:`RecordChecks` applies the Arrow checks of :mod:`connectors.kafka._records`
and the DataFrame checks of :mod:`connectors.kafka._scan`.

Driver: columns and types (once per batch), the topic (created if asked) and its limits,
and with ``barrier=False`` every record before any slot runs (on a DataFrame in the
slotting shuffle's map stage, else in a job of plain tasks, :func:`scan_task`). Task: a
slot's record batch against the limits and its topics' partitions before it is produced.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from functools import partial
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaException

from connectors.core.batch import BatchInput, TaskInfo, TaskOutcome
from connectors.core.errors import BadInputError, TransientError
from connectors.core.fingerprint import without_row_hash
from connectors.kafka._clients import KafkaClients
from connectors.kafka._records import (
    CLIENT_MAX_MESSAGE_BYTES,
    TOPIC_MAX_MESSAGE_BYTES,
    RecordLimits,
    bad_topic,
    check_schema,
    merge_topics,
    partition_beyond,
    partition_record,
    scan_batch,
)
from connectors.kafka._scan import FrameChecks

__all__ = ["RecordChecks", "scan_task"]

logger = logging.getLogger(__name__)


class RecordChecks:
    """Every check of the records a sink writes (see the module docstring).

    ``frames``: the DataFrame checks (driver only: the tasks get :meth:`FrameChecks.shipped`).
    """

    def __init__(self, clients: KafkaClients, frames: FrameChecks, *,
                 values_in_errors: bool) -> None:
        self.clients = clients
        self.frames = frames
        self.values_in_errors = values_in_errors
        self.limits = RecordLimits(
            int(clients.config.get("message.max.bytes", CLIENT_MAX_MESSAGE_BYTES)))
        #: Partition counts of topics the driver checked (shipped to the tasks).
        self.known_topics: dict[str, int] = {}
        self._validated: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["frames"] = self.frames.shipped()  # holds JVM references
        return state

    @property
    def sink_id(self) -> str:
        return self.clients.sink_id

    def forget_topics(self) -> None:
        """Driver, at a (re)start or after a failed batch: check the topic again."""
        self._validated.clear()

    # ------------------------------------------------------------------ driver side

    def validate_input(self, schema: pa.Schema) -> None:
        """Driver, before any task: columns and types; the topic exists (or is created)."""
        options = self.clients.options
        check_schema(schema, fixed_topic=options.topic is not None)
        topic = options.topic
        if topic is None or topic in self._validated:
            return  # checked in this driver run (a failed batch starts a new check)
        admin = self.clients.admin()
        info = admin.topic(topic)
        if info is None:
            if not options.create_topic:
                raise BadInputError(
                    f"topic {topic!r} does not exist: create it, or pass create_topic=True "
                    "(with topic_partitions=N)", sink_id=self.sink_id)
            admin.create_topic(topic, options.topic_partitions, options.replication_factor, {})
            info = admin.topic(topic)
            if info is None:
                raise TransientError(f"topic {topic!r} was created but is not visible yet",
                                     sink_id=self.sink_id)
        self.known_topics[topic] = info.partitions
        client_max = int(self.clients.config.get("message.max.bytes", CLIENT_MAX_MESSAGE_BYTES))
        topic_config = admin.topic_config(topic)
        # Without DESCRIBE_CONFIGS on the topic only the client's limit is checked here;
        # the broker refuses a larger record (the batch then fails and commits nothing).
        topic_max = client_max if topic_config is None else int(
            topic_config.get("max.message.bytes", TOPIC_MAX_MESSAGE_BYTES))
        self.limits = RecordLimits(min(client_max, topic_max))
        self._validated.add(topic)

    def prescan(self, batch: BatchInput, batch_id: int) -> BatchInput:
        """``barrier=False``: :meth:`validate_input`, then every record checked before any
        slot runs, so that a bad batch commits nothing. Returns the batch to write: on a
        DataFrame, the checks run in the slotting shuffle's map stage
        (:meth:`~connectors.kafka._scan.FrameChecks.prescan`); otherwise a job of plain
        tasks checks them first."""
        self.validate_input(batch.schema)
        topics: dict[str, int] = {}
        topic = self.clients.options.topic
        on_frame = self.frames.prescan(batch, batch_id, self.limits, topic,
                                       self.known_topics.get(topic) if topic else None)
        if on_frame is not None:
            batch, topics = on_frame
        else:
            for outcome in batch.run_tasks(partial(scan_task, self, batch_id)):
                if outcome.error is not None:
                    raise outcome.error
                merge_topics(topics, {t: int(top) for t, top in outcome.figures.items()})
        admin = self.clients.admin()
        for topic, top in sorted(topics.items()):
            problem = bad_topic(topic) if topic != self.clients.options.topic else None
            if problem is not None:  # before any metadata request names it
                raise BadInputError(problem, sink_id=self.sink_id, batch_id=batch_id)
            partitions = self.known_topics.get(topic)
            if partitions is None:
                info = admin.topic(topic)
                if info is None:
                    raise BadInputError(
                        f"topic {topic!r} (from the 'topic' column) does not exist: create it",
                        sink_id=self.sink_id, batch_id=batch_id)
                partitions = self.known_topics[topic] = info.partitions
            if top >= partitions:
                raise BadInputError(partition_beyond(top, topic, partitions),
                                    sink_id=self.sink_id, batch_id=batch_id)
        return batch

    # ------------------------------------------------------------------ task side

    def check_slot_batch(self, batch: pa.RecordBatch, topics: dict[str, int], producer: Any,
                         *, batch_id: int, transaction_id: str) -> None:
        """Task: refuse a record of ``batch`` that cannot be written, before anything of it
        is produced. ``topics``: the partition counts the slot knows (topics it looks up
        with ``producer`` are added)."""
        def error(message: str) -> BadInputError:
            return BadInputError(message, sink_id=self.sink_id, batch_id=batch_id,
                                 transaction_id=transaction_id)

        scan = scan_batch(batch, self.limits, self.clients.options.topic, error,
                          values_in_errors=self.values_in_errors)
        for topic, top in scan.topics.items():
            partitions = topics.get(topic)
            if partitions is None:
                try:
                    meta = producer.list_topics(topic, timeout=self.clients.timeout)
                except KafkaException as exc:
                    raise self.clients.error(exc, f"reading the metadata of {topic!r}",
                                             batch_id=batch_id) from None
                found = meta.topics.get(topic)
                if found is None or found.error is not None or not found.partitions:
                    raise error(f"topic {topic!r} does not exist: create it first")
                partitions = topics[topic] = len(found.partitions)
            if top >= partitions:
                what = partition_record(batch, partitions) if self.values_in_errors else ""
                raise error(partition_beyond(top, topic, partitions, what))


def scan_task(
    checks: RecordChecks, batch_id: int, info: TaskInfo, batches: Iterator[pa.RecordBatch]
) -> TaskOutcome:
    """``barrier=False``: one partition's records checked, nothing written. The outcome's
    figures are what the task found: each topic its records go to -> the highest partition
    they name in it (``-1``: none given), which the driver checks against the topic."""
    topics: dict[str, int] = {}

    def error(message: str) -> BadInputError:
        return BadInputError(message, sink_id=checks.sink_id, batch_id=batch_id)

    try:
        for batch in batches:
            scan = scan_batch(without_row_hash(batch), checks.limits,
                              checks.clients.options.topic, error,
                              values_in_errors=checks.values_in_errors)
            merge_topics(topics, scan.topics)
    except BadInputError as exc:
        return TaskOutcome(error=exc)
    return TaskOutcome(figures={topic: float(top) for topic, top in topics.items()})
