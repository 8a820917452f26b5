"""Delta/Spark errors translated, in one table, into the library's own."""

from __future__ import annotations

from connectors.core.errors import BadInputError, ConnectorError, TransientError

__all__ = ["translate"]

# Order matters: the first row whose needle occurs in the error's text wins.
_TABLE: tuple[tuple[tuple[str, ...], type[ConnectorError], str], ...] = (
    (
        ("DELTA_NOT_NULL_CONSTRAINT_VIOLATED", "NOT NULL constraint violated"),
        BadInputError,
        "a NULL value in a NOT NULL column of the table: filter or fill the NULLs of that "
        "column in the query (e.g. df.na.fill or a where clause), or drop the constraint",
    ),
    (
        ("DELTA_VIOLATE_CONSTRAINT_WITH_VALUES", "CHECK constraint"),
        BadInputError,
        "a row violates a CHECK constraint of the table: filter those rows in the query, "
        "or change the constraint",
    ),
    (
        ("DELTA_FAILED_TO_MERGE_FIELDS", "A schema mismatch detected", "DELTA_SCHEMA_CHANGED",
         "DELTA_MERGE_INCOMPATIBLE_DATATYPE", "DELTA_COLUMN_NOT_FOUND_IN_MERGE"),
        BadInputError,
        "the batch's schema does not fit the table: change the query's columns or types, "
        "or pass merge_schema=True to add new columns",
    ),
    (
        ("DELTA_MISSING_DELTA_TABLE", "is not a Delta table", "PATH_NOT_FOUND",
         "TABLE_OR_VIEW_NOT_FOUND", "DELTA_TABLE_NOT_FOUND"),
        BadInputError,
        "the Delta table does not exist: create it, or pass create_table=True",
    ),
    (
        ("ConcurrentAppendException", "ConcurrentDeleteReadException",
         "ConcurrentDeleteDeleteException", "ConcurrentTransactionException",
         "MetadataChangedException", "ProtocolChangedException",
         "ConcurrentModificationException", "DELTA_CONCURRENT_"),
        TransientError,
        "another writer committed to the table at the same time; retried (the txn id makes "
        "the retry idempotent)",
    ),
)

def translate(
    exc: BaseException, *, doing: str, sink_id: str, batch_id: int | None = None
) -> BaseException:
    """The library's error for ``exc`` (or ``exc`` itself when no row of the table fits)."""
    if isinstance(exc, ConnectorError):
        return exc
    text = str(exc)
    for needles, cls, explanation in _TABLE:
        if any(n in text for n in needles):
            first = text.strip().splitlines()[0][:500] if text.strip() else type(exc).__name__
            err = cls(
                f"{doing}: {explanation}. Delta said: {first}",
                sink_id=sink_id,
                batch_id=batch_id,
            )
            err.__cause__ = exc
            return err
    return exc
