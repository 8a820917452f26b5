"""The IcebergSink's write: the batch as one Iceberg snapshot tagged with the sink's batch.

Through Spark's public DataFrameWriterV2 on the catalog table: ``append()``;
``overwritePartitions()`` (``partition_overwrite_mode="dynamic"``: the partitions the batch
holds are replaced); ``overwrite(condition)`` (``replace_where``, or ``true``: the whole
table). Each carries the tag as ``snapshot-property.connectors.*`` write options
(:mod:`connectors.iceberg._tag`), so the tag and the rows land in one atomic commit.

With ``merge_on`` the batch is a change stream: one SQL ``MERGE INTO`` from the batch
(one row per key, :mod:`connectors.lake.changes`) as a temporary view; a MERGE takes no
write options, so the tag goes in as Iceberg's ``spark.sql.iceberg.snapshot-property.*``
session confs, set around that one statement (:func:`connectors.lake.commit_confs.
commit_confs`) and landing in the same atomic commit.

A NULL in a column the table declares required fails Spark's write job
(``NOT_NULL_ASSERT_VIOLATION``) before anything is committed; :func:`translate` turns it and
Iceberg's schema refusals into a :class:`~connectors.core.errors.BadInputError` naming the
column and the fix, never quoting a row.
"""

from __future__ import annotations

import itertools
import os
import re
import time
from typing import TYPE_CHECKING, Literal

from connectors.core.errors import BadInputError
from connectors.iceberg._tag import SnapshotTag
from connectors.lake.changes import ChangeSpec, clauses, merge_sql, on_keys
from connectors.lake.commit_confs import commit_confs
from connectors.spark.toolkit import error_facts

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["IcebergWriter", "Mode", "translate"]

Mode = Literal["append", "overwrite"]

_views = itertools.count()

#: Spark's conditions for a batch whose columns do not fit the table (names and types only:
#: their messages quote no row)
_SCHEMA_CONDITIONS = ("INCOMPATIBLE_DATA_FOR_TABLE", "INSERT_COLUMN_ARITY_MISMATCH")

_NOT_NULL = re.compile(r"NOT_NULL_ASSERT_VIOLATION.*?non-nullable field:\s*([^\s.]+)", re.S)


class IcebergWriter:
    """One batch's write into ``table`` (a catalog table name), in the sink's mode."""

    def __init__(self, table: str, sink_id: str, *, mode: Mode,
                 partition_overwrite_mode: str | None, replace_where: str | None,
                 changes: ChangeSpec | None = None) -> None:
        self.table = table
        self.sink_id = sink_id
        self.mode = mode
        self.dynamic = partition_overwrite_mode == "dynamic"
        self.replace_where = replace_where
        self.changes = changes if changes is not None and changes.merges else None

    def write(self, df: DataFrame, tag: SnapshotTag, *, streaming: bool = True) -> float:
        """Write and commit ``df`` as one snapshot carrying ``tag``; the write's duration in
        milliseconds. Raises :class:`BadInputError` for a batch the table refuses.
        ``streaming``: ``df``'s session is a streaming query's own (a MERGE's tagging confs
        need no lock there: :func:`~connectors.lake.commit_confs.commit_confs`)."""
        started = time.perf_counter()
        try:
            if self.changes is not None:
                self._merge(df, tag, streaming=streaming)
            else:
                self._write(df, tag)
        except Exception as exc:
            bad = translate(exc, self.table, sink_id=self.sink_id)
            if bad is None:
                raise
            raise bad from None
        return (time.perf_counter() - started) * 1000.0

    def _write(self, df: DataFrame, tag: SnapshotTag) -> None:
        """An append or overwrite through DataFrameWriterV2, tagged by write options."""
        from pyspark.sql import functions as F  # noqa: N812

        writer = df.writeTo(self.table).options(**tag.write_options())
        if self.mode == "append":
            writer.append()
        elif self.dynamic:
            writer.overwritePartitions()
        else:
            writer.overwrite(F.expr(self.replace_where or "true"))

    def _merge(self, df: DataFrame, tag: SnapshotTag, *, streaming: bool) -> None:
        """``MERGE INTO`` the table from the batch's one row per key, tagged by session
        confs; the temporary view is dropped afterwards."""
        assert self.changes is not None
        session = df.sparkSession
        source = self.changes.source(df)
        view = f"connectors_merge_{os.getpid()}_{next(_views)}"
        sql = merge_sql(self.table, view, on_keys(self.changes.merge_on),
                        clauses(self.changes, source.columns), schema_evolution=False)
        source.createOrReplaceTempView(view)
        try:
            with commit_confs(session, tag.session_confs(), streaming=streaming):
                session.sql(sql).collect()
        finally:
            session.catalog.dropTempView(view)


def translate(exc: BaseException, table: str, *, sink_id: str) -> BadInputError | None:
    """A :class:`BadInputError` for what the table refused of the batch's values or
    columns, or ``None`` for any other failure (kept as it is: it may be transient)."""
    text = str(exc)
    found = _NOT_NULL.search(text)
    if found:
        column = found.group(1)
        return BadInputError(
            f"column {column!r} is required (NOT NULL) in the Iceberg table {table}, and the "
            f"batch has NULL values in it: nothing was committed. Filter or fill those rows "
            f"in the query (e.g. .where('{column} IS NOT NULL')), or make the column "
            f"optional (ALTER TABLE {table} ALTER COLUMN {column} DROP NOT NULL)",
            sink_id=sink_id)
    facts = error_facts(exc)
    condition = next((c for c in facts.conditions if c.split(".")[0] in _SCHEMA_CONDITIONS),
                     None)
    if condition is not None or "INCOMPATIBLE_DATA_FOR_TABLE" in text \
            or "Cannot write incompatible data" in text \
            or "Cannot find data for the output column" in text:
        first = text.strip().splitlines()[0][:300] if text.strip() else type(exc).__name__
        params = facts.params.get(condition or "", {})
        columns = "".join(f" {label}: {params[key]}." for key, label in (
            ("tableColumns", "Table columns"), ("dataColumns", "Data columns")) if key in params)
        first = f"{first}{columns}"
        return BadInputError(
            f"the batch's columns do not fit the Iceberg table {table}: Spark says {first}. "
            "Nothing was committed. Select and cast the columns to the table's schema in the "
            "query (or evolve the table: ALTER TABLE ... ADD COLUMN)", sink_id=sink_id)
    return None
