"""A change stream (inserts, updates, deletes) reduced to the last change of each key: the
database-independent part of ``mode="changes"`` (PostgresSink, MariaDBSink); each sink
applies the result with its own SQL.

Each row of a batch is one change carrying the full row image (Debezium's "after"), an
operation (``op_column``) and a sequence value (``sequence_column``). The sink routes every
key to one task; there, per key, the changes are ordered by the sequence value, ties broken
by the other columns in the batch's order and then by the operation (the greatest row wins,
as the upsert dedup; a delete beats an upsert), and only the last one is applied
(:func:`latest_changes`): a delete of the key (a key the table does not hold is fine), or
an upsert of the full row. Applying the batch's changes one by one in that order would
leave the same table.

Operations (:func:`deleted_flags`): a string column holds Debezium's codes ``c``, ``r``,
``u`` (upsert) and ``d`` (delete) or the words ``insert``, ``update``, ``upsert`` and
``delete``, matched without regard to case; a boolean column is a "deleted" flag (true:
delete). Anything else, ``NULL`` included, is a :class:`BadInputError` and the batch
commits nothing.

Driver side: :func:`check_change_options` (the sink's options), :func:`check_change_input`
(the batch has both columns, of types :func:`stage` can read) and :func:`written_schema`
(the op column is written only when the table has a column of that name, the sequence
column likewise).

Example::

    >>> import pyarrow as pa
    >>> class Opts:
    ...     op_column, sequence_column = "op", "seq"
    >>> raw = pa.RecordBatch.from_pydict({"id": [1, 1, 2], "op": ["c", "u", "d"],
    ...                                   "seq": [1, 2, 3], "v": ["a", "b", None]})
    >>> upserts, deletes = latest_changes([stage(raw, raw.select(["id", "v"]), Opts())],
    ...                                   ["id"], ["id", "v"])
    >>> upserts.to_pylist(), deletes.to_pylist()
    ([{'id': 1, 'v': 'b'}], [{'id': 2}])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from connectors.core.errors import BadInputError, ConfigurationError
from connectors.core.keyed import sortable

__all__ = [
    "DELETED",
    "DELETE_OPS",
    "SEQ",
    "UPSERT_OPS",
    "ChangeColumns",
    "check_change_input",
    "check_change_options",
    "deleted_flags",
    "latest_changes",
    "stage",
    "written_schema",
]

#: Operation values that upsert the row image (compared in lower case).
UPSERT_OPS = ("c", "r", "u", "insert", "update", "upsert")
#: Operation values that delete the key (compared in lower case).
DELETE_OPS = ("d", "delete")
_ALLOWED = (f"{', '.join(map(repr, UPSERT_OPS + DELETE_OPS))} (any case) for a string "
            "column, true (deleted) / false for a boolean column; never NULL")

#: The staged columns a task adds to each batch. A NUL character cannot be in a column of
#: the batch (refused on the driver), so these never collide with one.
SEQ = "\x00eos_seq"
DELETED = "\x00eos_deleted"
_ROW = "\x00eos_row"


class ChangeColumns(Protocol):
    """What this module reads of a sink's options (both set with ``mode="changes"``)."""

    @property
    def op_column(self) -> str | None: ...

    @property
    def sequence_column(self) -> str | None: ...


def _plain(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def _is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t)
                or pa.types.is_string_view(t))


def _orderable(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_decimal(t) or pa.types.is_timestamp(t)
                or pa.types.is_date(t) or pa.types.is_time(t) or _is_text(t))


def _columns(options: ChangeColumns) -> tuple[str, str]:
    op, seq = options.op_column, options.sequence_column
    assert op is not None and seq is not None  # the options check mode="changes"
    return op, seq


# ---- driver side ----------------------------------------------------------------------

def check_change_options(mode: str, key_columns: Sequence[str], op_column: str | None,
                         sequence_column: str | None,
                         check_name: Callable[[object, str], str]) -> None:
    """``op_column`` and ``sequence_column``: both with ``mode="changes"`` (two names,
    neither a key column, each accepted by the database's ``check_name(name, what)``),
    else none."""
    given = [n for n, v in (("op_column", op_column),
                            ("sequence_column", sequence_column)) if v is not None]
    if mode != "changes":
        if given:
            raise ConfigurationError(
                f"{' and '.join(given)} only apply to mode='changes' (a change stream "
                "of inserts, updates and deletes): pass mode='changes', or drop them")
        return
    if len(given) < 2:
        raise ConfigurationError(
            "mode='changes' needs op_column (the column of each change's operation: "
            "'c'/'r'/'u'/'d' or a boolean deleted flag) and sequence_column (the "
            "column that orders the changes of a key), e.g. op_column='op', "
            "sequence_column='seq'")
    op = check_name(op_column, "op_column")
    seq = check_name(sequence_column, "sequence_column")
    if op == seq:
        raise ConfigurationError(
            f"op_column and sequence_column are both {op!r}: name two columns")
    for name, what in ((op, "op_column"), (seq, "sequence_column")):
        if name in key_columns:
            raise ConfigurationError(
                f"{what} {name!r} is one of key_columns: the key names the row a "
                "change applies to, so it cannot be the operation or the sequence; "
                "choose other columns")


