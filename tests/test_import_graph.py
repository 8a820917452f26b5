"""The import graph of ``connectors/``: no cycle anywhere (but the hooks' type references,
below), and no pyspark under the core.

Every import statement counts, wherever it stands: at module level, inside a function (a
runtime cycle through a function-local import is still a cycle) and under
``TYPE_CHECKING``. A module's implicit import of its parent packages is not an edge (every
module would otherwise depend on ``connectors/__init__.py``).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests import _architecture

# The walker is the one scripts/architecture.py draws docs/architecture.md's picture with.
architecture = _architecture.load()

PACKAGE: Path = architecture.PACKAGE
modules = architecture.modules
imports_of = architecture.imports_of
graph = architecture.graph


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(1000, 10 * len(edges)))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_walker_sees_modules_and_edges() -> None:
    edges = graph()
    assert len(edges) > 40
    assert "connectors.core.ledgers.ledger" in edges["connectors.core.templates.template"]
    # a cycle is found when there is one
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


#: The only imports allowed to close a loop: the executor, its performers, the tasks and the
#: sink driver name the templates whose hooks they call, for type checking only (the hooks
#: are declared once, on the templates, and the template imports the driver to run a batch).
#: Each must stay an ``if TYPE_CHECKING:`` import, and nothing else may close a loop.
TYPE_REFERENCES = {
    ("connectors.core.driver.execution", "connectors.core.templates.template"),
    ("connectors.core.driver.executor", "connectors.core.templates.template"),
    ("connectors.core.driver.performers", "connectors.core.templates.families"),
    ("connectors.core.driver.sink_driver", "connectors.core.templates.template"),
    ("connectors.core.templates.tasks", "connectors.core.templates.families"),
}


def test_no_import_cycle_anywhere_in_connectors() -> None:
    edges = graph()
    for importer, imported in TYPE_REFERENCES:
        kinds = architecture.edges_of(importer, modules()[importer], set(edges))[imported]
        assert kinds == {architecture.TYPING}, (importer, imported, kinds)
        edges[importer].discard(imported)
    found = cycles(edges)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)
    # with them, loops: template -> sink_driver -> executor -(types)-> families -> template
    assert cycles(graph()) != []


def pyspark_imports(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if any(n == "pyspark" or n.startswith("pyspark.") for n in names):
            lines.append(getattr(node, "lineno", 0))
    return lines


def test_no_pyspark_import_under_core() -> None:
    edges = graph()
    core = {m for m in edges if m == "connectors.core" or m.startswith("connectors.core.")}
    direct = {m: pyspark_imports(modules()[m]) for m in core}
    assert not {m: ln for m, ln in direct.items() if ln}, direct
    # nor through another connectors module
    outside = {m: sorted(t for t in edges[m] if t not in core) for m in core}
    assert not {m: t for m, t in outside.items() if t}, outside


@pytest.mark.parametrize("module", ["connectors.core", "connectors.testing"])
def test_the_core_runs_without_pyspark_installed(module: str) -> None:
    # pyspark made unimportable: the core, the in-memory participants and one exact batch
    code = (
        "import sys; sys.modules['pyspark'] = None\n"
        f"import {module}\n"
        "import pyarrow as pa\n"
        "from connectors.testing import InMemoryPreparedSink, InMemoryTarget, LocalBatch\n"
        "target = InMemoryTarget()\n"
        "sink = InMemoryPreparedSink(target, sink_id='m')\n"
        "sink.write_batch(LocalBatch(pa.table({'x': [1, 2, 3]}), partitions=2), 0)\n"
        "assert sorted(r[0] for r in target.committed_rows()) == [1, 2, 3]\n"
        "print(any(m.startswith('pyspark') and sys.modules[m] for m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, cwd=PACKAGE.parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


#: Where pyspark may be imported: the Spark adapter package, and the sinks' Spark-facing
#: modules that docs/architecture.md names ("Spark-facing modules"). Delta Lake's writer is
#: Spark itself, so the whole Delta package faces Spark (Iceberg's too); Kafka only for its
#: record checks on a DataFrame; the MERGE the two table formats share; the CLI for the demo's
#: job.
SPARK_FACING = ("connectors.spark", "connectors.delta", "connectors.iceberg",
                "connectors.lake.changes", "connectors.lake.commit_confs",
                "connectors.kafka._scan", "connectors.kafka._spark", "connectors.cli._job")


def _facing(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in SPARK_FACING)


def test_pyspark_only_in_the_adapter_and_the_declared_spark_facing_modules() -> None:
    direct = {m: pyspark_imports(p) for m, p in modules().items() if not _facing(m)}
    assert not {m: ln for m, ln in direct.items() if ln}, direct
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    section = doc.split("**Spark-facing modules.**", 1)[1][:1500]
    for name in SPARK_FACING:
        path = name.replace(".", "/")
        assert path in section, f"docs/architecture.md does not name {path} as Spark-facing"


def test_no_sink_asks_for_the_batch_input_type() -> None:
    # Sinks ask the input for capabilities (BatchInput's declared hooks), never for its type.
    for name, path in modules().items():
        if name.startswith("connectors.spark") or name.startswith("connectors.core"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        used |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                 for a in n.names}
        assert "SparkBatch" not in used, f"{name} uses SparkBatch"


def test_every_module_fits_in_400_lines() -> None:
    sizes = {m: len(p.read_text().splitlines()) for m, p in modules().items()}
    assert not {m: n for m, n in sizes.items() if n > 400}, sorted(sizes.items(),
                                                                    key=lambda kv: -kv[1])[:5]


def private_owner(target: str) -> str | None:
    """The package a private name belongs to: for the first part of ``target`` that starts
    with ``_`` (not a dunder), the package (or module) it stands in; ``None``: public."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            return ".".join(parts[:i])
    return None


