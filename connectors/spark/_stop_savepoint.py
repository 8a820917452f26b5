"""Stop with a savepoint: Flink's ``stop --savepointPath``, for a Spark query.

:func:`stop_with_savepoint` stops the query gracefully (:func:`~connectors.spark._stop.
stop_gracefully`: the batch in flight finishes, the next one is refused), then takes the
sink's savepoint (:func:`connectors.savepoints.take_savepoint`): the last batch the sink
decided and, per source, the option that starts a new query right after it. The savepoint
is right whatever the stop's outcome (docs/design/savepoints.md): a stop that timed out
interrupted an undecided batch, which the savepoint does not include.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connectors.core.ledgers.file_ledger import write_atomic
from connectors.savepoints import Savepoint, take_savepoint
from connectors.spark._stop import StopReport, stop_gracefully

__all__ = ["SavepointStop", "stop_with_savepoint"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SavepointStop:
    """What :func:`stop_with_savepoint` did: the stop's :class:`StopReport` and the
    :class:`~connectors.savepoints.Savepoint` taken after it."""

    report: StopReport
    savepoint: Savepoint


def stop_with_savepoint(query: Any, sink: Any, checkpoint: str, timeout: float = 120.0, *,
                        spark: Any = None, output: str | None = None) -> SavepointStop:
    """Stop ``query`` gracefully, then take the savepoint of ``sink`` (the sink or
    ``FanOut`` the query writes into) from the query's ``checkpoint``.

    ``timeout`` and ``spark`` are :func:`~connectors.stop_gracefully`'s (``spark`` also
    reads a checkpoint that is not local); ``output``: a local file the savepoint's JSON
    document is written to as well.

    ``df`` below reads files: the savepoint names its batch and says why a file source
    cannot be resumed (a Kafka source's ``done.savepoint.options(0)`` is the new query's
    ``startingOffsets``; docs/savepoints.md has the whole workflow).

    Example::

        from connectors import DeltaSink, stop_with_savepoint

        sink = DeltaSink(f"{path}/events", sink_id=sink_id, create_table=True)
        query = df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()
        query.processAllAvailable()
        done = stop_with_savepoint(query, sink, ckpt, timeout=60)
        print(done.savepoint.describe())
        assert done.report.clean and done.savepoint.batch_id == 0
        assert done.savepoint.sources[0].kind == "file" and not done.savepoint.resumable
    """
    report = stop_gracefully(query, timeout, spark=spark)
    savepoint = take_savepoint(sink, checkpoint, spark=spark)
    if output is not None:
        write_atomic(Path(output), (savepoint.dumps() + "\n").encode())
    logger.info("query %s stopped (%s); savepoint of %s at batch %d%s", query.id,
                report.outcome, savepoint.sink_id, savepoint.batch_id,
                "" if savepoint.resumable else " (not resumable: a source has no starting "
                "option, see its describe())")
    return SavepointStop(report, savepoint)
