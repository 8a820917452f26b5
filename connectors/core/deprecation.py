"""Deprecated names kept for one release: renamed hooks and moved public names.

Two mechanisms, each used by the class or package that renamed or moved something:

- :func:`adopt_renamed_hooks`, called from a base class's ``__init_subclass__``: a subclass
  that still overrides a hook under its old name keeps working (its method also becomes
  the hook under the new name) and a :class:`DeprecationWarning`, once per class, names
  the new name. The base class keeps the old name as a method that warns and calls the new
  one, for callers.
- :func:`moved_name`, called from a package's module-level ``__getattr__``: a name that
  moved to another module is still found at its old place, with a warning naming the new
  home.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["adopt_renamed_hooks", "call_renamed", "moved_name"]

#: Class attribute: the new hook names a class adopted from its old-named methods.
_ADOPTED = "_connectors_adopted_hooks_"


def adopt_renamed_hooks(cls: type, renames: Mapping[str, str], *, base: str) -> None:
    """For each ``old -> new`` of ``renames``: when ``cls`` defines ``old`` itself and not
    ``new``, warn once (now, as the class is created) and make ``cls.new`` the class's
    ``old`` method, so that callers of the new name reach the subclass's code.

    Must run before :class:`abc.ABCMeta` counts the abstract methods (it does, from
    ``__init_subclass__``): the adopted method implements the new abstract hook.
    """
    for old, new in renames.items():
        if old in cls.__dict__ and new not in cls.__dict__:
            warnings.warn(
                f"{cls.__module__}.{cls.__qualname__} overrides {base}.{old}(), which is "
                f"renamed {new}() (the old name is removed in the next release): rename "
                "the method",
                DeprecationWarning,
                stacklevel=3,  # the class statement (through __init_subclass__)
            )
            setattr(cls, new, cls.__dict__[old])
            setattr(cls, _ADOPTED, frozenset({*cls.__dict__.get(_ADOPTED, ()), new}))


def call_renamed(obj: object, base: str, old: str, new: str, *args: Any) -> Any:
    """The body of the deprecated alias ``base.old``: warn, then call hook ``new`` of
    ``obj`` as its class implements it, skipping methods adopted from an old-named
    override, so that such an override calling ``super().old(...)`` reaches its parent's
    implementation (not itself again). Such a class was warned once when it was made: its
    ``super()`` calls are not warned again."""
    mro = type(obj).__mro__
    if not any(new in klass.__dict__.get(_ADOPTED, ()) for klass in mro):
        warnings.warn(
            f"{base}.{old}() is deprecated (removed in the next release): call {new}()",
            DeprecationWarning,
            stacklevel=3,  # the caller of the alias
        )
    for klass in mro:
        if new in klass.__dict__ and new not in klass.__dict__.get(_ADOPTED, ()):
            return klass.__dict__[new].__get__(obj, type(obj))(*args)
    raise AttributeError(f"{type(obj).__name__} implements no {new}()")


def moved_name(package: str, name: str, moves: Mapping[str, str]) -> Any:
    """The object ``name`` moved from ``package`` to ``moves[name]``, with a warning naming
    its new home; :class:`AttributeError` for any other name."""
    home = moves.get(name)
    if home is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    warnings.warn(
        f"{package}.{name} is deprecated (removed in the next release): import it from "
        f"{home} ({home}.{name})",
        DeprecationWarning,
        stacklevel=3,  # the code that named it (through the package's __getattr__)
    )
    return getattr(importlib.import_module(home), name)
