"""Collect and run the examples in the docstrings of ``connectors/`` (issue 19).

Used by ``tests/test_docstring_examples.py`` (examples that need no service and no JVM) and
``integration/docs/test_docstring_examples.py`` (examples that need Spark, PostgreSQL or Kafka).
This is test plumbing: it is not shipped in the package.

What counts as an example
-------------------------
The collector walks ``connectors/**/*.py`` with :mod:`ast` and takes, from every module,
class and function docstring:

* every reST literal block introduced by a line that starts with ``Example`` (or
  ``Examples``) and ends with ``::`` (``Example::``, ``Example (...)::``): the lines after
  it that are blank or indented deeper than it. A block holding ``>>>`` lines runs as a
  doctest (expected output is checked, ``ELLIPSIS`` on); any other block runs as code;
* every other ``>>>`` line of the docstring (a Google-style ``Example:`` section, say):
  all of them together run as one doctest.

Every ``Example...::`` and ``>>>`` line of a source file must belong to a collected
example: one the walk cannot see (in a comment, or in a string that is no docstring) is
reported by the collector's own check, as are syntax errors and unknown names.

The id of an example is ``<module>:<object>`` (``<module>:__doc__`` for a module docstring),
with ``-2``, ``-3``... for the further examples of one docstring.

How an example runs
-------------------
As written, in a copy of its module's globals (as doctest does), plus the fixtures below
for the names it uses but neither defines nor finds in its module. A name that is neither
is an error of the example. Fixtures, and what they need (``-``: nothing):

==========  ========  ===================================================================
name        needs     value
==========  ========  ===================================================================
spark       spark     the integration tests' SparkSession (Delta and Kafka jars)
df          spark     a streaming DataFrame of 3 rows, columns ``id`` (bigint), ``user_id``
                      (bigint), ``value`` (string), read from Parquet files
ckpt        \\-        a fresh checkpoint directory (``str``)
path        \\-        a fresh empty directory (``str``), for tables and files
conninfo    postgres  libpq conninfo of a fresh PostgreSQL database (dropped afterwards;
                      dropping fails if the example left a prepared transaction)
mariadb_url mariadb   ``mariadb://`` URL of a fresh MariaDB database (dropped afterwards;
                      an example that left a prepared branch of its sink fails)
bootstrap   kafka     ``bootstrap.servers`` of the Kafka broker
topic       \\-        a unique topic name (every topic holding it is deleted afterwards)
sink_id     \\-        a unique sink id (shares the token of ``topic``)
commit      \\-        stands for the user's operation: takes any arguments, returns None
==========  ========  ===================================================================

Every streaming query an example starts is driven with ``processAllAvailable()`` (so its
sink runs), checked to have read all of ``df``'s rows, and stopped.

Directives
----------
reST comments (invisible in rendered docs) right before an example, separated from it by a
blank line, apply to the next example of the same docstring (for the loose ``>>>`` lines:
put them before the first one):

* ``.. example-skip: <reason>``: the example is not run; the reason is printed in the
  test session's summary. Keep these few: prefer fixtures or a self-contained example.
* ``.. example-needs: spark[, postgres][, kafka]``: what the example needs beyond what its
  fixtures imply (e.g. it builds its own SparkSession); it then runs with the integration
  tests.

``# doctest: +SKIP`` is refused: it carries no reason. Use ``.. example-skip:``.

An example that needs nothing runs in ``tests/``; one that needs a service or the JVM in
``integration/``; a skipped one is reported by ``tests/``. The session prints
``docstring examples: N run, M skipped`` with every skip's reason.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import doctest
import importlib
import re
import secrets
import textwrap
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "connectors"

NEEDS = ("spark", "postgres", "kafka", "mariadb")


#: The fixtures (documented in the table above) and what each needs.
FIXTURES: dict[str, str | None] = {
    "spark": "spark",
    "df": "spark",
    "ckpt": None,
    "path": None,
    "conninfo": "postgres",
    "mariadb_url": "mariadb",
    "bootstrap": "kafka",
    "topic": None,
    "sink_id": None,
    "commit": None,
}

#: The rows of the ``df`` fixture.
DF_ROWS = [
    {"id": 1, "user_id": 10, "value": "a"},
    {"id": 2, "user_id": 20, "value": "b"},
    {"id": 3, "user_id": 30, "value": "c"},
]
DF_SCHEMA = "id BIGINT, user_id BIGINT, value STRING"

_EXAMPLE_HEAD = re.compile(r"Examples?\b.*::$")
_DIRECTIVE = re.compile(r"\.\.\s+example-(?P<kind>[a-z]+)\s*:\s*(?P<value>.*)$")
_DOCTEST_SKIP = re.compile(r"#\s*doctest:.*\+SKIP")
_MARKER_LINE = re.compile(r"^\s*(>>>|Examples?\b.*::\s*$)")


@dataclass(frozen=True)
class Example:
    """One example: ``source`` is dedented code, or doctest text (``kind == "doctest"``)."""

    id: str
    module: str
    path: Path
    lineno: int  # file line of the first line of ``source``
    kind: str  # "code" | "doctest"
    source: str
    lines: frozenset[int]  # file lines the example covers (head and block)
    skip: str | None = None
    needs: frozenset[str] = frozenset()
    fixtures: frozenset[str] = frozenset()

    @property
    def location(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.lineno}"

    @property
    def integration(self) -> bool:
        """Runs in ``integration/`` (skipped examples are reported by ``tests/``)."""
        return self.skip is None and bool(self.needs)


@dataclass
class Collection:
    examples: list[Example] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def fast(self) -> list[Example]:
        return [e for e in self.examples if not e.integration]

    @property
    def integration(self) -> list[Example]:
        return [e for e in self.examples if e.integration]


# ---------------------------------------------------------------------------- collecting
def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _docstrings(tree: ast.Module) -> Iterator[tuple[str, int, str]]:
    """(qualname, file line of the docstring's first line, raw docstring)."""

    def first(node: ast.AST) -> tuple[int, str] | None:
        body = getattr(node, "body", None)
        if not body or not isinstance(body[0], ast.Expr):
            return None
        value = body[0].value
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            return value.lineno, value.value
        return None

    doc = first(tree)
    if doc:
        yield "__doc__", doc[0], doc[1]

    def walk(nodes: list[ast.stmt], prefix: str) -> Iterator[tuple[str, int, str]]:
        for node in nodes:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                qualname = f"{prefix}{node.name}"
                found = first(node)
                if found:
                    yield qualname, found[0], found[1]
                yield from walk(node.body, qualname + ".")
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                for block in ("body", "orelse", "finalbody"):
                    yield from walk(getattr(node, block, []), prefix)
                for handler in getattr(node, "handlers", []):
                    yield from walk(handler.body, prefix)

    yield from walk(tree.body, "")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def free_names(sources: list[str]) -> set[str]:
    """Names the sources read but never bind (builtins excluded)."""
    loaded: set[str] = set()
    bound: set[str] = set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Name):
                (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                bound.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                bound.add(node.name)
    return loaded - bound - set(dir(builtins))


class _Builder:
    """Turns the examples of one docstring into :class:`Example` records."""

    def __init__(self, coll: Collection, path: Path, module: Any, qualname: str) -> None:
        self.coll, self.path, self.module, self.qualname = coll, path, module, qualname
        self.count = 0

    def problem(self, line: int, text: str) -> None:
        self.coll.problems.append(f"{self.path.relative_to(REPO)}:{line}: {text}")

    def add(self, *, line: int, kind: str, source: str, lines: set[int],
            skip: str | None, needs: set[str]) -> None:
        self.count += 1
        ident = f"{self.module.__name__}:{self.qualname}"
        if self.count > 1:
            ident += f"-{self.count}"
        if not source.strip():
            self.problem(line, f"{ident}: empty example")
            return
        try:
            if kind == "doctest":
                parsed = doctest.DocTestParser().get_examples(source)
                sources = [e.source for e in parsed]
            else:
                sources = [source]
            names = free_names(sources)
        except (SyntaxError, ValueError) as exc:
            self.problem(line, f"{ident}: does not parse: {exc}")
            return
        names -= set(vars(self.module))
        unknown = sorted(names - set(FIXTURES))
        if unknown and skip is None:
            self.problem(line, f"{ident}: uses {', '.join(unknown)}, which neither the "
                               "example, its module nor the fixtures (tests/_examples.py) "
                               "define")
        fixtures = names & set(FIXTURES)
        needs = set(needs) | {n for f in fixtures if (n := FIXTURES[f])}
        self.coll.examples.append(Example(
            id=ident, module=self.module.__name__, path=self.path, lineno=line, kind=kind,
            source=source, lines=frozenset(lines), skip=skip, needs=frozenset(needs),
            fixtures=frozenset(fixtures),
        ))

    def parse(self, start: int, doc: str) -> None:
        lines = doc.split("\n")
        skip: str | None = None
        needs: set[str] = set()
        pending_at: int | None = None
        loose: list[int] = []  # indices of the loose doctest lines
        loose_directives: tuple[str | None, set[str]] | None = None
        i = 0
        while i < len(lines):
            text = lines[i].strip()
            directive = _DIRECTIVE.match(text)
            if directive:
                kind, value = directive["kind"], directive["value"].strip()
                at, indent = i, _indent(lines[i])
                while i + 1 < len(lines) and lines[i + 1].strip() and (
                        _indent(lines[i + 1]) > indent):
                    i += 1
                    value = f"{value} {lines[i].strip()}".strip()
                if kind == "skip":
                    if not value:
                        self.problem(start + at, "'.. example-skip:' needs a reason")
                    skip = value or "(no reason)"
                elif kind == "needs":
                    given = {v.strip() for v in value.split(",") if v.strip()}
                    if not given or given - set(NEEDS):
                        self.problem(start + at, f"'.. example-needs: {value}': give any of "
                                                f"{', '.join(NEEDS)}")
                    needs |= given & set(NEEDS)
                else:
                    self.problem(start + at, f"unknown directive '.. example-{kind}:' "
                                            "(use example-skip or example-needs)")
                pending_at = start + at
                i += 1
                continue
            if _EXAMPLE_HEAD.match(text):
                head = _indent(lines[i])
                j = i + 1
                while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > head):
                    j += 1
                end = j
                while end > i + 1 and not lines[end - 1].strip():
                    end -= 1
                first = i + 1
                while first < end and not lines[first].strip():
                    first += 1
                block = lines[first:end]
                source = textwrap.dedent("\n".join(block))
                kind = "doctest" if any(ln.lstrip().startswith(">>>") for ln in block) else "code"
                self.add(line=start + first, kind=kind, source=source,
                         lines={start + k for k in range(i, end)}, skip=skip, needs=needs)
                skip, needs, pending_at = None, set(), None
                i = j
                continue
            if text.startswith(">>>"):
                if not loose:
                    loose_directives = (skip, needs)
                    skip, needs, pending_at = None, set(), None
                indent = _indent(lines[i])
                while i < len(lines) and lines[i].strip() and _indent(lines[i]) >= indent:
                    loose.append(i)
                    i += 1
                continue
            i += 1
        if pending_at is not None:
            self.problem(pending_at, "directive not followed by an example in its docstring")
        if loose and loose_directives is not None:
            keep = set(loose)
            text = "\n".join(ln if k in keep else "" for k, ln in enumerate(lines)
                             if k >= loose[0])
            self.add(line=start + loose[0], kind="doctest", source=text,
                     lines={start + k for k in loose}, skip=loose_directives[0],
                     needs=loose_directives[1])