def package_of(module: str) -> str:
    """The package a module belongs to: itself for a package (``__init__.py``), else the
    package that holds it (``connectors`` for a top-level module such as ``connectors.sdk``)."""
    path = modules()[module]
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def private_imports_across_packages() -> list[str]:
    """Every import of a private module (or a private name) by a module outside the
    package that owns it: ``importer:line (kind) -> target``."""
    found = []
    for name, path in modules().items():
        inside = package_of(name)
        for imp in architecture.raw_imports(name, path):
            if imp.target != "connectors" and not imp.target.startswith("connectors."):
                continue
            owner = private_owner(imp.target)
            if owner is None or inside == owner or inside.startswith(owner + "."):
                continue
            found.append(f"{name}:{imp.line} ({imp.kind}) -> {imp.target}")
    return found


def test_the_private_import_rule_sees_what_it_must() -> None:
    assert private_owner("connectors.postgres._gid.decode_gid") == "connectors.postgres"
    assert private_owner("connectors.spark.jars._session") == "connectors.spark.jars"
    assert private_owner("connectors.postgres.admin.PostgresAdmin") is None
    assert private_owner("connectors._deps.require") == "connectors"  # every package's own
    assert package_of("connectors") == "connectors"
    assert package_of("connectors.cli._targets") == "connectors.cli"
    assert package_of("connectors.sdk") == "connectors"


def test_no_module_imports_another_packages_private_module() -> None:
    # A private module (or name) is private to the package that holds it and to that
    # package's subpackages: connectors.postgres._gid to connectors.postgres, and
    # connectors/_deps.py to every module of connectors. Every import counts: at module
    # level, inside a function and under TYPE_CHECKING. Another package uses a package's
    # public modules (connectors.postgres.admin, connectors.spark.toolkit, ...).
    found = private_imports_across_packages()
    assert not found, ("imports of another package's private module or name:\n  "
                       + "\n  ".join(found))
