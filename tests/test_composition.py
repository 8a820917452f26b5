"""Roles held as collaborators: no class of ``connectors/`` is built from two or more of
the project's own classes, and no module imports another module's private name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "connectors"


def _sources(under: Path) -> list[Path]:
    return sorted(p for p in under.rglob("*.py") if "__pycache__" not in p.parts)


def _own_class_names() -> set[str]:
    return {node.name for path in _sources(PACKAGE)
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ClassDef)}


def _base_name(base: ast.expr) -> str | None:
    if isinstance(base, ast.Subscript):  # Generic[...] / TaskCommitSink[Slot]
        base = base.value
    if isinstance(base, ast.Attribute):
        return base.attr
    if isinstance(base, ast.Name):
        return base.id
    return None


def test_no_class_in_connectors_is_built_from_two_of_the_project_s_classes() -> None:
    own = _own_class_names()
    mixed = []
    for path in _sources(PACKAGE):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [n for n in map(_base_name, node.bases) if n in own]
                if len(bases) >= 2:
                    mixed.append(f"{path.relative_to(PACKAGE.parent)}: {node.name}{bases}")
    assert not mixed, f"hold roles as collaborators, not as bases: {mixed}"


def private_imports(path: Path) -> list[str]:
    """``from X import _name`` statements of ``path``, every import (function-local and
    ``TYPE_CHECKING`` ones included): a module's private names stay in it, and a private
    module is imported by its path (``import connectors.delta._api as delta_api`` or
    ``from connectors.delta._api import merge``), never as a name of its package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.name}:{node.lineno} from "
                                 f"{'.' * node.level}{node.module or ''} import {alias.name}")
    return found


#: Every package of ``connectors/``.
PACKAGES = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())


def test_every_package_is_checked() -> None:
    assert {"core", "delta", "kafka", "postgres", "spark", "cli", "testing"} <= set(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_imports_another_module_s_private_name(package: str) -> None:
    found = [hit for path in _sources(PACKAGE / package) for hit in private_imports(path)]
    assert not found, f"make these names public within the package: {found}"


def test_the_check_sees_a_private_name(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from __future__ import annotations\nfrom a._b import c, _d\n"
                      "def f():\n    from . import _e\n")
    assert private_imports(module) == ["m.py:2 from a._b import _d", "m.py:4 from . import _e"]
