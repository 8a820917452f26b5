"""Delta Lake: exactly-once appends, overwrites and MERGEs with Delta's transaction ids.

Needs the ``delta`` extra: ``pip install 'spark-exactly-once[delta]'`` (the ledger on object
stores, the Delta log read without a JVM), and Delta Lake's jars on the Spark session (e.g.
:func:`connectors.spark.get_session`, or ``spark-submit --packages``: ``connectors
submit-args``). Delta's Python API (the ``delta`` module) comes from an installed
delta-spark, the platform's own, or else Delta's jar itself: the extra installs no
delta-spark, because its pyspark requirement would replace the user's pyspark
(``connectors.delta._api.delta_tables``).

Example::

    from connectors.delta import DeltaSink
    sink = DeltaSink(f"{path}/events", sink_id="events-delta", create_table=True)
    query = df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()

See ``docs/delta.md`` for the protocol, the ledger and what a replay check covers.
"""

from connectors._deps import require

require("deltalake", extra="delta", feature="connectors.delta")

from connectors.delta._fan_out import DeltaSinks  # noqa: E402
from connectors.delta._log import LocalDeltaLog, LogState  # noqa: E402
from connectors.delta._meta import CommitTag, parse_user_metadata  # noqa: E402
from connectors.delta._sink import DeltaSink  # noqa: E402
from connectors.delta._writer import dedupe_by_key  # noqa: E402
from connectors.lake.ledger import TableLedger as DeltaLedger  # noqa: E402

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
