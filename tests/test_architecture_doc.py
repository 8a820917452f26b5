"""docs/architecture.md's package picture is what ``scripts/architecture.py`` draws from
the code's imports today: a new package, a removed one or a new arrow fails here, with the
command that redraws it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "architecture.py"

from tests import _architecture  # noqa: E402

# The walker is the one scripts/architecture.py draws docs/architecture.md's picture with.
architecture = _architecture.load()


def test_the_package_picture_in_the_doc_is_current() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = architecture.render()
    assert doc.count(architecture.BEGIN) == 1 and doc.count(architecture.END) == 1
    assert block in doc, (
        f"docs/architecture.md's package picture is stale: run `{architecture.COMMAND}` "
        "and commit docs/architecture.md")


def test_the_picture_of_the_cores_inside_is_current_and_layered() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert architecture.render_core() in doc, (
        f"docs/architecture.md's picture of connectors/core/ is stale: run "
        f"`{architecture.COMMAND}` and commit docs/architecture.md")
    edges = architecture.core_graph()
    # the protocol is sans I/O and knows no driver, no template; the ledgers know no protocol
    # step; the ground (states, errors, naming, fingerprint) imports nothing above it
    assert not [e for e in edges if e[0] == "protocol" and e[1] in ("driver", "templates")]
    assert not [e for e in edges if e[0] == "ledgers" and e[1] in (
        "driver", "templates", "protocol", "policies")], edges
    ground = {"states", "errors", "naming", "fingerprint"}
    assert not [e for e in edges if e[0] in ground and e[1] not in ground], edges
    # the one pair that points both ways: a sink runs through its driver, which calls it
    both = {(a, b) for a, b in edges if (b, a) in edges}
    assert both == {("driver", "templates"), ("templates", "driver")}, both


def test_the_picture_shows_the_layering_the_import_test_enforces() -> None:
    edges = architecture.package_graph()
    # the core imports no other package of connectors/ and no pyspark
    assert not [e for e in edges if e[0] == "core"], edges
    # testing depends on the core only; postgres never on Spark
    assert {b for a, b in edges if a == "testing"} == {"core"}
    assert ("postgres", "spark") not in edges and ("postgres", "pyspark") not in edges
    assert edges["spark", "pyspark"] == architecture.MODULE
    # connectors/__init__.py loads the targets on first use
    assert edges["connectors", "postgres"] == architecture.FUNCTION
    assert set(architecture.nodes()) == set(architecture.ROLES)


def test_the_walker_tells_import_time_from_first_use_and_type_checking(
        tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "a").mkdir(parents=True)
    (pkg / "b").mkdir()
    for init in (pkg / "__init__.py", pkg / "a" / "__init__.py", pkg / "b" / "__init__.py"):
        init.write_text("")
    (pkg / "b" / "x.py").write_text("")
    (pkg / "a" / "m.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.b import x\n"
        "def f():\n    from ..b import x\n    import pyspark.sql\n")
    assert architecture.package_graph(pkg) == {("a", "b"): architecture.FUNCTION,
                                               ("a", "pyspark"): architecture.FUNCTION}
    (pkg / "a" / "n.py").write_text("from pkg.b.x import y\n")
    assert architecture.package_graph(pkg)["a", "b"] == architecture.MODULE
    assert architecture.graph(pkg)["pkg.a.n"] == {"pkg.b.x"}


def test_check_fails_on_a_stale_doc_and_names_the_command() -> None:
    ok = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True,
                        text=True, timeout=60, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    stale = architecture.splice(doc, architecture.BEGIN + "\n" + architecture.END)
    assert stale != doc
    assert architecture.splice(stale, architecture.render()) == doc


def test_the_hand_written_module_map_names_every_module() -> None:
    # The picture is per package; the "Modules" map below it says what each module does.
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = doc.split("### Modules", 1)[1].split("```", 2)[1]
    missing = [
        str(path.relative_to(ROOT)) for name, path in architecture.modules().items()
        if name.count(".") >= 2 and path.name != "__init__.py"
        and not re.search(rf"(?<![\w]){re.escape(path.stem)}(?![\w])", section)]
    assert not missing, f"docs/architecture.md, 'Modules': say what these do: {missing}"
