"""PostgreSQL names as the sink takes them: table names parsed, identifiers checked.

Every name reaches SQL through ``psycopg.sql.Identifier`` (double-quoted, ``"`` doubled), so
no name can inject SQL: ``x"; drop table y; --`` is a (strange) table name, nothing more.
What can still bite is what PostgreSQL does to a name before it looks it up, so this
module refuses it up front with an error that says what to do:

- a name longer than :data:`MAX_IDENTIFIER_BYTES` bytes (UTF-8): PostgreSQL silently
  truncates it, so a long table name would name another table, and two ledger tables whose
  names differ only past the limit would be one table;
- an empty name, or one holding a NUL character (PostgreSQL cannot store it).

Table names (:func:`split_table_name`) are ``"name"`` (schema ``public``),
``"schema.name"``, a tuple ``(schema, name)`` (taken exactly as given: any character,
dots included), or the SQL-quoted form for parts that hold a dot: a part that *starts* with
``"`` is a double-quoted identifier (``""`` stands for one ``"``), e.g.
``'"My Schema"."Täble ""x"" 1"'`` is schema ``My Schema``, table ``Täble "x" 1``. A part that
does not start with ``"`` runs to the next dot and is taken as written: unlike in SQL it is
not folded to lower case (``Events`` is the table ``"Events"``, as the sink always quotes).
More than two parts are refused (say which dot belongs to the name by quoting or a tuple).

Example::

    >>> split_table_name('"My Schema"."Täble ""x"" 1"')
    ('My Schema', 'Täble "x" 1')
    >>> split_table_name("sales.Events")
    ('sales', 'Events')
    >>> format_table_name("my.schema", "events")
    '"my.schema".events'
"""

from __future__ import annotations

from collections.abc import Iterable

from connectors.core.errors import ConfigurationError

__all__ = ["MAX_IDENTIFIER_BYTES", "check_identifier", "format_table_name",
           "key_column_names", "split_table_name"]

#: PostgreSQL's ``NAMEDATALEN - 1``: longer identifiers are truncated to this many bytes.
MAX_IDENTIFIER_BYTES = 63


def check_identifier(name: object, what: str, *, reserve: int = 0) -> str:
    """``name`` if PostgreSQL keeps it as it is, else :class:`ConfigurationError`.

    ``reserve``: bytes the sink appends to the name (the ledger's ``_receipts_batch``).
    """
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"{what} must be a non-empty string, not {name!r}")
    if "\x00" in name:
        raise ConfigurationError(f"{what} {name!r} holds a NUL character, which PostgreSQL "
                                 "names cannot hold: remove it")
    size = len(name.encode("utf-8"))
    limit = MAX_IDENTIFIER_BYTES - reserve
    if size > limit:
        extra = (f" (the sink appends up to {reserve} bytes to it for its own tables)"
                 if reserve else "")
        raise ConfigurationError(
            f"{what} {name!r} is {size} bytes long (UTF-8), above the {limit} bytes "
            f"allowed{extra}: PostgreSQL truncates names to {MAX_IDENTIFIER_BYTES} bytes, "
            "so it would name another object; choose a shorter name")
    return name


def _quoted(text: str, start: int, value: str, what: str) -> tuple[str, int]:
    """The double-quoted identifier at ``text[start]`` and the index after it."""
    out, i = [], start + 1
    while True:
        end = text.find('"', i)
        if end < 0:
            raise ConfigurationError(
                f"{what} {value!r}: the quoted name at position {start} has no closing '\"' "
                "(write a '\"' inside a quoted name as '\"\"')")
        out.append(text[i:end])
        if text.startswith('"', end + 1):  # "" is one quote
            out.append('"')
            i = end + 2
            continue
        return "".join(out), end + 1


def _parts(value: str, what: str) -> list[str]:
    parts, i = [], 0
    while True:
        if value.startswith('"', i):
            part, i = _quoted(value, i, value, what)
            if i < len(value) and value[i] != ".":
                raise ConfigurationError(
                    f"{what} {value!r}: a quoted name must be followed by '.' or end the "
                    f"string (position {i}); pass a (schema, name) tuple to use any "
                    "characters")
        else:
            end = value.find(".", i)
            end = len(value) if end < 0 else end
            part, i = value[i:end], end
        parts.append(part)
        if i >= len(value):
            return parts
        i += 1  # the dot
        if i == len(value):
            parts.append("")
            return parts


def split_table_name(value: object, what: str = "table", *, reserve: int = 0
                     ) -> tuple[str, str]:
    """``(schema, name)`` of a table name given as a string or tuple (module docstring)."""
    if isinstance(value, tuple) and len(value) == 2:
        schema, name = value
    elif isinstance(value, str) and value:
        parts = _parts(value, what)
        if len(parts) > 2:
            raise ConfigurationError(
                f"{what} {value!r} has {len(parts)} dot-separated parts, a table name at "
                "most two (schema.name): if a dot belongs to a name, quote that part "
                "('\"my.schema\".events') or pass a tuple (schema, name), e.g. "
                "('my.schema', 'events')")
        schema, name = parts if len(parts) == 2 else ("public", parts[0])
    else:
        raise ConfigurationError(
            f"{what} must be 'name', 'schema.name' or a tuple (schema, name), not {value!r}")
    if not schema or not name:
        raise ConfigurationError(f"{what} {value!r}: empty schema or table name")
    check_identifier(schema, f"{what} schema")
    check_identifier(name, f"{what} name", reserve=reserve)
    return schema, name


def _shown(part: str) -> str:
    if part and not part.startswith('"') and "." not in part:
        return part
    return '"' + part.replace('"', '""') + '"'


def format_table_name(schema: str, name: str) -> str:
    """``schema.name`` as :func:`split_table_name` reads it back (quoted where needed)."""
    return f"{_shown(schema)}.{_shown(name)}"


def key_column_names(keys: str | Iterable[str] | None) -> tuple[str, ...]:
    """The upsert key columns: one string is one column (``"user_id"``, never its letters);
    each name exactly as in the table (case and spaces kept), checked as an identifier."""
    if keys is None:
        return ()
    names = (keys,) if isinstance(keys, str) else tuple(keys)
    for name in names:
        check_identifier(name, "key column")
    if len(set(names)) != len(names):
        raise ConfigurationError(f"key_columns repeats a column: {list(names)}")
    return names