def collect(package: Path = PACKAGE) -> Collection:
    """Every example of every docstring under ``package``, and the problems found."""
    coll = Collection()
    for path in sorted(package.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        name = _module_name(path)
        try:
            module = _import(name)
        except Exception as exc:
            coll.problems.append(f"{path.relative_to(REPO)}: cannot import {name}: {exc!r}")
            continue
        tree = ast.parse(source, filename=str(path))
        before = len(coll.examples)
        for qualname, start, doc in _docstrings(tree):
            _Builder(coll, path, module, qualname).parse(start, doc)
        covered: set[int] = set()
        for example in coll.examples[before:]:
            covered |= example.lines
        for number, line in enumerate(source.split("\n"), start=1):
            if _DOCTEST_SKIP.search(line):
                coll.problems.append(
                    f"{path.relative_to(REPO)}:{number}: '# doctest: +SKIP' has no reason: "
                    "make the example run, or put '.. example-skip: <reason>' before it")
            if _MARKER_LINE.match(line) and number not in covered:
                coll.problems.append(
                    f"{path.relative_to(REPO)}:{number}: example line outside any docstring "
                    f"the collector reads: {line.strip()[:60]!r}")
    return coll


def _import(name: str) -> types.ModuleType:
    """The module; a ``__main__`` module (which runs on import) as an empty namespace."""
    if name.rsplit(".", 1)[-1] == "__main__":
        return types.ModuleType(name)
    return importlib.import_module(name)


_COLLECTION: Collection | None = None


def collection() -> Collection:
    """:func:`collect` once per process."""
    global _COLLECTION
    if _COLLECTION is None:
        _COLLECTION = collect()
    return _COLLECTION


def params(examples: list[Example]) -> list[Any]:
    return [pytest.param(e, id=e.id) for e in examples]


# ---------------------------------------------------------------------------- the tally
class Tally:
    """Counts what the session ran and skipped; prints it in pytest's terminal summary."""

    name = "docstring-examples"

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.failed: list[str] = []
        self.skipped: list[tuple[str, str]] = []

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        total = len(collection().examples)
        left = total - len(self.ran) - len(self.skipped)
        line = f"docstring examples: {len(self.ran)} run, {len(self.skipped)} skipped"
        if self.failed:
            line += f", {len(self.failed)} of them failed"
        if left > 0:
            line += f" ({left} of the {total} not selected in this session)"
        terminalreporter.write_sep("-", "docstring examples")
        terminalreporter.write_line(line)
        for ident, reason in self.skipped:
            terminalreporter.write_line(f"  skipped {ident}: {reason}")
        for ident in self.failed:
            terminalreporter.write_line(f"  FAILED {ident}")


def tally(config: pytest.Config) -> Tally:
    """The session's one :class:`Tally`, registered as a plugin on first use."""
    found: Tally | None = config.pluginmanager.get_plugin(Tally.name)
    if found is None:
        found = Tally()
        config.pluginmanager.register(found, Tally.name)
    return found


# ---------------------------------------------------------------------------- running
def commit(*args: object, **kwargs: object) -> None:
    """The ``commit`` fixture: stands for the user's operation, which succeeds."""


def _fresh_database(stack: contextlib.ExitStack, base: str, token: str) -> str:
    import psycopg
    from psycopg import sql

    name = f"eos_example_{token}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def drop() -> None:
        with psycopg.connect(base, autocommit=True) as conn:
            left = conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = %s",
                                (name,)).fetchall()
            for (gid,) in left:
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
        if left:
            raise AssertionError(f"the example left {len(left)} prepared transaction(s) "
                                 f"in its database: {[g for (g,) in left]}")

    stack.callback(drop)
    return str(psycopg.conninfo.make_conninfo(base, dbname=name))


