"""The fenced code blocks of the user-facing Markdown, and what the docs test does with each.

Every fenced block of ``README.md`` and ``docs/*.md`` has an info string, whose first word
decides its fate (:func:`classify`):

- ``python``: executed. The block's first line names the file it is saved as
  (``# quickstart_postgres.py: ...``), so that a later block can import an earlier one;
  ``test_*.py`` files run under pytest.
- ``bash``, ``sh``, ``shell``, ``console``: *run by .ci/run* when every command in it is one
  the CI script runs verbatim (``RUN_BY_CI`` in the test), else executed with
  ``bash -euo pipefail``. A block mixing both is refused.
- ``sql``: executed against PostgreSQL.
- ``text``: output or a diagram, not run.
- ``mermaid``: a diagram GitHub draws (docs/architecture.md's package picture), not run.
- any other info string, or none: refused.

A block that needs what CI cannot have is *illustrative*: an HTML comment
``<!-- illustrative: REASON -->`` on the line right above its opening fence, and the same
REASON in the visible line above that comment. Illustrative blocks are not run.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

REPO_ROOT = Path(__file__).resolve().parents[2]

PYTHON_LANGS = frozenset({"python"})
SHELL_LANGS = frozenset({"bash", "sh", "shell", "console"})
SQL_LANGS = frozenset({"sql"})
TEXT_LANGS = frozenset({"text", "mermaid"})

EXECUTED = "executed"
RUN_BY_CI = "run by .ci/run"
ILLUSTRATIVE = "illustrative"
NOT_RUN = "not run (output or diagram)"

_FENCE = re.compile(r"^(`{3,}|~{3,})\s*(.*?)\s*$")
_ILLUSTRATIVE = re.compile(r"^<!--\s*illustrative:\s*(.+?)\s*-->\s*$")
_PY_NAME = re.compile(r"^#\s*([A-Za-z_][A-Za-z0-9_]*\.py)\b")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its info string and its text."""

    doc: str  # path relative to the repository, e.g. "docs/postgres.md"
    line: int  # 1-based line of the opening fence
    info: str
    code: str
    illustrative: str | None = None  # the reason, when marked illustrative
    visible_reason: str = ""  # the nearest non-blank line above the marker

    @property
    def lang(self) -> str:
        return self.info.split()[0].lower() if self.info.strip() else ""

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def python_name(self) -> str | None:
        """The file a python block is saved as, from its first line ``# NAME.py``."""
        first = self.code.splitlines()[0] if self.code.strip() else ""
        m = _PY_NAME.match(first)
        return m.group(1) if m else None


