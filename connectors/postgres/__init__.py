"""PostgreSQL: exactly-once with prepared transactions (XA style).

Needs the ``postgres`` extra: ``pip install 'spark-exactly-once[postgres]'``.

Example::

    from connectors.postgres import PostgresSink
    sink = PostgresSink(conninfo, "public.events", sink_id="events-pg", create_table=True)
    query = df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()
"""

from connectors._deps import require

require("psycopg", extra="postgres", feature="connectors.postgres")
require("pgpq", extra="postgres", feature="connectors.postgres")

from connectors.postgres._config import Conninfo  # noqa: E402
from connectors.postgres._gid import XID_FORMAT_ID  # noqa: E402
from connectors.postgres._ledger import PostgresLedger  # noqa: E402
from connectors.postgres._sink import PostgresSink  # noqa: E402

__all__ = ["XID_FORMAT_ID", "Conninfo", "PostgresLedger", "PostgresSink"]
