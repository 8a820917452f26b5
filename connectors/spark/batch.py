"""Deprecated alias of the Spark adapter's modules, kept for one release.

``connectors.spark.batch`` re-exported the names of several modules; import each from the
module that defines it instead: :class:`~connectors.spark.frames.SparkBatch`,
:func:`~connectors.spark.frames.front_end` and
:func:`~connectors.spark.frames.current_query_id` from :mod:`connectors.spark.frames`;
the others from the private modules named in :data:`MOVED` (they are internals of the
adapter). Importing this module warns (``DeprecationWarning``).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

#: Every name this module re-exported -> the module that defines it.
MOVED = {
    **dict.fromkeys(["SparkBatch", "current_query_id", "front_end"], "frames"),
    **dict.fromkeys(["ADAPTIVE", "NARROW_NODES", "narrow_plan"], "_plan"),
    **dict.fromkeys(["ENV_GC_FREEZE", "ArrowFunction", "gc_freeze_enabled", "outcome_task"],
                    "_tasks"),
    **dict.fromkeys(["MAX_BYTES", "MAX_RECORDS", "MIN_HANDOVER_ROWS", "NO_SIZE_CHECK",
                     "ROW_BOUND_MARK", "Handover", "arrow_settings", "handover_budget",
                     "handover_rows", "session_settings"], "_handover"),
    **dict.fromkeys(["arrow_schema", "check_columns", "combine_fingerprint",
                     "fingerprint_aggregates", "flat_schema", "has_map", "row_hash",
                     "spark_fingerprint", "with_row_hash"], "_rows"),
}

warnings.warn("connectors.spark.batch is deprecated: import SparkBatch and front_end from "
              "connectors.spark.frames (the other names from the module that defines "
              "them); the alias goes in the next release", DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    home = MOVED.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"connectors.spark.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *MOVED})