def user_docs(root: Path = REPO_ROOT) -> list[Path]:
    """README.md and docs/*.md: the pages a user reads."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def parse_markdown(text: str, doc: str) -> list[Block]:
    """Every fenced block of ``text`` (top-level ``` or ~~~ fences)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        fence, info = m.group(1), m.group(2)
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines):
            close = _FENCE.match(lines[i])
            if (close is not None and close.group(1)[0] == fence[0]
                    and len(close.group(1)) >= len(fence) and not close.group(2)):
                break
            body.append(lines[i])
            i += 1
        else:
            raise ValueError(f"{doc}:{start + 1}: fenced block never closed")
        i += 1
        reason, visible = None, ""
        above = lines[start - 1] if start > 0 else ""
        marker = _ILLUSTRATIVE.match(above.strip())
        if marker is not None:
            reason = marker.group(1)
            for j in range(start - 2, -1, -1):
                if lines[j].strip():
                    visible = lines[j].strip()
                    break
        blocks.append(Block(doc, start + 1, info, "\n".join(body) + "\n", reason, visible))
    return blocks


def parse_docs(root: Path = REPO_ROOT) -> list[Block]:
    out: list[Block] = []
    for path in user_docs(root):
        out += parse_markdown(path.read_text(encoding="utf-8"), str(path.relative_to(root)))
    return out


# ------------------------------------------------------------------------- shell commands


def _strip_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` outside quotes, after a blank)."""
    quote = ""
    for k, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or line[k - 1] in " \t"):
            return line[:k].rstrip()
    return line.rstrip()


def shell_commands(code: str) -> list[str]:
    """The commands of a shell block: comments dropped, ``\\`` continuations joined."""
    commands: list[str] = []
    pending = ""
    for raw in code.splitlines():
        line = _strip_comment(raw).strip()
        if pending:
            line = f"{pending} {line}".strip()
            pending = ""
        if line.endswith("\\"):
            pending = line[:-1].strip()
            continue
        if line:
            commands.append(line)
    if pending:
        commands.append(pending)
    return commands


def ci_script_runs(command: str, ci_script: str) -> bool:
    """Whether ``ci_script`` runs ``command`` verbatim: on a code line (not a comment), at
    the start of a command, followed by the end of the command, a redirection or a pipe."""
    pattern = re.compile(r"(?:^|[;&|(]\s*)" + re.escape(command) + r"(?=$|\s|;|\))")
    for raw in ci_script.splitlines():
        line = _strip_comment(raw).strip()
        if line and pattern.search(line):
            return True
    return False


# ---------------------------------------------------------------------- classification


@dataclass
class Classified:
    """Each block's fate, and the problems that fail the test."""

    kinds: dict[Block, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[Block]:
        return [b for b, k in self.kinds.items() if k == kind]

    def counts(self) -> dict[str, int]:
        return dict(collections.Counter(self.kinds.values()))


def classify(blocks: Iterable[Block], run_by_ci: Mapping[str, str],
             readme: str = "README.md", readme_max_illustrative: int = 3) -> Classified:
    """Decide every block's fate (module docstring); unaccounted blocks are problems."""
    out = Classified()
    for b in blocks:
        lang = b.lang
        if b.illustrative is not None:
            if b.illustrative not in b.visible_reason:
                out.problems.append(
                    f"{b.where}: illustrative block: the visible line above its marker must "
                    f"give the reason ({b.illustrative!r}); it reads {b.visible_reason!r}")
            if lang not in PYTHON_LANGS | SHELL_LANGS | SQL_LANGS:
                out.problems.append(f"{b.where}: only runnable blocks can be illustrative "
                                    f"(info string {b.info!r})")
            out.kinds[b] = ILLUSTRATIVE
        elif lang in TEXT_LANGS:
            out.kinds[b] = NOT_RUN
        elif lang in PYTHON_LANGS:
            if b.python_name is None:
                out.problems.append(f"{b.where}: a python block must start with a line "
                                    "'# NAME.py: what it does' (the file a user saves it as)")
            out.kinds[b] = EXECUTED
        elif lang in SQL_LANGS:
            out.kinds[b] = EXECUTED
        elif lang in SHELL_LANGS:
            commands = shell_commands(b.code)
            credited = [c for c in commands if c in run_by_ci]
            if not commands:
                out.problems.append(f"{b.where}: a shell block without a command")
            elif credited and len(credited) != len(commands):
                out.problems.append(
                    f"{b.where}: the block mixes commands .ci/run runs ({credited}) with "
                    f"others ({[c for c in commands if c not in run_by_ci]}): split it")
            out.kinds[b] = RUN_BY_CI if credited else EXECUTED
        else:
            out.problems.append(
                f"{b.where}: fenced block with info string {b.info!r}: use python, bash, "
                "sql (run by the tests), text (output, diagrams) or mermaid (diagrams)")
    illustrative = [b for b in out.of_kind(ILLUSTRATIVE) if b.doc == readme]
    if len(illustrative) > readme_max_illustrative:
        out.problems.append(
            f"{readme} has {len(illustrative)} illustrative blocks, at most "
            f"{readme_max_illustrative} allowed: " + ", ".join(b.where for b in illustrative))
    return out


def executed_labels(blocks: Iterable[Block], kinds: Mapping[Block, str]) -> list[tuple[Block,
                                                                                       str]]:
    """The executed blocks with their labels: a python block's file name, else
    ``<lang>#<n>`` (n counts that language's executed blocks of the page from 0)."""
    counters: collections.Counter[tuple[str, str]] = collections.Counter()
    out = []
    for b in blocks:
        if kinds.get(b) != EXECUTED:
            continue
        if b.lang in PYTHON_LANGS and b.python_name:
            label = b.python_name
        else:
            family = "bash" if b.lang in SHELL_LANGS else b.lang
            label = f"{family}#{counters[b.doc, family]}"
            counters[b.doc, family] += 1
        out.append((b, label))
    return out


# ---------------------------------------------------------------------------- running


def scrub(text: str, secrets: Iterable[str]) -> str:
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    return text


@dataclass(frozen=True)
class Run:
    """One finished process: its exit code (negative: killed by that signal) and output."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def tail(self, secrets: Iterable[str] = (), chars: int = 4000) -> str:
        out = (f"$ {' '.join(self.args)}\nexit {self.returncode} after {self.seconds:.1f} s\n"
               f"--- stdout ---\n{self.stdout[-chars:]}\n--- stderr ---\n{self.stderr[-chars:]}")
        return scrub(out, secrets)


def run(args: list[str], *, cwd: Path, env: Mapping[str, str], timeout: float) -> Run:
    """Run ``args`` in its own process group; on timeout kill the whole group."""
    started = time.monotonic()
    proc = subprocess.Popen(args, cwd=cwd, env=dict(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n[killed after the test's timeout of {timeout:.0f} s]"
    finally:
        _reap_group(proc.pid)
    return Run(args, proc.returncode, out, err, time.monotonic() - started)


def _reap_group(pgid: int) -> None:
    """Kill what the process left in its group (a Spark JVM whose Python driver died)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


# ------------------------------------------------------------------- reading the targets


def exact(got: Iterable[Any], want: Iterable[Any], what: str) -> None:
    """Assert that ``got`` holds every row of ``want`` exactly once and nothing else."""
    have, need = collections.Counter(got), collections.Counter(want)
    missing, extra = need - have, have - need
    if missing or extra:
        raise AssertionError(
            f"{what}: {sum(need.values())} rows expected, {sum(have.values())} read: "
            f"{sum(missing.values())} missing (e.g. {sorted(missing)[:3]}), "
            f"{sum(extra.values())} extra or twice (e.g. {sorted(extra)[:3]})")


def delta_rows(table: Path) -> list[dict[str, Any]]:
    """The rows of a Delta table as a reader that follows the log sees them: the JSON
    commits' ``add`` actions minus their ``remove`` actions, read with pyarrow, with the
    partition columns' values (as the log's strings). Refuses what this small reader does
    not handle (checkpoints, deletion vectors) instead of guessing."""
    import pyarrow.parquet as pq

    log = table / "_delta_log"
    if any(log.glob("*.checkpoint*.parquet")):
        raise AssertionError(f"{log} has a checkpoint: this reader follows JSON commits only")
    files: dict[str, dict[str, Any]] = {}
    for commit in sorted(log.glob("[0-9]*.json")):
        for line in commit.read_text(encoding="utf-8").splitlines():
            action = json.loads(line)
            if "add" in action:
                if action["add"].get("deletionVector"):
                    raise AssertionError(f"{commit}: deletion vectors are not handled here")
                files[action["add"]["path"]] = action["add"]
            elif "remove" in action:
                files.pop(action["remove"]["path"], None)
    rows: list[dict[str, Any]] = []
    for path, add in sorted(files.items()):
        parts = add.get("partitionValues") or {}
        rows += [{**r, **parts} for r in pq.read_table(table / unquote(path)).to_pylist()]
    return rows


def postgres_rows(conninfo: str, query: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        return list(conn.execute(query).fetchall())


