"""Exactly-once sink into Apache Iceberg tables: :class:`IcebergSink`.

.. example-skip: CI's docstring examples run on Spark 4.2, which has no Iceberg runtime;
   integration/iceberg runs the same calls on Spark 4.1 (examples/stream_to_iceberg.py)

Example::

    from connectors.iceberg import IcebergSink

    sink = IcebergSink("lake.db.events", sink_id="events-iceberg", create_table=True)
    query = df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()

The session needs Iceberg's runtime jar and a catalog: ``get_session(components=
["iceberg"], conf={"spark.sql.catalog.lake": "org.apache.iceberg.spark.SparkCatalog",
...})``. See ``docs/iceberg.md`` for the protocol, the catalogs and what settles a crash.
"""

from connectors.iceberg._sink import IcebergSink
from connectors.iceberg._tag import SnapshotTag

__all__ = ["IcebergSink", "SnapshotTag"]
