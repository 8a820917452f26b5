"""A LOAD DATA LOCAL's warnings as a value-free refusal: column, row number, code, fix.

LOAD DATA **LOCAL** never fails on a bad value. The server cannot stop the client in the
middle of sending the file, so it treats every data-interpretation error as a warning (as
``IGNORE`` does), stores a changed value and goes on, even under ``STRICT_ALL_TABLES``.
Measured on MariaDB 10.11.19 with ``sql_mode = 'STRICT_ALL_TABLES,NO_ZERO_DATE,
NO_ZERO_IN_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION'``
(``benchmarks/mariadb_load.py --smoke`` checks it again):

=======================  ==========================  =========================================
the file held            ``SHOW WARNINGS``            what the table then held
=======================  ==========================  =========================================
``abc`` for an INT       Warning 1366, column, row   ``0``
a too long VARCHAR(5)    Warning 1265, column, row   the first 5 characters
``123456.5`` for         Warning 1264, column, row   ``999.99``
DECIMAL(5,2)
``1.239`` for            **Note** 1265, column, row  ``1.24``
DECIMAL(5,2)
NULL for NOT NULL        Warning 1263, column, row   ``''`` (the type's implicit default)
a duplicate key          Warning 1062, key, no row   the row skipped
``2024-13-45`` for a     Warning 1265, column, row   ``0000-00-00`` (despite NO_ZERO_DATE)
DATETIME
=======================  ==========================  =========================================

So the writer checks after every load: ``@@warning_count`` (or the driver's count of the
OK packet) is 0, else it reads ``SHOW WARNINGS`` (at most ``@@max_error_count`` rows, 64 by
default) and refuses the batch with :func:`refusal`, before ``XA END``; the branch is rolled
back. Notes count too: a rounded DECIMAL is a changed value.

The messages quote values (``Incorrect integer value: 'abc' for column ...``, ``Duplicate
entry '1' for key ...``), and a value may be a secret: nothing here returns a message. A
warning is described by its code, the column (found by matching the end of the message
with the batch's own column names), the row number (``at row N``: the N-th line of the
file, the batch's row N counting from 1) and, for a duplicate key, the key's name.

Example::

    >>> rows = [("Warning", 1366, "Incorrect integer value: 'abc' for column "
    ...          "`shop`.`orders`.`id` at row 7")]
    >>> print(refusal(rows, ["id", "name"], total=1))
    the load left 1 warning (the batch is refused, nothing of it is kept):
      Warning 1366 in column 'id', row 7: a value of another type (text for a number);
        cast the column in the query to the table column's type
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["LoadWarning", "parse_warnings", "refusal"]

#: Per code: what it means, and the fix (neither quotes a value).
_MEANING: dict[int, tuple[str, str]] = {
    1048: ("NULL for a NOT NULL column", "filter or fill the NULLs in the query, or make the "
                                         "column nullable"),
    1062: ("a key the table or the batch already holds", "deduplicate the batch on the key; "
                                                         "a key already in the table needs an "
                                                         "upsert, not an append"),
    1261: ("a row with fewer fields than the statement's columns", "a bug of the encoder: "
                                                                   "please report it"),
    1262: ("a row with more fields than the statement's columns", "a bug of the encoder: "
                                                                  "please report it"),
    1263: ("NULL for a NOT NULL column", "filter or fill the NULLs in the query, or make the "
                                         "column nullable"),
    1264: ("a number out of the column's range", "widen the column's type (precision, "
                                                  "BIGINT, DOUBLE) or filter the rows"),
    1265: ("a value cut or changed to fit the column (too long, too many decimals, or no "
             "valid value of its type)", "widen the column, or round, cut or fix the value "
                                         "in the query"),
    1292: ("a date or time the column cannot hold", "fix or filter it in the query"),
    1300: ("text invalid in the column's character set", "use utf8mb4 for the column"),
    1366: ("a value of another type (text for a number)", "cast the column in the query to "
                                                          "the table column's type"),
    1406: ("a value too long for the column", "widen the column, or cut the value in the "
                                              "query"),
    4025: ("a value a CHECK constraint refuses (of a JSON column: text that is no JSON "
           "document)", "fix or filter the value in the query; a JSON column takes JSON "
                        "documents, or an array, map or struct column (written as JSON)"),
    4038: ("text that is no JSON document", "give a JSON column JSON documents, or an "
                                            "array, map or struct column (written as JSON)"),
}
_AT_ROW = re.compile(r" at row (\d+)\Z")
_ROW_FIRST = re.compile(r"\ARow (\d+) ")
_KEY = re.compile(r" for key '([^']*)'\Z")
#: 4025: ``CONSTRAINT `<table>.<name>` failed for `<db>`.`<table>```: a JSON column's own
#: constraint is named after the column.
_CONSTRAINT = re.compile(r"\ACONSTRAINT `((?:[^`]|``)*)` failed for ")


@dataclass(frozen=True)
class LoadWarning:
    """One row of ``SHOW WARNINGS`` without its message: nothing in it is a value."""

    level: str
    code: int
    column: str | None
    row: int | None
    key: str | None = None
    constraint: str | None = None

    def describe(self) -> str:
        """One line: level, code, where, what it means and the fix."""
        where = [f"column {self.column!r}"] if self.column is not None else []
        where += [f"row {self.row}"] if self.row is not None else []
        where += [f"key {self.key!r}"] if self.key is not None else []
        where += [f"constraint {self.constraint!r}"] if self.constraint is not None else []
        meaning, fix = _MEANING.get(self.code, (
            f"MariaDB's warning {self.code}", "see MariaDB's error code reference"))
        place = f" in {', '.join(where)}" if where else ""
        return f"{self.level} {self.code}{place}: {meaning};\n    {fix}"


def _quoted_forms(name: str) -> tuple[str, ...]:
    return (f"'{name}'", "`" + name.replace("`", "``") + "`")


def _column(head: str, columns: Sequence[str]) -> str | None:
    """The column whose quoted name ends ``head`` (the longest, if several do)."""
    found = [c for c in columns if any(head.endswith(q) for q in _quoted_forms(c))]
    return max(found, key=len) if found else None


def parse_warnings(rows: Iterable[Sequence[object]],
                   columns: Sequence[str]) -> list[LoadWarning]:
    """``SHOW WARNINGS`` rows (level, code, message) as :class:`LoadWarning`\\ s, their
    columns among ``columns`` (the statement's), their messages dropped."""
    found = []
    for level, code, message in (tuple(r)[:3] for r in rows):
        text = str(message)
        at_row = _AT_ROW.search(text)
        row_first = _ROW_FIRST.match(text)
        key = _KEY.search(text)
        row = int(at_row[1]) if at_row else int(row_first[1]) if row_first else None
        column = _column(text[: at_row.start()], columns) if at_row else None
        constraint = _CONSTRAINT.match(text)
        named = constraint[1].replace("``", "`") if constraint else None
        if named is not None:
            column = max((c for c in columns if named.endswith("." + c)), key=len, default=None)
        found.append(LoadWarning(str(level), int(str(code)), column, row,
                                 key[1] if key and not at_row else None,
                                 named if named is not None and column is None else None))
    return found


def refusal(rows: Iterable[Sequence[object]], columns: Sequence[str], *,
            total: int | None = None) -> str:
    """The message that refuses a batch whose load left warnings: how many (``total``:
    ``@@warning_count``, when ``SHOW WARNINGS`` holds fewer), then one line per warning."""
    warnings = parse_warnings(rows, columns)
    count = max(total or 0, len(warnings))
    lines = [f"the load left {count} warning{'s' if count != 1 else ''} (the batch is "
             "refused, nothing of it is kept):"]
    lines += ["  " + w.describe() for w in warnings]
    if count > len(warnings):
        lines.append(f"  ... and {count - len(warnings)} more (SHOW WARNINGS keeps "
                     "@@max_error_count)")
    return "\n".join(lines)
