"""The Spark-only capabilities of a batch input, off the engine-independent
:class:`~connectors.core.batch.BatchInput`: the DataFrame behind the batch, an input
derived from it, and how its rows reach the tasks.

:class:`SparkInput` declares them with "not offered" defaults;
:class:`~connectors.spark.frames.SparkBatch` offers them, and so do the sinks' wrappers of
an input; :class:`connectors.testing.LocalBatch` offers ``spark_df`` alone (a DataFrame of
the same rows when given a session: a :class:`FrameSource`). A sink holds a ``BatchInput`` and asks
through the functions here (:func:`spark_frame`, :func:`batch_handover`,
:func:`with_frame`), which answer "not offered" for any other input: it never asks for a
concrete type.

Imports no pyspark (``connectors.testing`` uses it without Spark installed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pyarrow as pa

from connectors.core.batch import BatchInput

if TYPE_CHECKING:
    from connectors.spark._handover import Handover

__all__ = ["FrameSource", "SparkInput", "batch_handover", "spark_frame", "with_frame"]


@runtime_checkable
class FrameSource(Protocol):
    """Any batch input that holds its rows as a Spark DataFrame: every
    :class:`SparkInput`, and :class:`connectors.testing.LocalBatch` (given a session),
    which offers it without depending on the adapter (``testing`` depends on the core
    only)."""

    @property
    def spark_df(self) -> Any:
        """The Spark DataFrame behind the batch, or ``None``."""


class SparkInput(BatchInput):
    """A :class:`~connectors.core.batch.BatchInput` that may stand on a Spark DataFrame.

    An input that lacks a capability keeps its default ("not offered")."""

    @property
    def spark_df(self) -> Any:
        """The Spark DataFrame behind the batch, if there is one (``None`` otherwise)."""
        return None

    def with_frame(self, frame: Any, *, handover: Handover | None = None,
                   schema: pa.Schema | None = None,
                   rows_check: Callable[[pa.Table], None] | None = None) -> BatchInput:
        """An input of the same front end over ``frame``: a DataFrame derived from
        :attr:`spark_df` with the same rows (a check that raises on bad rows added, for
        example), or a function that builds it, called on first use: a small batch whose
        slots run locally may never need it (building a DataFrame costs Spark's analysis
        of it, a py4j round trip in classic PySpark). ``handover``: how the rows reach the
        tasks when the sink bounds them (:class:`connectors.spark._handover.Handover`);
        ``schema``: the rows' schema when the caller knows it already. ``rows_check``: the
        check ``frame`` adds, over rows of :attr:`spark_df` the engine collected (the
        engine's row hash possibly their last column); it raises for a bad row. An engine
        that runs a small batch's slots locally (``local_rows``) may then collect
        :attr:`spark_df` instead of ``frame`` and run it before any slot. Offered by every
        input with a :attr:`spark_df`."""
        raise NotImplementedError(f"{type(self).__name__} has no DataFrame to derive from")

    @property
    def handover(self) -> Handover | None:
        """How the rows reach the tasks when the sink bounds them (``None``: the engine's
        own batching, or no engine)."""
        return None


def spark_frame(batch: BatchInput) -> Any:
    """The Spark DataFrame behind ``batch``; ``None`` when it has none (no
    :class:`FrameSource`, or one without a DataFrame)."""
    return batch.spark_df if isinstance(batch, FrameSource) else None


def batch_handover(batch: BatchInput) -> Handover | None:
    """How ``batch``'s rows reach the tasks when the sink bounds them; ``None``: the
    engine's own batching (or not a :class:`SparkInput`)."""
    return batch.handover if isinstance(batch, SparkInput) else None


def with_frame(batch: BatchInput, frame: Any, *, handover: Handover | None = None,
               schema: pa.Schema | None = None,
               rows_check: Callable[[pa.Table], None] | None = None) -> BatchInput:
    """:meth:`SparkInput.with_frame` of ``batch``; ``NotImplementedError`` (as for an input
    without a DataFrame) when ``batch`` is no :class:`SparkInput`."""
    if not isinstance(batch, SparkInput):
        raise NotImplementedError(
            f"{type(batch).__name__} is not a Spark input (connectors.spark.inputs."
            "SparkInput): it has no DataFrame to derive from")
    return batch.with_frame(frame, handover=handover, schema=schema, rows_check=rows_check)