def _fresh_mariadb(stack: contextlib.ExitStack, base: str, token: str) -> str:
    """A database of the example's own (``eos_docs_...``: the pattern the test service's
    user may create), dropped afterwards; a branch left prepared by a sink whose id holds
    ``token`` is rolled back and fails the example."""
    from integration.docs._mariadb_page import mariadb_database

    return stack.enter_context(mariadb_database(base, f"eos_docs_ex_{token}",
                                                owns=lambda sink_id: token in sink_id))


def _delete_topics(stack: contextlib.ExitStack, bootstrap: str, token: str) -> None:
    def delete() -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": bootstrap})
        names = [t for t in admin.list_topics(timeout=30).topics if token in t]
        if names:
            for future in admin.delete_topics(names, operation_timeout=30).values():
                future.result()

    stack.callback(delete)


def _streaming_df(spark: Any, directory: Path) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True)
    table = pa.Table.from_pylist(DF_ROWS, schema=pa.schema(
        [("id", pa.int64()), ("user_id", pa.int64()), ("value", pa.string())]))
    pq.write_table(table, directory / "part-0.parquet")
    return spark.readStream.schema(DF_SCHEMA).parquet(str(directory))


def run(example: Example, services: Callable[[str], Any], tmp: Path) -> None:
    """Run ``example``; ``services(need)`` gives the SparkSession (``"spark"``) or the base
    conninfo (``"postgres"``) or the bootstrap servers (``"kafka"``)."""
    module = _import(example.module)
    namespace: dict[str, Any] = dict(vars(module))
    token = secrets.token_hex(4)
    with contextlib.ExitStack() as stack:
        spark = services("spark") if "spark" in example.needs else None
        values: dict[str, Callable[[], Any]] = {
            "spark": lambda: spark,
            "df": lambda: _streaming_df(spark, tmp / "df-source"),
            "ckpt": lambda: str(tmp / "checkpoint"),
            "path": lambda: str(_mkdir(tmp / "path")),
            "conninfo": lambda: _fresh_database(stack, services("postgres"), token),
            "mariadb_url": lambda: _fresh_mariadb(stack, services("mariadb"), token),
            "bootstrap": lambda: services("kafka"),
            "topic": lambda: f"example-{token}",
            "sink_id": lambda: f"example-{token}",
            "commit": lambda: commit,
        }
        for name in sorted(example.fixtures):
            namespace[name] = values[name]()
        if "bootstrap" in example.fixtures:
            _delete_topics(stack, namespace["bootstrap"], token)
        before = {q.id for q in spark.streams.active} if spark is not None else set()
        try:
            if example.kind == "doctest":
                _run_doctest(example, namespace)
            else:
                padded = "\n" * (example.lineno - 1) + example.source
                exec(compile(padded, str(example.path), "exec", dont_inherit=True), namespace)
            if spark is not None:
                _drive_queries(spark, before, "df" in example.fixtures)
        finally:
            if spark is not None:
                for query in spark.streams.active:
                    if query.id not in before:
                        query.stop()


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _run_doctest(example: Example, namespace: dict[str, Any]) -> None:
    test = doctest.DocTestParser().get_doctest(
        example.source, namespace, example.id, str(example.path), example.lineno - 1)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS, verbose=False)
    out: list[str] = []
    runner.run(test, out=out.append, clear_globs=False)
    if runner.failures:
        pytest.fail("".join(out), pytrace=False)


def _drive_queries(spark: Any, before: set[str], reads_df: bool) -> None:
    started = [q for q in spark.streams.active if q.id not in before]
    for query in started:
        query.processAllAvailable()
        rows = sum(int(p["numInputRows"]) for p in query.recentProgress)
        query.stop()
        if reads_df and rows != len(DF_ROWS):
            raise AssertionError(f"the example's query {query.name or query.id} read {rows} "
                                 f"rows, not the {len(DF_ROWS)} of df")


def run_recorded(example: Example, config: pytest.Config, services: Callable[[str], Any],
                 tmp: Path) -> None:
    """:func:`run`, counted in the session's :class:`Tally` (a skip with its reason)."""
    record = tally(config)
    if example.skip is not None:
        record.skipped.append((example.id, example.skip))
        pytest.skip(f"{example.id} ({example.location}): {example.skip}")
    try:
        run(example, services, tmp)
    except pytest.skip.Exception as exc:  # a service that is not there (outside CI)
        record.skipped.append((example.id, str(exc)))
        raise
    except BaseException:
        record.ran.append(example.id)
        record.failed.append(example.id)
        raise
    record.ran.append(example.id)
