"""Whether a batch's slot job may run without adaptive query execution.

With AQE on (Spark's default, in ``foreachBatch`` too), the slot job runs its shuffle's map
stage as a job of its own, re-plans, then runs the slots: a 100-record batch of
``KafkaSink`` took 169 ms with AQE and 119 ms without. The sink's one exchange has a fixed
partition count, so AQE has nothing to change in it. When the input itself needs no
exchange (its plan holds only :data:`NARROW_NODES`: scans, projections, filters, a
``foreachBatch`` batch; :func:`narrow_plan`),
:meth:`~connectors.spark.frames.SparkBatch.slotted` marks the batch and its slot job runs
with ``spark.sql.adaptive.enabled=false`` (:data:`ADAPTIVE`), set on the session for the
job only (:func:`~connectors.spark._handover.session_settings`). An input with a join, an
aggregation, a sort or its own repartitioning keeps AQE, which may well improve those.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["ADAPTIVE", "NARROW_NODES", "narrow_plan"]

logger = logging.getLogger(__name__)

ADAPTIVE = "spark.sql.adaptive.enabled"
#: Logical plan nodes (``nodeName``, analyzed plan) that need no exchange of their own. An
#: input made of these only leaves the sink's placement as the slot job's one exchange.
NARROW_NODES = frozenset({
    "Project", "Filter", "Range", "LocalRelation", "LogicalRDD", "LogicalRelation",
    "DataSourceV2Relation", "HiveTableRelation", "InMemoryRelation", "SubqueryAlias",
    "View", "ResolvedHint", "Generate", "Sample", "Union", "LocalLimit",
    "SerializeFromObject", "DeserializeToObject", "MapElements", "MapPartitions",
    "MapInArrow", "MapInPandas", "PythonMapInArrow", "BatchEvalPython", "ArrowEvalPython",
})
#: Larger plans are not walked (each node is a few py4j calls): they keep AQE.
_MAX_PLAN_NODES = 200


def narrow_plan(df: Any) -> bool:
    """Whether ``df``'s analyzed plan holds only :data:`NARROW_NODES` (no join,
    aggregation, window, sort, limit or repartitioning). ``False`` when the plan cannot be
    read (Spark Connect) or is large."""
    try:
        stack = [df._jdf.queryExecution().analyzed()]
        seen = 0
        while stack:
            node = stack.pop()
            seen += 1
            if seen > _MAX_PLAN_NODES or str(node.nodeName()) not in NARROW_NODES:
                return False
            children = node.children()
            stack.extend(children.apply(i) for i in range(children.size()))
        return True
    except Exception:
        return False