def check_change_input(schema: pa.Schema, options: ChangeColumns, table: str) -> None:
    """The batch has the op and sequence columns, of types the tasks can read."""
    op, seq = _columns(options)
    missing = [name for name in (op, seq) if name not in schema.names]
    if missing:
        raise BadInputError(
            f"mode='changes' into {table}: column(s) {', '.join(map(repr, missing))} "
            f"(op_column / sequence_column) are not in the batch (its columns: "
            f"{', '.join(map(repr, schema.names))}); names are matched exactly")
    op_type = _plain(schema.field(op).type)
    if not (_is_text(op_type) or pa.types.is_boolean(op_type)):
        raise BadInputError(
            f"op_column {op!r} is {op_type}: it must be a string column (Debezium's op "
            "codes c/r/u/d) or a boolean column (true = deleted); cast it in the DataFrame")
    seq_type = _plain(schema.field(seq).type)
    if not _orderable(seq_type):
        raise BadInputError(
            f"sequence_column {seq!r} is {seq_type}: it must be an integer, decimal, "
            "timestamp, date, time or string column (floating point is refused: NaN has no "
            "order); cast it in the DataFrame, e.g. to a long")


def written_schema(schema: pa.Schema, options: ChangeColumns,
                   table_columns: Sequence[str] | None) -> pa.Schema:
    """The batch's columns that go into the table: all but the op and sequence columns,
    each of which is written only when the table has a column of its name.
    ``table_columns`` ``None``: the table is about to be created (with the sequence
    column and without the op column)."""
    if table_columns is None:
        drop = {options.op_column}
    else:
        have = set(table_columns)
        drop = {c for c in (options.op_column, options.sequence_column) if c not in have}
    return pa.schema([f for f in schema if f.name not in drop])


# ---- task side: staging each record batch ----------------------------------------------

def deleted_flags(op: pa.Array | pa.ChunkedArray, column: str, *,
                  values_in_errors: bool = False, **ids: Any) -> pa.Array:
    """``op`` as booleans, true for a delete; a :class:`BadInputError` naming ``column``
    and the allowed values for any other value (quoted only with ``values_in_errors``)."""
    if isinstance(op, pa.ChunkedArray):
        op = op.combine_chunks()
    if pa.types.is_dictionary(op.type):
        op = op.dictionary_decode()
    if pa.types.is_boolean(op.type):
        flags, bad = op, pc.is_null(op)
    else:
        lower = pc.utf8_lower(op.cast(pa.large_string()))
        flags = pc.is_in(lower, value_set=pa.array(DELETE_OPS, pa.large_string()))
        known = pc.or_(flags, pc.is_in(lower, value_set=pa.array(UPSERT_OPS,
                                                                  pa.large_string())))
        bad = pc.invert(pc.fill_null(known, False))
    count = pc.sum(pc.cast(bad, pa.int64())).as_py() or 0
    if count:
        shown = ""
        if values_in_errors:
            values = pc.unique(op.filter(bad)).to_pylist()[:5]
            shown = f" (values: {', '.join(map(repr, values))})"
        raise BadInputError(
            f"op_column {column!r} holds {count} value(s) that are not an operation"
            f"{shown}: allowed are {_ALLOWED}", **ids)
    return pc.fill_null(flags, False)


def stage(raw: pa.RecordBatch, written: pa.RecordBatch, options: ChangeColumns, *,
          values_in_errors: bool = False, **ids: Any) -> pa.RecordBatch:
    """``written`` (the batch's written columns, as the sink writes them) plus the staged
    sequence value and delete flag of each row, from ``raw``; bad input raises."""
    op, seq = _columns(options)
    sequence = raw.column(seq)
    if pa.types.is_dictionary(sequence.type):
        sequence = sequence.dictionary_decode()
    if pa.types.is_string_view(sequence.type):  # sorted as large_string
        sequence = sequence.cast(pa.large_string())
    if sequence.null_count:
        raise BadInputError(
            f"sequence_column {seq!r} is NULL in {sequence.null_count} row(s): every "
            "change needs a sequence value to be ordered by", **ids)
    flags = deleted_flags(raw.column(op), op, values_in_errors=values_in_errors, **ids)
    return pa.RecordBatch.from_arrays(
        [*written.columns, sequence, flags],
        names=[*written.schema.names, SEQ, DELETED])


# ---- task side: the last change of each key --------------------------------------------

def latest_changes(staged: Sequence[pa.RecordBatch], keys: Sequence[str],
                   columns: Sequence[str], tie_break: Sequence[str] | None = None,
                   ) -> tuple[pa.Table, pa.Table]:
    """``(upserts, deletes)``: the last change of each key, by sequence value, ties broken
    by ``tie_break`` (default ``columns``) then the delete flag (the greatest wins: a
    delete beats an upsert); upserts with ``columns``, deletes with ``keys`` only, each in
    sequence order."""
    table = pa.Table.from_batches(list(staged))
    order = [(SEQ, "ascending"), *((c, "ascending") for c in (tie_break or columns)),
             (DELETED, "ascending")]
    table = table.take(pc.sort_indices(sortable(table), sort_keys=order))
    table = table.append_column(_ROW, pa.array(range(table.num_rows), pa.int64()))
    last = table.group_by(list(keys), use_threads=False).aggregate([(_ROW, "max")])
    rows = last[f"{_ROW}_max"]
    table = table.take(rows.take(pc.sort_indices(rows)))  # in sequence order
    deleted = table.column(DELETED)
    upserts = table.filter(pc.invert(deleted)).select(list(columns))
    deletes = table.filter(deleted).select(list(keys))
    return upserts, deletes
