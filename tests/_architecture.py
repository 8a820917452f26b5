"""``scripts/architecture.py`` loaded once as a module (it is a script, not a package), for
the tests that use its import walker: tests/test_import_graph.py, tests/test_architecture_doc.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "architecture.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("architecture_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = sys.modules.get(spec.name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module
