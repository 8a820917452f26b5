"""What a sink into a table format keeps beside the table (DeltaSink's, IcebergSink's).

- :mod:`connectors.lake.ledger`: :class:`~connectors.lake.ledger.TableLedger`, a ledger
  directory next to a table on a local or shared POSIX file system, with the batches'
  intents and the driver's lease (an exclusive ``flock``);
- :mod:`connectors.lake.object_ledger`: the same as objects beside a table on S3, GCS or
  Azure (conditional writes, a lease object), and ``open_ledger``, which picks one;
- :mod:`connectors.lake.store`: the object-store client (obstore) and its settings, read
  from the ``spark.hadoop.fs.s3a.*`` confs the user already gave Spark.

- :mod:`connectors.lake.changes`: a change stream applied by SQL MERGE (``merge_on``,
  ``sequence_column``, ``delete_when``, ...): the options, the source, the statement;
- :mod:`connectors.lake.commit_confs`: the session confs that tag a commit, set around it
  under the lock the session's kind needs.

The ledger and store modules import no pyspark; ``changes`` and ``commit_confs`` work on
Spark DataFrames and sessions (declared Spark-facing, ``docs/architecture.md``). The modules
are public to the table-format packages (``connectors.delta``, ``connectors.iceberg``);
users reach them through those packages.
"""
