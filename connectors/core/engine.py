"""Engine front ends: how a sink called by an engine (``foreachBatch``) gets its batch.

The core knows no engine. A front end (the Spark adapter, :mod:`connectors.spark.frames`:
classic PySpark and Spark Connect) registers a function that turns what the engine hands
the sink (a DataFrame) and how the sink was called (:class:`EngineCall`) into a
:class:`~connectors.core.batch.BatchInput` and the streaming query's id (``None`` in a
batch job), or returns ``None`` for objects it does not know. A front end that cannot
tell which query called the sink raises :class:`~connectors.core.errors.ConfigurationError`
naming the fix; it never guesses "batch job". ``connectors/__init__.py`` registers the
Spark front end without importing pyspark; it loads on the first call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from connectors.core.batch import BatchInput
from connectors.core.errors import ConfigurationError

__all__ = ["EngineCall", "FrontEnd", "batch_input_for", "register_front_end"]


@dataclass(frozen=True)
class EngineCall:
    """How a sink was called with an engine's data.

    ``hash_rows_in_tasks``: the sink's preference (see ``TwoPhaseCommitSink``).
    ``query_name``: the name the user gave the streaming query (``.queryName(...)``) and
    the sink (``query_name=``), for a front end that is not told the query's id (Spark
    Connect binds to the active query of that name). ``batch_job``: the user said this is
    a batch job (``sink.run_batch``): no query to look for.
    """

    sink_id: str
    hash_rows_in_tasks: bool = False
    query_name: str | None = None
    batch_job: bool = False


#: ``(data, call) -> (batch input, query id) | None``.
FrontEnd = Callable[[Any, EngineCall], "tuple[BatchInput, str | None] | None"]

_FRONT_ENDS: list[FrontEnd] = []


def register_front_end(front_end: FrontEnd) -> None:
    """Add ``front_end`` (tried in the order of registration; registering twice is a no-op)."""
    if front_end not in _FRONT_ENDS:
        _FRONT_ENDS.append(front_end)


def batch_input_for(data: Any, call: EngineCall) -> tuple[BatchInput, str | None]:
    """The batch input and query id of what an engine handed a sink."""
    sink_id = call.sink_id
    for front_end in _FRONT_ENDS:
        found = front_end(data, call)
        if found is not None:
            return found
    raise ConfigurationError(
        f"the sink cannot write a {type(data).__name__}: call it with a Spark DataFrame "
        "(df.writeStream.foreachBatch(sink), or sink(df, run_id) in a batch job), or use "
        "sink.write_batch(batch_input, batch_id)",
        sink_id=sink_id,
    )
