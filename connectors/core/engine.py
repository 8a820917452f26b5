"""Engine front ends: how a sink called by an engine (``foreachBatch``) gets its batch.

The core knows no engine. A front end (the Spark adapter, :mod:`connectors.spark.batch`)
registers a function that turns what the engine hands the sink (a DataFrame) into a
:class:`~connectors.core.batch.BatchInput` and the streaming query's id (``None`` in a
batch job), or returns ``None`` for objects it does not know. ``connectors/__init__.py``
registers the Spark front end without importing pyspark; it loads on the first call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from connectors.core.batch import BatchInput
from connectors.core.errors import ConfigurationError

__all__ = ["FrontEnd", "batch_input_for", "register_front_end"]

#: ``(data, hash_rows_in_tasks) -> (batch input, query id) | None``.
FrontEnd = Callable[[Any, bool], "tuple[BatchInput, str | None] | None"]

_FRONT_ENDS: list[FrontEnd] = []


def register_front_end(front_end: FrontEnd) -> None:
    """Add ``front_end`` (tried in the order of registration; registering twice is a no-op)."""
    if front_end not in _FRONT_ENDS:
        _FRONT_ENDS.append(front_end)


def batch_input_for(
    data: Any, *, hash_rows_in_tasks: bool, sink_id: str
) -> tuple[BatchInput, str | None]:
    """The batch input and query id of what an engine handed a sink."""
    for front_end in _FRONT_ENDS:
        found = front_end(data, hash_rows_in_tasks)
        if found is not None:
            return found
    raise ConfigurationError(
        f"the sink cannot write a {type(data).__name__}: call it with a Spark DataFrame "
        "(df.writeStream.foreachBatch(sink), or sink(df, run_id) in a batch job), or use "
        "sink.write_batch(batch_input, batch_id)",
        sink_id=sink_id,
    )
