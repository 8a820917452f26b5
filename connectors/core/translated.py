"""A client library's error raised as the library's own, with no trace of the original.

The targets' clients (psycopg, PyMySQL, ...) put row values into their errors' texts and
diagnostics (``Key (id)=(17) already exists``, ``Incorrect integer value: 'abc'``). Each
sink translates them into a :class:`~connectors.core.errors.ConnectorError` that quotes no
value; :func:`raise_translated` raises that error *outside* the ``except`` block, so it has
no ``__context__`` (nor ``__cause__``): the client's exception travels nowhere (``raise ...
from None`` inside the handler would still keep it in ``__context__``).

Example::

    >>> from connectors.core.errors import ConnectorError
    >>> def fail() -> None:
    ...     raise ValueError("Duplicate entry 'secret-9'")
    >>> try:
    ...     raise_translated(fail, lambda exc: ConnectorError("duplicate key"), ValueError)
    ... except ConnectorError as err:
    ...     print(err, err.__context__)
    duplicate key None
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["raise_translated"]

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)


def raise_translated(call: Callable[[], T], translator: Callable[[E], BaseException],
                     catch: type[E] | tuple[type[E], ...]) -> T:
    """``call()``; an exception of ``catch`` raised as ``translator(exc)``, outside the
    handler (see the module docstring)."""
    try:
        return call()
    except catch as exc:
        error = translator(exc)
    raise error
