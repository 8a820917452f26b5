"""DeltaSink's options and the checks that name their fix: the constructor's arguments
(:func:`check_options`) and a batch's columns against the table's (:func:`check_batch`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Literal

from connectors.core.errors import BadInputError, ConfigurationError
from connectors.delta._changes import MergeFunction
from connectors.lake.changes import ChangeSpec, change_spec, merge_keys, text_option
from connectors.spark.toolkit import require_spark

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["Mode", "check_batch", "check_changes", "check_options", "schema_problems"]

Mode = Literal["append", "overwrite"]


def check_options(
    sink_id: str,
    *,
    path: str | None,
    table: str | None,
    merge_on: Iterable[str] | None,
    mode: str,
    ledger_path: str | None,
    delta_txn_id: bool,
    txn_seed: bool | None,
) -> tuple[str, ...]:
    """Constructor: a usable pyspark (Delta's writer is Spark: ``require_spark``), then
    refuse options that do not fit together; return the merge keys (``()`` without
    ``merge_on``; one string is one key)."""
    require_spark("DeltaSink")
    if (path is None) == (table is None):
        raise ConfigurationError(
            "give exactly one of path (DeltaSink('/data/events', ...)) or table "
            "(DeltaSink(table='db.events', ...))",
            sink_id=sink_id,
        )
    for name, value in (("path", path), ("table", table), ("ledger_path", ledger_path)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ConfigurationError(f"{name} must be a non-empty string", sink_id=sink_id)
    keys = merge_keys(sink_id, merge_on)
    if mode not in ("append", "overwrite"):
        raise ConfigurationError(
            f"mode must be 'append' or 'overwrite', not {mode!r}", sink_id=sink_id
        )
    if txn_seed is not None and not isinstance(txn_seed, bool):
        raise ConfigurationError(
            f"txn_seed must be None (auto), True or False, not {txn_seed!r}",
            sink_id=sink_id,
        )
    if txn_seed and not delta_txn_id:
        raise ConfigurationError(
            "txn_seed=True speeds up Delta's txn id lookup, which only delta_txn_id=True "
            "writes: pass delta_txn_id=True too, or drop txn_seed",
            sink_id=sink_id,
        )
    if keys and mode != "append":
        raise ConfigurationError(
            "merge_on upserts each batch; it cannot be combined with mode='overwrite'",
            sink_id=sink_id,
        )
    return keys


def check_changes(
    sink_id: str,
    *,
    merge_on: tuple[str, ...],
    mode: str,
    merge: MergeFunction | None,
    sequence_column: str | None,
    delete_when: str | None,
    update_when: str | None,
    insert_when: str | None,
    exclude_columns: Iterable[str] | None,
    replace_where: str | None,
    partition_overwrite_mode: str | None,
    partition_by: tuple[str, ...],
) -> ChangeSpec:
    """Constructor: the MERGE and overwrite options fit together (the message names the
    fix); return the sink's :class:`ChangeSpec`."""
    text_option(sink_id, "replace_where", replace_where)
    if merge is not None and not callable(merge):
        raise ConfigurationError(
            "merge must be a function (target, source) -> DeltaMergeBuilder, e.g. "
            "merge=lambda t, s: t.alias('t').merge(s.alias('s'), 't.id = s.id')"
            ".whenMatchedUpdateAll().whenNotMatchedInsertAll()", sink_id=sink_id)
    spec = change_spec(sink_id, merge_on=merge_on, sequence_column=sequence_column,
                       delete_when=delete_when, update_when=update_when,
                       insert_when=insert_when, exclude_columns=exclude_columns, merge=merge)
    if merge is not None and mode != "append":
        raise ConfigurationError("merge= merges each batch; it cannot be combined with "
                                 f"mode={mode!r}", sink_id=sink_id)
    if partition_overwrite_mode not in (None, "static", "dynamic"):
        raise ConfigurationError(
            "partition_overwrite_mode must be 'static' or 'dynamic', not "
            f"{partition_overwrite_mode!r}", sink_id=sink_id)
    for name, value in (("replace_where", replace_where),
                        ("partition_overwrite_mode", partition_overwrite_mode)):
        if value is not None and mode != "overwrite":
            raise ConfigurationError(f"{name} applies to mode='overwrite': pass "
                                     f"mode='overwrite', or drop {name}", sink_id=sink_id)
    if replace_where is not None and partition_overwrite_mode == "dynamic":
        raise ConfigurationError(
            "replace_where and partition_overwrite_mode='dynamic' cannot be combined (Delta "
            "refuses it): replace_where replaces the rows it selects, dynamic mode the "
            "partitions the batch holds; pick one", sink_id=sink_id)
    if partition_overwrite_mode == "dynamic" and not partition_by:
        raise ConfigurationError(
            "partition_overwrite_mode='dynamic' replaces the partitions a batch holds: pass "
            "partition_by=[...] (the table's partition columns; on an unpartitioned table "
            "Delta would replace the whole table)", sink_id=sink_id)
    return spec


def schema_problems(
    batch: StructType, table: StructType, *, merge_schema: bool, merge_on: tuple[str, ...]
) -> list[str]:
    """What keeps the batch's columns from fitting the table's (empty: they fit)."""
    problems = []
    table_fields = {f.name.lower(): f for f in table.fields}
    batch_names = {f.name.lower() for f in batch.fields}
    extra = [f.name for f in batch.fields if f.name.lower() not in table_fields]
    if extra and not merge_schema:
        problems.append(f"column(s) {', '.join(extra)} are not in the table")
    for f in batch.fields:
        t = table_fields.get(f.name.lower())
        if t is not None and t.dataType.simpleString() != f.dataType.simpleString():
            problems.append(
                f"column {f.name} is {f.dataType.simpleString()} in the batch but "
                f"{t.dataType.simpleString()} in the table (cast it in the query)"
            )
    required = [f.name for f in table.fields
                if not f.nullable and f.name.lower() not in batch_names]
    if required:
        problems.append(f"NOT NULL column(s) {', '.join(required)} of the table are "
                        "missing from the batch")
    if merge_on:
        absent = [k for k in merge_on if k.lower() not in table_fields]
        if absent:
            problems.append(f"merge_on column(s) {', '.join(absent)} are not in the table")
    return problems


def check_batch(
    batch_schema: StructType,
    table_schema: StructType | None,
    *,
    refresh: Callable[[], StructType | None],
    location: Callable[[], str],
    merge_schema: bool,
    merge_on: tuple[str, ...],
    sink_id: str,
) -> None:
    """Driver, before a fresh write: raise :class:`BadInputError` naming the columns that do
    not fit ``table_schema`` (``None``: no table yet) once ``refresh()`` (the table read
    again) confirms them, or the merge keys the batch lacks."""
    if table_schema is not None:
        problems = schema_problems(batch_schema, table_schema,
                                   merge_schema=merge_schema, merge_on=merge_on)
        if problems:
            table_schema = refresh()
            problems = schema_problems(
                batch_schema, table_schema, merge_schema=merge_schema, merge_on=merge_on
            ) if table_schema else []
        if problems:
            raise BadInputError(
                f"the batch does not fit the Delta table at {location()}: "
                + "; ".join(problems)
                + ". Fix the query's columns"
                + ("" if merge_schema else ", or pass merge_schema=True to add new "
                   "columns to the table"),
                sink_id=sink_id,
            )
    names = [*batch_schema.fieldNames(), *(table_schema.fieldNames() if table_schema else [])]
    ticked = list(dict.fromkeys(n for n in names if "`" in n)) if merge_on else []
    if ticked:  # Delta 4.4 quotes names without escaping in UPDATE SET * / INSERT *
        raise BadInputError(
            f"column(s) {', '.join(map(repr, ticked))} of the batch or the table hold a "
            "backtick, which Delta's MERGE "
            "cannot handle (its UPDATE SET * / INSERT * fail with "
            "INVALID_ATTRIBUTE_NAME_SYNTAX): rename them in the query (e.g. "
            "df.withColumnRenamed), or append without merge_on",
            sink_id=sink_id,
        )
    missing_keys = [k for k in merge_on if k not in batch_schema.fieldNames()]
    if missing_keys:
        raise BadInputError(
            f"merge_on column(s) {', '.join(missing_keys)} are not in the batch (its "
            f"columns: {', '.join(batch_schema.fieldNames())}): select them, or change "
            "merge_on",
            sink_id=sink_id,
        )
