"""A change stream applied to a table by SQL MERGE: what DeltaSink's and IcebergSink's
``merge_on`` options do with each batch (the format's writer runs the statement).

:class:`ChangeSpec` holds a sink's MERGE options (``merge_on``, ``sequence_column``,
``delete_when``, ``update_when``, ``insert_when``, ``exclude_columns``; DeltaSink also its
``merge`` function) and turns one batch into the MERGE:

- the source: one row per key (:func:`dedupe_by_key`): the greatest ``sequence_column``
  wins, ties (and every key without a sequence) broken by the greatest row by value;
- the clauses (:func:`clauses`), in MERGE's order (the first clause whose condition holds
  acts): ``WHEN MATCHED AND (delete_when) THEN DELETE``, ``WHEN MATCHED [AND
  (update_when)] THEN UPDATE``, ``WHEN NOT MATCHED AND NOT coalesce((delete_when), false)
  [AND (insert_when)] THEN INSERT``: a winning delete of a key the table lacks inserts
  nothing. Without ``exclude_columns`` the update and insert are ``UPDATE SET *`` /
  ``INSERT *``; with it, every column of the batch but those, by name;
- the statement (:func:`merge_sql`) over the source as a temporary view ``s`` and the table
  ``t``, matched on every key NULL-safely (:func:`on_keys`).

:func:`change_spec` checks the options when the sink is built (each refusal names the fix);
:meth:`ChangeSpec.validate` checks the conditions against the batch and the table before the
sink's intent is recorded (a Spark analysis, no job), so a condition naming a missing column
fails the batch with a :class:`~connectors.core.errors.BadInputError` and commits nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from connectors.core.errors import BadInputError, ConfigurationError
from connectors.spark.toolkit import error_facts, has_map, quoted

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

__all__ = ["ChangeSpec", "Clause", "change_spec", "clauses", "dedupe_by_key", "merge_keys",
           "merge_sql", "on_keys", "text_option"]

_RANK = "__connectors_rank"


def dedupe_by_key(df: DataFrame, keys: Sequence[str], sequence: str | None = None) -> DataFrame:
    """One row per key, chosen deterministically: the greatest ``sequence`` wins (NULLs
    lowest); ties, and every key without ``sequence``, go to the greatest row by value.

    Rows are ranked within each key by the sequence, then every other column, descending,
    NULLs last (columns holding maps, which Spark cannot order, by their JSON form); two
    rows that tie on every column are identical, so whichever is kept, the result is the
    same. MERGE then never sees two source rows for one target row.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F  # noqa: N812

    order = [F.col(quoted(sequence)).desc_nulls_last()] if sequence else []
    for f in df.schema.fields:
        if f.name in keys or f.name == sequence:
            continue
        col = F.col(quoted(f.name))
        order.append((F.to_json(F.struct(col)) if has_map(f.dataType) else col).desc_nulls_last())
    if not order:
        return df.dropDuplicates(list(keys))
    window = Window.partitionBy(*[F.col(quoted(k)) for k in keys]).orderBy(*order)
    rank = _RANK
    while rank.lower() in {c.lower() for c in df.columns}:  # never a column of the batch
        rank += "_"
    return df.withColumn(rank, F.row_number().over(window)).where(F.col(rank) == 1).drop(rank)


