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
    """``from X import _name`` statements of ``path`` (a module's private names stay in it;
    importing a private *module* such as ``connectors.kafka._io`` is fine)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    if _is_module(node, alias.name, path):
                        continue
                    found.append(f"{path.name}:{node.lineno} from "
                                 f"{'.' * node.level}{node.module or ''} import {alias.name}")
    return found


def _is_module(node: ast.ImportFrom, name: str, path: Path) -> bool:
    """``from connectors.kafka import _native``: a private module of a package, not a name."""
    if node.level:
        base = path.parent
        for _ in range(node.level - 1):
            base = base.parent
        parts = (node.module or "").split(".") if node.module else []
        package = base.joinpath(*parts)
    else:
        package = PACKAGE.parent.joinpath(*(node.module or "").split("."))
    return (package / f"{name}.py").exists() or (package / name).is_dir()


#: The packages checked; widen to every package of ``connectors/`` once they all comply.
PRIVATE_IMPORT_CHECKED = ["kafka"]


@pytest.mark.parametrize("package", PRIVATE_IMPORT_CHECKED)
def test_no_module_imports_another_module_s_private_name(package: str) -> None:
    found = [hit for path in _sources(PACKAGE / package) for hit in private_imports(path)]
    assert not found, f"make these names public within the package: {found}"
