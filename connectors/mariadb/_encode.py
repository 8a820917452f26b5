r"""Arrow record batches as the bytes of one LOAD DATA LOCAL INFILE file, and its statement.

The file is MariaDB's default text format, spelled out in the statement: a tab ends a field,
a newline a row, a backslash escapes, ``\N`` is NULL, nothing encloses a field. A value's
text (:mod:`._text`, :mod:`._json`) is escaped where it could hold one of those bytes
(strings, JSON, raw binary): ``\`` -> ``\\``, tab -> ``\t``, newline -> ``\n``, carriage
return -> ``\r``, NUL -> ``\0``; so the text ``\N`` loads as the two characters, not as
NULL. The whole file is built by ``pyarrow.compute`` (cast, ``replace_substring``,
``fill_null``, ``binary_join_element_wise``): no Python object per value.

How each Arrow column is written (:class:`LoadColumn`'s ``kind``):

* ``plain``: numbers, booleans, dates, timestamps, times: text that needs no escape;
* ``string``: text, escaped;
* ``json``: lists, maps and structs as JSON text (for a JSON column), escaped;
* ``bytes`` (binary, the default): the bytes themselves, escaped. The file is read as
  utf8mb4, but a binary column takes its bytes unconverted: bytes that are no UTF-8 read
  back exactly from VARBINARY and BLOB (MariaDB 10.11.19, ``benchmarks/mariadb_load.py
  --smoke``; into a text column they would be a warning, so a refusal);
* ``hex`` (binary with ``binary="hex"``): hex digits into a user variable, stored by ``SET
  col = UNHEX(@var)``. Measured (500,000 rows of 32 random bytes, ``mariadb_load``): hex
  loads in 1.5-1.8 s from 36 MB, the escaped bytes in 1.1-1.4 s from 20 MB.

The statement spells its delimiters as hex literals (``X'09'``, ``X'5C'``, ``X'0A'``): they
read the same under any ``sql_mode`` (under ``NO_BACKSLASH_ESCAPES`` ``'\t'`` is two
characters). Identifiers are quoted with backticks (a backtick in a name doubled).

Who calls it: the task writer, once per batch: ``plan.encode(batch)`` for the bytes, which
the driver sends when it runs ``plan.statement(table, path)`` and the server asks for
``path`` (an in-memory file, see ``benchmarks/mariadb_load.py``). LOAD DATA LOCAL turns a
value the column refuses into a warning, not an error: the writer checks ``SHOW WARNINGS``
after the load (:mod:`._strict`).

Example::

    >>> import pyarrow as pa
    >>> batch = pa.record_batch({"id": [1, 2], "name": ["a\tb", None], "raw": [b"\x01", b""]})
    >>> plan = LoadPlan.for_schema(batch.schema)
    >>> bytes(plan.encode(batch))
    b'1\ta\\tb\t\x01\n2\t\\N\t\n'
    >>> print(plan.statement(("shop", "orders"), "/proc/self/fd/7"))
    LOAD DATA LOCAL INFILE '/proc/self/fd/7' INTO TABLE `shop`.`orders` CHARACTER SET utf8mb4
    FIELDS TERMINATED BY X'09' ESCAPED BY X'5C' LINES TERMINATED BY X'0A'
    (`id`, `name`, `raw`)
    >>> hex_plan = LoadPlan.for_schema(batch.schema, binary="hex")
    >>> bytes(hex_plan.encode(batch))
    b'1\ta\\tb\t01\n2\t\\N\t\n'
    >>> print(hex_plan.statement("orders", "/proc/self/fd/7").splitlines()[-1])
    (`id`, `name`, @eos_hex2) SET `raw` = UNHEX(@eos_hex2)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from connectors.mariadb._config import quote
from connectors.mariadb._json import is_nested, json_text
from connectors.mariadb._text import (
    TEXT,
    ValueRefused,
    hex_text,
    is_binary,
    is_text,
    offsets_of,
    plain,
    scalar_text,
)

__all__ = ["LoadColumn", "LoadPlan", "ValueRefused", "qualified_name"]

_BYTES = pa.large_binary()
#: What LOAD DATA reads as NULL (``\N``), and the escapes of a field's text, backslash first.
_NULL = pa.scalar(b"\\N", _BYTES)
_ESCAPES = (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r"), ("\x00", "\\0"))
_NEEDS_ESCAPE = "[\\\\\\t\\n\\r\\x00]"  # the RE2 class of the five bytes
_FORMAT = ("CHARACTER SET utf8mb4\n"
           "FIELDS TERMINATED BY X'09' ESCAPED BY X'5C' LINES TERMINATED BY X'0A'")

Kind = Literal["plain", "string", "json", "hex", "bytes"]


def qualified_name(table: str | Sequence[str]) -> str:
    """A table as SQL: one name (``"events"``, quoted whole, dots included) or its parts
    (``("shop", "events")`` -> ``shop``.``events``)."""
    parts = [table] if isinstance(table, str) else list(table)
    if not 1 <= len(parts) <= 2:
        raise ValueError("a table is a name or (database, name)")
    return ".".join(quote(p) for p in parts)


def _path_literal(path: str) -> str:
    # No quote and no backslash: the literal then reads the same under any sql_mode.
    if not path or any(c in path for c in "'\\\x00"):
        raise ValueError("the LOAD DATA path must hold no quote, backslash or NUL")
    return f"'{path}'"


@dataclass(frozen=True)
class LoadColumn:
    """One column of the file: its name (the table's column) and how it is written."""

    name: str
    kind: Kind


def _kind(t: pa.DataType, binary: str) -> Kind:
    if pa.types.is_dictionary(t):
        t = t.value_type
    if isinstance(t, pa.ExtensionType):
        t = t.storage_type
    if is_nested(t):
        return "json"
    if is_text(t):
        return "string"
    if is_binary(t):
        return "hex" if binary == "hex" else "bytes"
    return "plain"


def _escape(arr: pa.Array, check: bool) -> pa.Array:
    """Text or bytes with the five bytes escaped; ``check``: look first, skip when clean."""
    if check:
        found: Any = pc.any(pc.match_substring_regex(arr, _NEEDS_ESCAPE)).as_py()
        if not found:
            return arr
    for char, escaped in _ESCAPES:
        arr = pc.replace_substring(arr, char, escaped)
    return arr


@dataclass(frozen=True)
class LoadPlan:
    """How a schema's columns are written, and the statement that loads them.

    Built once per schema (:meth:`for_schema`, which refuses a type it cannot write);
    immutable and picklable, so a driver can build it and send it to the tasks.
    """

    columns: tuple[LoadColumn, ...]

    @classmethod
    def for_schema(cls, schema: pa.Schema, *,
                   binary: Literal["hex", "bytes"] = "bytes") -> LoadPlan:
        """The plan for ``schema``'s columns, in order; ``binary``: how binary is written."""
        if binary not in ("hex", "bytes"):
            raise ValueError("binary is 'hex' or 'bytes'")
        names = [f.name for f in schema]
        if not names:
            raise ValueError("a batch without columns cannot be loaded")
        if len({n.lower() for n in names}) != len(names):
            raise ValueError("the batch names a column twice (MariaDB's names ignore case)")
        plan = cls(tuple(LoadColumn(f.name, _kind(f.type, binary)) for f in schema))
        for f, column in zip(schema, plan.columns, strict=True):
            plan._field(column, pa.array([], f.type))  # refuses a type it cannot write
        return plan

    @property
    def names(self) -> list[str]:
        """The columns' names, in the file's order."""
        return [c.name for c in self.columns]

    def statement(self, table: str | Sequence[str], path: str) -> str:
        """``LOAD DATA LOCAL INFILE`` of ``path`` (what the driver sends when the server
        asks for it) into ``table`` (:func:`qualified_name`)."""
        targets, sets = [], []
        for i, column in enumerate(self.columns):
            name = quote(column.name)
            if column.kind == "hex":
                variable = f"@eos_hex{i}"
                targets.append(variable)
                sets.append(f"{name} = UNHEX({variable})")
            else:
                targets.append(name)
        sql = (f"LOAD DATA LOCAL INFILE {_path_literal(path)} INTO TABLE "
               f"{qualified_name(table)} {_FORMAT}\n({', '.join(targets)})")
        return sql + (f" SET {', '.join(sets)}" if sets else "")

    def _field(self, column: LoadColumn, arr: pa.Array) -> pa.Array:
        """A column's fields as bytes, escaped, NULL as ``\\N``."""
        arr = plain(arr)
        if column.kind == "json":
            text = _escape(json_text(arr, column.name), check=True)
        elif column.kind == "string":
            text = _escape(arr.cast(TEXT), check=True)
        elif column.kind == "bytes":
            text = _escape(arr.cast(_BYTES), check=False)
        elif column.kind == "hex":
            text = hex_text(arr)
        else:
            text = scalar_text(arr, column.name)
        fields = text.cast(_BYTES)
        return fields.fill_null(_NULL) if fields.null_count else fields

    def encode(self, data: pa.RecordBatch | pa.Table) -> pa.Buffer:
        """The file's bytes for ``data`` (its columns named as the plan's, in order): one
        row per line, each line ended by a newline; no bytes for no rows."""
        if data.schema.names != self.names:
            raise ValueError(f"the batch's columns {data.schema.names} are not the plan's "
                             f"{self.names}")
        if data.num_rows == 0:
            return pa.py_buffer(b"")
        arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c
                  for c in data.columns]
        fields = [self._field(col, arr) for col, arr in zip(self.columns, arrays, strict=True)]
        last = pc.binary_join_element_wise(fields[-1], pa.scalar(b"\n", _BYTES),
                                           pa.scalar(b"", _BYTES))
        rows = pc.binary_join_element_wise(*fields[:-1], last, pa.scalar(b"\t", _BYTES))
        offsets = offsets_of(rows)
        first, last = offsets[0].as_py(), offsets[-1].as_py()
        return rows.buffers()[2].slice(first, last - first)
