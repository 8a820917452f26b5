"""Optional dependencies: a missing one names the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from connectors.core.errors import DependencyError

__all__ = ["require"]


def require(module: str, *, extra: str, feature: str) -> ModuleType:
    """Import ``module`` or raise :class:`DependencyError` naming ``spark-exactly-once[extra]``.

    Example::

        psycopg = require("psycopg", extra="postgres", feature="PostgresSink")
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise DependencyError(
            f"{feature} needs the Python package {module!r}, which is not installed: "
            f"pip install 'spark-exactly-once[{extra}]'"
        ) from exc
