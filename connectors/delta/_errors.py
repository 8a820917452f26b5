"""Delta/Spark errors translated, in one table, into the library's own.

An error is classified by what Spark and Delta say it is, never by its message text:

- its *error condition*: ``PySparkException.getCondition()`` for errors PySpark converted,
  ``SparkThrowable.getCondition()`` on every Java throwable of the cause chain of a
  ``Py4JJavaError`` (a failed task's ``DeltaInvariantViolationException`` sits below the
  ``SparkException`` that aborted the job). A sub-condition ``A.B`` matches a rule for ``A``.
- its *exception class*: the Java class of every throwable of the chain and their
  superclasses (Delta's ``io.delta.exceptions.DeltaConcurrentModificationException``, the
  base of every concurrent-commit conflict).

Row values: Delta's messages may quote a row (``DELTA_VIOLATE_CONSTRAINT_WITH_VALUES``:
"violated by row with values: - amount : -5"), and so may Spark's (a failed cast quotes
the value). By default (``values_in_errors=False``) the library's error names the
condition and only the message parameters listed as value-free for it (column, constraint,
table), and neither quotes Delta's message nor chains the original exception, whose text
would appear in a traceback. With ``values_in_errors=True`` Delta's message is quoted and the
original is the ``__cause__``. An error no rule covers is, by default, a
:class:`~connectors.core.errors.ConnectorError` naming its condition and Java classes; with
``values_in_errors=True`` it passes through unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from connectors.core.errors import BadInputError, ConnectorError, TransientError
from connectors.spark.toolkit import ErrorFacts, error_facts

__all__ = ["ErrorFacts", "error_facts", "translate"]

_MAX_MESSAGE = 1000


@dataclass(frozen=True)
class _Rule:
    conditions: tuple[str, ...]
    classes: tuple[str, ...]
    error: type[ConnectorError]
    explanation: str
    #: message parameters that never hold a row's values: shown by default
    params: tuple[str, ...] = ()


_CONCURRENT_CLASSES = (
    "io.delta.exceptions.DeltaConcurrentModificationException",
    "org.apache.spark.sql.delta.DeltaConcurrentModificationException",
    "java.util.ConcurrentModificationException",
)

# Order matters: the first rule that any condition or class of the chain fits wins.
_TABLE: tuple[_Rule, ...] = (
    _Rule(
        ("DELTA_REPLACE_WHERE_MISMATCH",),
        (),
        BadInputError,
        "a row of the batch is outside the sink's replace_where, which Delta refuses: "
        "filter the batch to the rows replace_where selects, or widen "
        "DeltaSink(replace_where=...)",
        ("replaceWhere",),
    ),
    _Rule(
        ("DELTA_MERGE_UNRESOLVED_EXPRESSION", "UNRESOLVED_COLUMN"),
        (),
        BadInputError,
        "an expression names a column that neither the batch (s) nor the table (t) has "
        "(the sink's replace_where, delete_when, update_when, insert_when, or a clause of "
        "the merge function): fix the expression, or select the column in the query",
        ("objectName", "sqlExpr", "clause"),
    ),
    _Rule(
        ("DELTA_NOT_NULL_CONSTRAINT_VIOLATED", "DELTA_MISSING_NOT_NULL_COLUMN_VALUE"),
        (),
        BadInputError,
        "a NULL value in a NOT NULL column of the table: filter or fill the NULLs of that "
        "column in the query (e.g. df.na.fill or a where clause), or drop the constraint",
        ("columnName",),
    ),
    _Rule(
        ("DELTA_VIOLATE_CONSTRAINT_WITH_VALUES",),
        (),
        BadInputError,
        "a row violates a CHECK constraint of the table: filter those rows in the query, "
        "or change the constraint",
        ("constraintName", "expression"),
    ),
    _Rule(
        ("DELTA_FAILED_TO_MERGE_FIELDS", "DELTA_METADATA_MISMATCH", "DELTA_SCHEMA_CHANGED",
         "DELTA_MERGE_INCOMPATIBLE_DATATYPE", "DELTA_MERGE_INCOMPATIBLE_DECIMAL_TYPE",
         "DELTA_COLUMN_NOT_FOUND_IN_MERGE", "_LEGACY_ERROR_TEMP_DELTA_0007"),
        (),
        BadInputError,
        "the batch's schema does not fit the table: change the query's columns or types, "
        "or pass merge_schema=True to add new columns",
        ("currentField", "updateField", "currentDataType", "updateDataType", "targetCol"),
    ),
    _Rule(
        ("DELTA_INVALID_CHARACTERS_IN_COLUMN_NAMES", "DELTA_INVALID_CHARACTERS_IN_COLUMN_NAME"),
        (),
        BadInputError,
        "a column name holds one of ' ,;{}()\\n\\t=' (a space, for one), which Delta allows "
        "only in a table with column mapping: rename the column in the query (e.g. "
        "df.withColumnRenamed), or create the table first with TBLPROPERTIES "
        "('delta.columnMapping.mode' = 'name') (docs/delta.md, \"Column names\")",
        ("invalidColumnNames", "columnName"),
    ),
    _Rule(
        ("DELTA_MISSING_DELTA_TABLE", "DELTA_PATH_DOES_NOT_EXIST", "DELTA_TABLE_NOT_FOUND",
         "PATH_NOT_FOUND", "TABLE_OR_VIEW_NOT_FOUND"),
        (),
        BadInputError,
        "the Delta table does not exist: create it, or pass create_table=True",
        ("tableName", "path", "relationName"),
    ),
    _Rule(
        ("DELTA_CONCURRENT_", "DELTA_METADATA_CHANGED", "DELTA_PROTOCOL_CHANGED"),
        _CONCURRENT_CLASSES,
        TransientError,
        "another writer committed to the table at the same time; retried (the sink "
        "settles an earlier attempt before it writes again)",
        ("operation", "tableName", "version"),
    ),
)


def _match(rule: _Rule, facts: ErrorFacts) -> str | None:
    """The condition (or class) through which ``rule`` fits, or None."""
    for condition in facts.conditions:
        for wanted in rule.conditions:
            if (condition == wanted or condition.startswith(wanted + ".")
                    or (wanted.endswith("_") and condition.startswith(wanted))):
                return condition
    for cls in rule.classes:
        if cls in facts.lineage:
            return cls
    return None


def _value_free(condition: str, names: tuple[str, ...], facts: ErrorFacts) -> str:
    params = facts.params.get(condition, {})
    shown = [f"{k}={params[k]}" for k in names if params.get(k)]
    return f" ({', '.join(shown)})" if shown else ""


def _quoted(condition: str | None, facts: ErrorFacts) -> str:
    text = facts.messages.get(condition or "", "") if condition else ""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return "; ".join(lines)[:_MAX_MESSAGE]


#: Java classes of an interrupted thread (``query.stop()`` interrupts the batch in flight).
_INTERRUPTIONS = frozenset({"java.lang.InterruptedException",
                            "java.io.InterruptedIOException",
                            "java.nio.channels.ClosedByInterruptException"})


def translate(
    exc: BaseException,
    *,
    doing: str,
    sink_id: str,
    batch_id: int | None = None,
    values_in_errors: bool = False,
) -> BaseException:
    """The library's error for ``exc``.

    A rule of the table fits: its error class, naming the condition (and with
    ``values_in_errors`` Delta's message, with ``exc`` as the cause). No rule fits: ``exc``
    itself when ``values_in_errors`` or when it is no Spark/Delta error; otherwise a
    :class:`ConnectorError` naming its condition and classes only.
    """
    if isinstance(exc, ConnectorError):
        return exc
    facts = error_facts(exc)
    for rule in _TABLE:
        via = _match(rule, facts)
        if via is None:
            continue
        condition = via if via in facts.conditions else None
        said = f"[{condition}]" if condition else via
        if condition:
            said += _value_free(condition, rule.params, facts)
        if values_in_errors:
            quoted = _quoted(condition, facts)
            message = f"{doing}: {rule.explanation}. Delta said: {said} {quoted}".rstrip()
        else:
            message = (f"{doing}: {rule.explanation}. Delta: {said} (its message is not "
                       "quoted: it may hold row values; values_in_errors=True quotes it)")
        err = rule.error(message, sink_id=sink_id, batch_id=batch_id)
        if values_in_errors:
            err.__cause__ = exc
        return err
    java = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    spark_error = java is not None or bool(facts.conditions)
    if values_in_errors or not spark_error or _INTERRUPTIONS.intersection(facts.classes):
        # (an interruption, a stopped query's, holds no row values, and Spark recognises
        # it only as it is: the stopped query then ends without an error)
        return exc
    what = f"[{facts.conditions[0]}] " if facts.conditions else ""
    chain = " <- ".join(dict.fromkeys(facts.classes))
    return ConnectorError(
        f"{doing} failed: {what}{chain} (Spark's message is not quoted: it may hold row "
        "values; values_in_errors=True quotes it)",
        sink_id=sink_id,
        batch_id=batch_id,
    )
