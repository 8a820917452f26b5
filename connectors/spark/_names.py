"""Column names as Spark parses them: any name, quoted so that it means only itself.

``F.col("a.b")`` is field ``b`` of struct ``a`` and a name with a backtick ends a quoted
one early, so every column the library refers to by a name it did not choose (a batch's
columns, merge keys) goes through :func:`quoted`: the whole name in backticks, each
backtick inside doubled (Spark's rule for attribute names and SQL identifiers alike).

Example::

    >>> quoted("a.b")
    '`a.b`'
    >>> quoted("x`y")
    '`x``y`'
"""

from __future__ import annotations

__all__ = ["quoted"]


def quoted(name: str) -> str:
    """``name`` as one backtick-quoted identifier (for ``F.col`` and Spark SQL)."""
    return "`" + name.replace("`", "``") + "`"
