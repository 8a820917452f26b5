"""Kafka: exactly-once with one transactional producer per slot and replay markers.

Needs the ``kafka`` extra: ``pip install 'spark-exactly-once[kafka]'``.

Example::

    from connectors.kafka import KafkaSink
    sink = KafkaSink(topic, {"bootstrap.servers": bootstrap}, sink_id=sink_id, create_topic=True)
    query = df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()
"""

from connectors._deps import require

require("confluent_kafka", extra="kafka", feature="connectors.kafka")

from connectors.kafka._config import KafkaConfig  # noqa: E402
from connectors.kafka._ledger import KafkaLedger  # noqa: E402
from connectors.kafka._sink import KafkaSink  # noqa: E402

__all__ = ["KafkaConfig", "KafkaLedger", "KafkaSink"]