@dataclass(frozen=True)
class Clause:
    """One clause of the MERGE: ``kind`` is ``delete``, ``update`` or ``insert``;
    ``columns`` ``None`` means ``*`` (every column of the source)."""

    kind: str
    condition: str | None
    columns: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ChangeSpec:
    """A sink's MERGE options (see the module docstring); ``merges`` is false for a sink
    that appends or overwrites."""

    merge_on: tuple[str, ...] = ()
    sequence_column: str | None = None
    delete_when: str | None = None
    update_when: str | None = None
    insert_when: str | None = None
    exclude_columns: tuple[str, ...] = ()
    #: a format's own MERGE function (DeltaSink's ``merge=``), run by that format's writer
    merge: Callable[..., Any] | None = None

    @property
    def merges(self) -> bool:
        return bool(self.merge_on) or self.merge is not None

    def source(self, df: DataFrame) -> DataFrame:
        """The MERGE's source: the batch with one row per key (the batch as it is for a
        ``merge`` function without ``merge_on``)."""
        return dedupe_by_key(df, self.merge_on, self.sequence_column) if self.merge_on else df

    def stored(self, names: Sequence[str]) -> list[str]:
        """The batch's columns the table gets: all but ``exclude_columns``."""
        excluded = {c.lower() for c in self.exclude_columns}
        return [n for n in names if n.lower() not in excluded]

    def table_df(self, df: DataFrame) -> DataFrame:
        """The batch as the table sees it (its schema checked, the table created from it)."""
        return df.select(*[quoted(n) for n in self.stored(df.columns)]) \
            if self.exclude_columns else df

    def check_batch(self, schema: StructType, *, sink_id: str) -> None:
        """The columns the options name are in the batch (a :class:`BadInputError` names
        the missing ones)."""
        names = {n.lower() for n in schema.fieldNames()}
        for option, cols in (("sequence_column", [self.sequence_column] if
                              self.sequence_column else []),
                             ("exclude_columns", list(self.exclude_columns))):
            missing = [c for c in cols if c.lower() not in names]
            if missing:
                raise BadInputError(
                    f"{option} column(s) {', '.join(missing)} are not in the batch (its "
                    f"columns: {', '.join(schema.fieldNames())}): select them, or change "
                    f"{option}", sink_id=sink_id)

    def validate(self, df: DataFrame, table: StructType | None, *, sink_id: str) -> None:
        """Driver, before a fresh write (before the intent): the columns the options name
        are in the batch, and every condition resolves over the batch and the table
        (``table``: its schema; ``None``: the table the batch creates)."""
        self.check_batch(df.schema, sink_id=sink_id)
        if self.delete_when or self.update_when or self.insert_when:
            session = df.sparkSession
            target = session.createDataFrame([], table if table is not None else
                                             self.table_df(df).schema)
            self.check_conditions(df, target, sink_id=sink_id)

    def check_conditions(self, source: DataFrame, target: DataFrame, *, sink_id: str) -> None:
        """Analyse each condition where it will run (no Spark job): ``delete_when`` and
        ``insert_when`` over the source ``s`` alone (``delete_when`` also keeps a delete
        of an unknown key from being inserted, where no target row exists),
        ``update_when`` over ``s`` and ``t``. A condition Spark cannot resolve raises
        :class:`BadInputError` naming the option and the column."""
        from pyspark.sql import functions as F  # noqa: N812

        s = source.alias("s")
        on = " AND ".join(f"t.{quoted(k)} <=> s.{quoted(k)}" for k in self.merge_on)
        both = s.join(target.alias("t"), F.expr(on), "left") if on else s.crossJoin(
            target.alias("t"))
        for option, text, over in (("delete_when", self.delete_when, s),
                                   ("update_when", self.update_when, both),
                                   ("insert_when", self.insert_when, s)):
            if text is None:
                continue
            try:
                over.where(F.expr(text)).schema  # noqa: B018 - analysis only
            except Exception as exc:
                facts = error_facts(exc)
                if not facts.conditions:
                    raise
                condition = facts.conditions[0]
                column = facts.params.get(condition, {}).get("objectName", "")
                scope = "the source s only" if over is s else "the source s and the target t"
                raise BadInputError(
                    f"{option}={text!r} cannot be evaluated over {scope}: Spark says "
                    f"[{condition}]{f' ({column})' if column else ''}. Fix the condition "
                    "or select the column in the query (a control column the table must "
                    "not store: add it to exclude_columns)",
                    sink_id=sink_id) from None


def clauses(spec: ChangeSpec, columns: Sequence[str]) -> list[Clause]:
    """The condition form's clauses, in order, for a batch with ``columns``."""
    stored = tuple(spec.stored(columns)) if spec.exclude_columns else None
    out: list[Clause] = []
    if spec.delete_when is not None:
        out.append(Clause("delete", spec.delete_when))
    out.append(Clause("update", spec.update_when, stored))
    inserts = []
    if spec.delete_when is not None:
        inserts.append(f"NOT coalesce(({spec.delete_when}), false)")
    if spec.insert_when is not None:
        inserts.append(f"({spec.insert_when})")
    out.append(Clause("insert", " AND ".join(inserts) or None, stored))
    return out


def on_keys(keys: Sequence[str]) -> str:
    """The MERGE's match condition: every key NULL-safely equal."""
    return " AND ".join(f"t.{quoted(k)} <=> s.{quoted(k)}" for k in keys)


