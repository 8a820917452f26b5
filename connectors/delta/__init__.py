"""Delta Lake: exactly-once appends, overwrites and MERGEs with Delta's transaction ids.

Needs the ``delta`` extra: ``pip install 'spark-exactly-once[delta]'`` (and the Delta jars on the
Spark session, e.g. :func:`connectors.spark.get_session`).

Example::

    from connectors.delta import DeltaSink
    sink = DeltaSink(f"{path}/events", sink_id="events-delta", create_table=True)
    query = df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()

See ``docs/delta.md`` for the protocol, the ledger and what a replay check covers.
"""

from connectors._deps import require

require("delta", extra="delta", feature="connectors.delta")

from connectors.delta._fan_out import DeltaSinks  # noqa: E402
from connectors.delta._ledger import DeltaLedger  # noqa: E402
from connectors.delta._log import LocalDeltaLog, LogState  # noqa: E402
from connectors.delta._meta import CommitTag, parse_user_metadata  # noqa: E402
from connectors.delta._sink import DeltaSink  # noqa: E402
from connectors.delta._writer import dedupe_by_key  # noqa: E402

__all__ = [
    "CommitTag",
    "DeltaLedger",
    "DeltaSink",
    "DeltaSinks",
    "LocalDeltaLog",
    "LogState",
    "dedupe_by_key",
    "parse_user_metadata",
]
