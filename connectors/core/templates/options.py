"""A sink's settings as text options: the DataSource form's ``.option(key, value)``.

Spark hands a data source its options as strings, with lowercased keys. :class:`Options`
reads them for a sink's :meth:`~connectors.core.templates.template.TwoPhaseCommitSink.from_options`:
typed, each error naming the option and the fix, and every key Spark did not add and the
sink did not read refused (a misspelt option must not be ignored). Values are never quoted
in errors (an option may hold a password).

Example::

    >>> opts = Options({"sink_id": "events", "keep_batches": "50", "path": "/x"}, "events")
    >>> opts.text("sink_id"), opts.integer("keep_batches", 100), opts.flag("reset_binding")
    ('events', 50, False)
    >>> opts.check_all_read()
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from connectors.core.errors import ConfigurationError

__all__ = ["SPARK_OPTIONS", "Options"]

#: Options Spark itself adds or reads (a query's checkpoint and name; a path given to
#: ``save(path)`` or ``start(path)``): never the sink's.
SPARK_OPTIONS = frozenset({"checkpointlocation", "queryname", "path"})
T = TypeVar("T")
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


class Options:
    """Text options read by name (keys compared lowercased, as Spark passes them)."""

    def __init__(self, options: Mapping[str, str], sink_id: str | None = None) -> None:
        self._values = {str(k).lower(): str(v) for k, v in options.items()}
        self._read: set[str] = set()
        self.sink_id = sink_id

    def __repr__(self) -> str:  # the keys only: a value may be a secret
        return f"Options(keys={sorted(self._values)})"

    def _error(self, message: str) -> ConfigurationError:
        return ConfigurationError(message, sink_id=self.sink_id)

    def has(self, key: str) -> bool:
        return key in self._values

    def text(self, key: str, default: str | None = None) -> str:
        """The option ``key``; required unless ``default`` is given."""
        self._read.add(key)
        value = self._values.get(key)
        if value is None or value == "":
            if default is None:
                raise self._error(f'option "{key}" is required: .option("{key}", ...)')
            return default
        return value

    def optional(self, key: str) -> str | None:
        self._read.add(key)
        value = self._values.get(key)
        return value if value else None

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.optional(key)
        if value is None:
            return default
        if value.strip().lower() in _TRUE:
            return True
        if value.strip().lower() in _FALSE:
            return False
        raise self._error(f'option "{key}" must be true or false')

    def integer(self, key: str, default: int) -> int:
        return self._parsed(key, default, int, "a whole number")

    def number(self, key: str, default: float) -> float:
        return self._parsed(key, default, float, "a number")

    def _parsed(self, key: str, default: T, parse: Callable[[str], T], what: str) -> T:
        value = self.optional(key)
        if value is None:
            return default
        try:
            return parse(value.strip())
        except ValueError:
            raise self._error(f'option "{key}" must be {what}') from None

    def names(self, key: str) -> list[str] | None:
        """A comma-separated list of names (``"id, region"``), or ``None`` when absent."""
        value = self.optional(key)
        if value is None:
            return None
        return [part.strip() for part in value.split(",") if part.strip()]

    def check_all_read(self) -> None:
        """Refuse an option nobody read (a typo, or a setting of another sink)."""
        unknown = sorted(set(self._values) - self._read - SPARK_OPTIONS)
        if unknown:
            raise self._error(
                f"unknown option(s) {unknown}: check the spelling (options are the sink's "
                "keyword arguments, as text)")
