"""MariaDB (and MySQL's XA): exactly-once through XA prepared branches.

Needs the ``mariadb`` extra: ``pip install 'spark-exactly-once[mariadb]'`` (PyMySQL).
Operating guide: ``docs/mariadb.md``.

Example::

    from connectors.mariadb import MariaDBSink
    # mariadb_url: "mariadb://user:password@host:3306/database"
    sink = MariaDBSink(mariadb_url, "events", sink_id=sink_id, create_table=True)
    query = df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()
"""

from connectors._deps import require

require("pymysql", extra="mariadb", feature="connectors.mariadb")

from connectors.mariadb._sink import MariaDBSink  # noqa: E402

__all__ = ["MariaDBSink"]
