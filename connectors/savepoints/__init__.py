"""Savepoints: change a streaming query and keep exactly-once (docs/design/savepoints.md).

A savepoint is the last batch a sink decided and, for each source of its query, where that
batch ended and the reader option that starts a new query right after it::

    from connectors.savepoints import take_savepoint
    sp = take_savepoint(sink, "/checkpoints/orders")      # after the query stopped
    print(sp.describe())
    reader = spark.readStream.format("kafka").options(**sp.options(0))  # the new query

``connectors savepoint --checkpoint PATH --sink-id ID --postgres-env PGCONN`` does the same
from the command line, and :func:`connectors.spark.stop_with_savepoint` stops a query
gracefully and takes its savepoint in one call. Nothing here imports pyspark.
"""

from __future__ import annotations

from typing import Any

from connectors.core.ledgers.ledger import Ledger
from connectors.savepoints._offset_log import TextReader, local_path, local_reader
from connectors.savepoints._positions import SourcePosition
from connectors.savepoints._savepoint import Savepoint, load_savepoint, savepoint_from_ledger

__all__ = ["Savepoint", "SourcePosition", "load_savepoint", "take_savepoint"]


def spark_reader(spark: Any) -> TextReader:
    """A :data:`TextReader` through ``spark`` (``spark.read.text``, whole files): for a
    checkpoint on any file system the session reads (``s3a://``, ``hdfs://``, ``abfss://``);
    classic PySpark and Spark Connect alike."""

    def read(checkpoint: str, relative: str) -> str | None:
        path = checkpoint.rstrip("/") + "/" + relative
        try:
            rows = spark.read.text(path, wholetext=True).collect()
        except Exception as exc:  # the session's AnalysisException: no pyspark import here
            if "PATH_NOT_FOUND" in str(exc) or "Path does not exist" in str(exc):
                return None
            raise
        return str(rows[0][0]) if rows else ""

    return read


def take_savepoint(sink: Any, checkpoint: str, *, spark: Any = None) -> Savepoint:
    """The savepoint of ``sink`` (a sink, a :class:`~connectors.FanOut` or a
    :class:`~connectors.core.ledgers.ledger.Ledger`) and its query's ``checkpoint``.

    Reads the sink's ledger through the sink (its driver side: a KafkaSink's ledger is
    opened with its lease) and ``offsets/<that batch>`` of the checkpoint: a local
    directory or ``file:`` URI, or any path ``spark`` (a SparkSession) reads. Call it once
    the query has stopped (:func:`connectors.stop_with_savepoint` does); for a query that
    runs, or from another process, use ``connectors savepoint``, which reads the ledger
    without its lease and never disturbs a live driver (a ``Ledger`` given here is read as
    it is). Raises
    :class:`~connectors.core.errors.ConfigurationError` naming the reason when the
    checkpoint is another query's or the sink has decided nothing yet.

    >>> import json, pathlib, tempfile
    >>> from connectors.testing import InMemoryPreparedSink, InMemoryTarget, LocalBatch
    >>> import pyarrow as pa
    >>> sink = InMemoryPreparedSink(InMemoryTarget(), sink_id="orders")
    >>> _ = sink.write_batch(LocalBatch(pa.table({"x": [1, 2]})), 0, query_id="q-1")
    >>> ckpt = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (ckpt / "metadata").write_text(json.dumps({"id": "q-1"}))
    >>> (ckpt / "offsets").mkdir()
    >>> _ = (ckpt / "offsets" / "0").write_text('v1\\n{}\\n{"orders":{"0":2,"1":5}}\\n')
    >>> sp = take_savepoint(sink, str(ckpt))
    >>> sp.batch_id, sp.options(0)
    (0, {'startingOffsets': '{"orders":{"0":2,"1":5}}'})
    """
    reader = local_reader if spark is None or local_path(checkpoint) is not None \
        else spark_reader(spark)
    ledger = sink if isinstance(sink, Ledger) else sink.create_ledger()
    try:
        return savepoint_from_ledger(ledger, checkpoint, reader=reader)
    finally:
        if ledger is not sink:
            ledger.close()
