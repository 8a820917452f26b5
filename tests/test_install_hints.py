"""The distribution is ``spark-exactly-once``: ``pip install "connectors[...]"`` would install an
unrelated project of that name from the package index, so no file may still say it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STALE = re.compile(r"(?<![\w.-])connectors\\?\[")  # also connectors\[ in a regex


def test_no_install_hint_names_the_old_distribution() -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    stale = []
    for name in filter(None, files):
        path = REPO / name
        if name == "tests/test_install_hints.py" or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        stale += [f"{name}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
                  if STALE.search(line)]
    assert not stale, "install hints naming the old distribution 'connectors':\n" + \
        "\n".join(stale)


def test_the_distribution_and_its_own_extras_carry_the_new_name() -> None:
    try:
        import tomllib
    except ImportError:  # Python 3.10: pytest's own dependency tomli is the same parser
        import tomli as tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == "spark-exactly-once"
    extras = project["optional-dependencies"]
    assert extras["all"] == ["spark-exactly-once[postgres,kafka,delta,iceberg,mariadb]"]
    assert any(d.startswith("spark-exactly-once[") for d in extras["dev"])
    assert project["scripts"] == {"connectors": "connectors.cli:main"}