def merge_sql(table: str, view: str, on: str, parts: Sequence[Clause], *,
              schema_evolution: bool) -> str:
    """The MERGE of the source view ``view`` (``s``) into ``table`` (``t``) on ``on``, as SQL
    (a catalog table name, or Delta's ``delta.`path```)."""
    sql = [f"MERGE{' WITH SCHEMA EVOLUTION' if schema_evolution else ''} INTO {table} t "
           f"USING `{view}` s ON {on}"]
    for c in parts:
        cond = f" AND ({c.condition})" if c.condition else ""
        if c.kind == "delete":
            sql.append(f"WHEN MATCHED{cond} THEN DELETE")
        elif c.kind == "update":
            sets = "*" if c.columns is None else ", ".join(
                f"{quoted(n)} = s.{quoted(n)}" for n in c.columns)
            sql.append(f"WHEN MATCHED{cond} THEN UPDATE SET {sets}")
        elif c.columns is None:
            sql.append(f"WHEN NOT MATCHED{cond} THEN INSERT *")
        else:
            names = ", ".join(quoted(n) for n in c.columns)
            values = ", ".join(f"s.{quoted(n)}" for n in c.columns)
            sql.append(f"WHEN NOT MATCHED{cond} THEN INSERT ({names}) VALUES ({values})")  # noqa: S608
    return " ".join(sql)


def merge_keys(sink_id: str, merge_on: Iterable[str] | str | None) -> tuple[str, ...]:
    """Constructor: ``merge_on`` as a tuple of key columns (``()`` without it; one string
    is one key), or a :class:`ConfigurationError` naming the fix."""
    if isinstance(merge_on, str):
        merge_on = [merge_on]
    keys = tuple(merge_on) if merge_on is not None else ()
    if merge_on is not None and (not keys or not all(isinstance(k, str) and k for k in keys)):
        raise ConfigurationError(
            "merge_on must be a non-empty list of column names, e.g. merge_on=['user_id']",
            sink_id=sink_id,
        )
    if len(set(keys)) != len(keys):
        raise ConfigurationError(f"merge_on repeats a column: {list(keys)}", sink_id=sink_id)
    return keys


def text_option(sink_id: str, name: str, value: object) -> str | None:
    """Constructor: ``value`` (a SQL expression or a column name) as given, ``None`` when
    not given; an empty or non-string one is a :class:`ConfigurationError`."""
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ConfigurationError(f"{name} must be a non-empty string (a SQL expression or a "
                                 f"column name), not {value!r}", sink_id=sink_id)
    return value


def change_spec(
    sink_id: str,
    *,
    merge_on: tuple[str, ...],
    sequence_column: str | None,
    delete_when: str | None,
    update_when: str | None,
    insert_when: str | None,
    exclude_columns: Iterable[str] | str | None,
    merge: Callable[..., Any] | None = None,
) -> ChangeSpec:
    """Constructor: the MERGE options fit together (each refusal names the fix); the sink's
    :class:`ChangeSpec`. ``merge``: a format's MERGE function (checked by that format)."""
    seq = text_option(sink_id, "sequence_column", sequence_column)
    conditions = {name: text_option(sink_id, name, value) for name, value in (
        ("delete_when", delete_when), ("update_when", update_when),
        ("insert_when", insert_when))}
    given = [name for name, value in conditions.items() if value is not None]
    if isinstance(exclude_columns, str):
        exclude_columns = [exclude_columns]
    excluded = tuple(exclude_columns or ())
    if not all(isinstance(c, str) and c for c in excluded):
        raise ConfigurationError("exclude_columns must be a list of column names, e.g. "
                                 "exclude_columns=['op']", sink_id=sink_id)
    if len({c.lower() for c in excluded}) != len(excluded):
        raise ConfigurationError(f"exclude_columns repeats a column: {list(excluded)}",
                                 sink_id=sink_id)
    merges = bool(merge_on) or merge is not None
    if merge is not None and given:
        raise ConfigurationError(
            f"{', '.join(given)} belong(s) to the condition form (merge_on=[...]); with "
            "merge= write the conditions into the function's when...() clauses",
            sink_id=sink_id)
    if (given or seq) and not merge_on:
        raise ConfigurationError(
            f"{', '.join([*(['sequence_column'] if seq else []), *given])} need(s) "
            "merge_on=[...] (the key columns the changes are applied on)", sink_id=sink_id)
    if seq and seq.lower() in {k.lower() for k in merge_on}:
        raise ConfigurationError(f"sequence_column {seq!r} is a merge_on key: name the "
                                 "column that orders a key's changes", sink_id=sink_id)
    if excluded and not merges:
        raise ConfigurationError(
            "exclude_columns applies to a MERGE (merge_on or merge=); for an append or "
            "overwrite select the columns in the query instead", sink_id=sink_id)
    kept = [c for c in excluded if c.lower() in {k.lower() for k in merge_on}]
    if kept:
        raise ConfigurationError(f"exclude_columns names merge_on key(s) {kept}: the table "
                                 "must store its keys", sink_id=sink_id)
    return ChangeSpec(merge_on, seq, conditions["delete_when"], conditions["update_when"],
                      conditions["insert_when"], excluded, merge)
