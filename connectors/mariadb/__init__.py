"""MariaDB and MySQL: exactly-once through XA prepared transactions (issue 54, in progress:
nothing is exported yet; the sink is ``connectors.mariadb._sink.MariaDBSink``)."""
