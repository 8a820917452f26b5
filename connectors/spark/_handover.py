"""Handing rows to the tasks: Arrow batch sizes, the row-bound guard, session settings.

Spark (4.0+) ends an Arrow batch for a Python task at
``spark.sql.execution.arrow.maxRecordsPerBatch`` rows (10,000) or at
``spark.sql.execution.arrow.maxBytesPerBatch`` (64 MB), and to know the bytes it asks the
Arrow writer for its size after *every row*, unless that setting is exactly ``2**31 - 1``.
That question walks the Arrow vectors: it was 47 % of the JVM's CPU in a ``mapInArrow``
over 500k rows of 100 bytes (Java Flight Recorder), and without it the JVM spent 0.31
instead of 0.48 CPU-seconds. A sink that knows an upper bound ``B`` of every row's bytes
passes a :class:`Handover`: its tasks then run with the size check off and
``maxBytesPerBatch // B`` rows per batch (at most ``maxRecordsPerBatch``), so a batch still
holds at most ``maxBytesPerBatch`` bytes; both settings are set on the session for the
job only and restored after it (:func:`arrow_settings`, :func:`session_settings`). A bound
that is only assumed is enforced by a guard: a filter before the slotting shuffle that
fails the map stage (no task has run then) with :data:`ROW_BOUND_MARK` for a larger row;
:meth:`~connectors.spark.frames.SparkBatch.run_tasks` then runs the job again without the
guard (:attr:`Handover.fallback`, built only then) and with Spark's own batching, and tells
the sink (:attr:`Handover.tripped`), which assumes a larger bound for its next batches.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["MAX_BYTES", "MAX_RECORDS", "MIN_HANDOVER_ROWS", "NO_SIZE_CHECK", "ROW_BOUND_MARK",
           "Handover", "arrow_settings", "handover_budget", "handover_rows",
           "session_settings"]

logger = logging.getLogger(__name__)

#: Spark's settings for the Arrow batches handed to Python tasks.
MAX_RECORDS = "spark.sql.execution.arrow.maxRecordsPerBatch"
MAX_BYTES = "spark.sql.execution.arrow.maxBytesPerBatch"
#: The one ``maxBytesPerBatch`` at which Spark does not measure the batch after every row.
NO_SIZE_CHECK = 2**31 - 1
#: Fewer rows per Arrow batch than this: Spark's own batching instead (rows that large make
#: the per-row size check cheap next to copying them, and a bound far above most rows
#: would cut their batches short).
MIN_HANDOVER_ROWS = 1024
#: Prefix of the message a guard raises for a row over the assumed bound.
ROW_BOUND_MARK = "[connectors row bound] "

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "p": 1 << 50,
          "pb": 1 << 50}
_BYTES = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$")


@dataclass(frozen=True)
class Handover:
    """How a :class:`~connectors.spark.frames.SparkBatch` hands its rows to the tasks when
    the sink bounds them.

    ``rows``: rows per Arrow batch (from :func:`handover_rows`), Spark's per-row size check
    off. ``fallback``: when the batch's DataFrame carries a guard (a filter that raises
    :data:`ROW_BOUND_MARK` for a row over the bound the rows were computed from), the same
    DataFrame without it, built only when needed; ``None`` when the bound is known to hold
    (measured). ``tripped``: called when the guard failed the job, before it runs again
    with Spark's own batching.
    """

    rows: int
    fallback: Callable[[], DataFrame] | None = None
    tripped: Callable[[], None] | None = None


def _byte_string(text: str) -> int | None:
    """Spark's byte strings (``64MB``, ``67108864b``, ``32m``; binary units), else None."""
    match = _BYTES.match(text.lower())
    if match is None or match.group(2) not in _UNITS:
        return None
    return int(match.group(1)) * _UNITS[match.group(2)]


def handover_budget(spark: Any) -> tuple[int, int] | None:
    """The session's (bytes, rows) per Arrow batch (rows 0: no row limit), or ``None`` when
    the size check is off already or the settings cannot be read."""
    try:
        budget = _byte_string(str(spark.conf.get(MAX_BYTES)))
        rows = int(spark.conf.get(MAX_RECORDS))
    except Exception:  # Spark Connect without the setting, an odd value
        return None
    if budget is None or budget <= 0 or budget >= NO_SIZE_CHECK:
        return None
    return budget, max(rows, 0)


def handover_rows(spark: Any, row_bytes: int) -> int | None:
    """Rows per Arrow batch for rows of at most ``row_bytes`` bytes, so that a batch stays
    within the session's ``maxBytesPerBatch`` and ``maxRecordsPerBatch``; ``None`` when
    Spark's own batching is better (fewer than :data:`MIN_HANDOVER_ROWS` rows)."""
    found = handover_budget(spark)
    if found is None:
        return None
    budget, limit = found
    rows = budget // max(row_bytes, 1)
    if limit:
        rows = min(rows, limit)
    return rows if rows >= MIN_HANDOVER_ROWS else None


@contextlib.contextmanager
def session_settings(spark: Any, settings: dict[str, str]) -> Iterator[None]:
    """Within the block, ``spark``'s runtime SQL settings ``settings``; the session's own
    values are restored after (unset where they were unset).

    A job another thread starts on the same session meanwhile gets them too. The sink sets
    only settings that change no result: Arrow batch sizes, and adaptive execution for a job
    whose one exchange is the sink's. (A ``foreachBatch`` function runs on the streaming
    query's own session.)
    """
    if not settings:
        yield
        return
    before = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def arrow_settings(rows: int) -> dict[str, str]:
    """Settings under which jobs hand Arrow batches of ``rows`` rows to Python tasks without
    Spark's per-row size check (for :func:`session_settings`: batch sizes only, no change
    of results)."""
    return {MAX_RECORDS: str(rows), MAX_BYTES: str(NO_SIZE_CHECK)}
