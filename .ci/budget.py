"""CI's time budget, printed at the end of ``.ci/run``: each lane's wall time, the slowest
tests of every pytest run (from their JUnit XML reports) and the run's total against the
budget. It prints; it never fails the run (machines are noisy).

    python .ci/budget.py LANES_FILE REPORTS_DIR TOTAL_SECONDS [--budget 2700] [--top 20]
    python .ci/budget.py --file-seconds integration/file_seconds.json REPORTS_DIR/test-all.xml

The second form writes each test file's seconds (the sum of its tests') from the test lane's
report: the table ``integration/conftest.py`` orders the files by, longest first.

LANES_FILE has a line per lane, ``name<TAB>seconds<TAB>result``; REPORTS_DIR holds the
``*.xml`` reports (``pytest --junitxml``), one per pytest run, named after the lane and the
run (``test-all.xml``, ``oldest.xml``). Standard library only: it runs in any Python.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

HARD_LIMIT = 5400  # past 90 min nothing lands


def lanes(path: Path) -> list[tuple[str, int | None, str]]:
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        name, secs, result = [*line.split("\t"), "", ""][:3]
        rows.append((name, int(secs) if secs.isdigit() else None, result))
    return rows


def slowest(reports: Path, top: int) -> list[tuple[float, str, str]]:
    """The ``top`` longest test cases over every report: (seconds, run, test id)."""
    cases: list[tuple[float, str, str]] = []
    for xml in sorted(reports.glob("*.xml")):
        try:
            root = ET.parse(xml).getroot()  # noqa: S314 - this run's own pytest reports
        except ET.ParseError as exc:  # a run killed mid-write: say so, keep the others
            print(f"budget: {xml.name} unreadable ({exc})", file=sys.stderr)
            continue
        for case in root.iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            cases.append((float(case.get("time") or 0.0), xml.stem, name))
    cases.sort(reverse=True)
    return cases[:top]


REPO = Path(__file__).resolve().parents[1]


def test_file(classname: str) -> str | None:
    """``integration.postgres.test_x`` (or ``tests.core.test_y.TestZ``) -> its file's
    repository-relative path, when that file exists."""
    parts = classname.split(".")
    for n in range(len(parts), 0, -1):
        rel = "/".join(parts[:n]) + ".py"
        if (REPO / rel).is_file():
            return rel
    return None


def file_seconds(report: Path) -> dict[str, float]:
    """Seconds per test file in one JUnit report, longest first."""
    totals: dict[str, float] = {}
    for case in ET.parse(report).getroot().iter("testcase"):  # noqa: S314 - our own report
        rel = test_file(case.get("classname", ""))
        if rel:
            totals[rel] = totals.get(rel, 0.0) + float(case.get("time") or 0.0)
    return dict(sorted(((k, round(v, 1)) for k, v in totals.items()), key=lambda kv: -kv[1]))


def render(lane_rows: list[tuple[str, int | None, str]], cases: list[tuple[float, str, str]],
           total: int, budget: int) -> str:
    out = [f"################ CI time budget: {total} s of {budget} s "
           f"({100 * total / budget:.0f} %; hard limit {HARD_LIMIT} s) ################",
           "", "lane                        wall s  result"]
    for name, secs, result in lane_rows:
        out.append(f"{name:<26} {'?' if secs is None else secs:>7}  {result}")
    out += ["", f"the {len(cases)} slowest tests (every pytest run; parallel runs overlap)",
            "     s  run          test"]
    for secs, run, name in cases:
        out.append(f"{secs:>6.0f}  {run:<12} {name}")
    headroom = budget - total
    out += ["", f"total {total} s: {'within' if headroom >= 0 else 'OVER'} the budget of "
            f"{budget} s by {abs(headroom)} s"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--file-seconds"] and len(argv) == 3:
        table = file_seconds(Path(argv[2]))
        Path(argv[1]).write_text(json.dumps(table, indent=1) + "\n")
        print(f"budget: {len(table)} files, {sum(table.values()):.0f} s, written to {argv[1]}")
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lanes", type=Path)
    parser.add_argument("reports", type=Path)
    parser.add_argument("total", type=int)
    parser.add_argument("--budget", type=int, default=2700)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args(argv)
    print(render(lanes(args.lanes), slowest(args.reports, args.top), args.total, args.budget))
    return 0


if __name__ == "__main__":
    sys.exit(main())
