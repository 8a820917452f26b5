"""What the catalog says about a column's type, for the binary wire format.

Binary COPY sends each value in its type's *receive* format, so the driver resolves every
column type once when it plans a batch (:func:`describe_types`):

- a **domain** is written as its base type (``pg_type.typbasetype``, followed through
  domains over domains); the server checks the domain's constraints;
- an **array** carries the OID of its element type in every value, and PostgreSQL's
  ``array_recv`` refuses any other OID ("wrong element type"): :attr:`PgType.elem_oid` is
  the array type's ``typelem`` as it is (a domain's OID for an array of a domain), while
  :attr:`PgType.elem` describes how to encode one element (the domain resolved);
- an **enum** is written as its label's text; its labels (``pg_enum``) are read so that a
  task can name the column of an unknown label (the server's COPY error would name it only
  in its ``CONTEXT`` line, next to the value).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

__all__ = ["PgType", "describe_types"]

_MAX_DOMAIN_DEPTH = 16


@dataclass(frozen=True)
class PgType:
    """A type resolved for writing: ``name`` is the base type's ``typname``."""

    oid: int  # the base type's OID (domains resolved)
    name: str  # e.g. int4, uuid, _int4 (the base type's typname)
    kind: str  # pg_type.typtype of the base type: b(ase), e(num), c(omposite), r(ange), ...
    elem: PgType | None = None  # arrays: the element, resolved
    elem_oid: int = 0  # arrays: pg_type.typelem of the array type, as the wire needs it
    labels: tuple[str, ...] = ()  # enums: the labels in order
    domain: str = ""  # the column's own type name when it is a domain

    @property
    def is_array(self) -> bool:
        return self.elem is not None

    @property
    def scalar_kind(self) -> str:
        """``"enum"`` for any enum, else the type name (``int4``, ``uuid``, ...)."""
        return "enum" if self.kind == "e" else self.name


def _rows(conn: psycopg.Connection[Any], oids: set[int]) -> dict[int, tuple[Any, ...]]:
    """``oid -> (typname, typtype, typelem, typbasetype, typcategory)`` for ``oids``."""
    if not oids:
        return {}
    rows = conn.execute(
        "SELECT oid::int8, typname, typtype, typelem::int8, typbasetype::int8, typcategory "
        "FROM pg_type WHERE oid = ANY(%s::oid[])", (sorted(oids),)).fetchall()
    return {int(r[0]): tuple(r[1:]) for r in rows}


def _labels(conn: psycopg.Connection[Any], oids: set[int]) -> dict[int, tuple[str, ...]]:
    if not oids:
        return {}
    rows = conn.execute(
        "SELECT enumtypid::int8, enumlabel FROM pg_enum WHERE enumtypid = ANY(%s::oid[]) "
        "ORDER BY enumtypid, enumsortorder", (sorted(oids),)).fetchall()
    out: dict[int, list[str]] = {}
    for oid, label in rows:
        out.setdefault(int(oid), []).append(label)
    return {k: tuple(v) for k, v in out.items()}


def describe_types(conn: psycopg.Connection[Any], oids: list[int]) -> dict[int, PgType]:
    """Every type of ``oids`` resolved (domains to their base, arrays to their elements).

    A few catalog queries on the driver's connection: one per level of domain or array
    nesting, one for enum labels.
    """
    info: dict[int, tuple[Any, ...]] = {}
    todo = set(oids)
    for _ in range(_MAX_DOMAIN_DEPTH):
        todo -= set(info)
        if not todo:
            break
        found = _rows(conn, todo)
        info.update(found)
        todo = set()
        for _name, typtype, elem, base, category in found.values():
            if typtype == "d" and base:
                todo.add(int(base))
            if category == "A" and elem:
                todo.add(int(elem))
    labels = _labels(conn, {o for o, r in info.items() if r[1] == "e"})

    def resolve(oid: int, depth: int = 0) -> PgType:
        row = info.get(oid)
        if row is None or depth > _MAX_DOMAIN_DEPTH:
            return PgType(oid, f"oid {oid}", "?")
        name, typtype, elem, base, category = row
        if typtype == "d":
            inner = resolve(int(base), depth + 1)
            return PgType(inner.oid, inner.name, inner.kind, inner.elem, inner.elem_oid,
                          inner.labels, domain=name)
        if category == "A" and elem:
            return PgType(oid, name, typtype, resolve(int(elem), depth + 1), int(elem))
        return PgType(oid, name, typtype, labels=labels.get(oid, ()))

    return {oid: resolve(oid) for oid in oids}
