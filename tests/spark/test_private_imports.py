"""No module imports another module's private (leading underscore) name.

A name one module needs from another is public within the package (no leading
underscore); private *modules* (``_x.py``) are fine, but names are imported from them, never
the module itself as a name (``from connectors.spark import _rows``). Parametrised per
package: widen :data:`PACKAGES` to check more of ``connectors/``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: The packages checked (directories under the repository root), subpackages included.
PACKAGES = ["connectors/spark"]


def _modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def private_imports(path: Path) -> list[str]:
    """``from X import _name`` statements of ``path`` (every import, function-local and
    ``TYPE_CHECKING`` ones included), as ``line: module._name``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
            continue
        for alias in node.names:
            if alias.name.startswith("_"):
                found.append(f"{node.lineno}: {'.' * node.level}{node.module or ''}."
                             f"{alias.name}")
    return found


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_a_private_name(path: Path) -> None:
    assert private_imports(path) == []


def test_the_check_sees_a_private_name(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from __future__ import annotations\nfrom a._b import c, _d\n"
                      "def f():\n    from . import _e\n")
    assert private_imports(module) == ["2: a._b._d", "4: .._e"]
