"""Driver side of :class:`~connectors.kafka.KafkaSink`: the input's checks.
Columns and types, the topic (created if asked), and with ``barrier=False`` every record
before any slot runs (on a DataFrame in the slotting shuffle's map stage, else in a job of
plain tasks, :func:`_scan_task`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from functools import partial

import pyarrow as pa

from connectors.core.batch import BatchInput, TaskInfo, TaskOutcome
from connectors.core.errors import (
    BadInputError,
    TransientError,
)
from connectors.core.fingerprint import Fingerprint, without_row_hash
from connectors.core.ledger import TaskCommit
from connectors.kafka._base import KafkaSinkBase
from connectors.kafka._records import (
    RecordLimits,
    bad_topic,
    check_schema,
    merge_topics,
    partition_beyond,
    scan_batch,
)
from connectors.kafka._slot import (
    _CLIENT_MAX_MESSAGE_BYTES,
    _TOPIC_MAX_MESSAGE_BYTES,
)

logger = logging.getLogger(__name__)


class InputChecks(KafkaSinkBase):
    """Driver: the input's checks (see the module docstring)."""

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
        client_max = int(self.config.get("message.max.bytes", _CLIENT_MAX_MESSAGE_BYTES))
        topic_config = admin.topic_config(topic)
        # Without DESCRIBE_CONFIGS on the topic only the client's limit is checked here;
        # the broker refuses a larger record (the batch then fails and commits nothing).
        topic_max = client_max if topic_config is None else int(
            topic_config.get("max.message.bytes", _TOPIC_MAX_MESSAGE_BYTES))
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
            problem = bad_topic(topic) if topic != self.options.topic else None
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


def _scan_task(
    sink: KafkaSinkBase, batch_id: int, info: TaskInfo, batches: Iterator[pa.RecordBatch]
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
