"""What the operator commands report, and how it is printed (tables, or ``--json``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "EXIT_ATTENTION",
    "EXIT_OK",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "Finding",
    "Lingering",
    "RecoverReport",
    "SinkStatus",
    "render_table",
    "to_json",
]

#: Exit codes of every command.
EXIT_OK = 0  # nothing to do, invariants hold
EXIT_ATTENTION = 1  # something needs an operator: lingering transactions, a broken invariant
EXIT_USAGE = 2  # bad arguments (argparse's own code)
EXIT_UNREACHABLE = 3  # the target (database, broker, table) could not be read


@dataclass(frozen=True)
class Lingering:
    """A transaction of a sink that is open or prepared on the target."""

    transaction: str
    batch_id: int | None
    age_s: float | None
    decided: bool | None = None  # listed in a decision (will be committed), if known
    detail: str = ""


@dataclass
class SinkStatus:
    """One sink's state on one target."""

    sink_id: str
    target: str
    query_id: str | None = None
    last_committed: int | None = None
    unfinished: list[int] = field(default_factory=list)
    lingering: list[Lingering] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: A fan-out's ledger (``connectors.FanOut``): the targets its decisions name.
    fan_out_targets: list[str] = field(default_factory=list)
    #: How the bound query came to the sink: each ``resume_from`` link, oldest first
    #: (``Lineage.to_json()``: query, the query it resumed, the savepoint's batch, times).
    lineage: list[dict[str, object]] = field(default_factory=list)

    @property
    def needs_attention(self) -> bool:
        return bool(self.unfinished or self.lingering)


@dataclass
class RecoverReport:
    """What ``recover`` did for one sink."""

    sink_id: str
    target: str
    committed: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    left: list[Lingering] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Finding:
    """One check of ``doctor``."""

    check: str
    ok: bool
    detail: str
    severity: str = "error"  # "error" breaks the invariant; "warning" only informs


def to_json(items: Sequence[Any]) -> str:
    return json.dumps([asdict(i) for i in items], indent=2, sort_keys=True, default=str)


def render_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table: columns padded to their widest cell."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
