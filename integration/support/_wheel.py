"""The package as users install it: its wheel, a clean virtual environment with it, and the
environment variables a user's shell would not have (this repository's, Spark's).

Used by the tests that must not see this checkout: ``integration/spark/test_provided_pyspark.py``
(a platform's pyspark) and ``integration/spark/test_cluster_submit.py`` (a packed environment
submitted to a standalone cluster).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: What a user's shell does not have: this checkout's path, an active venv, a Spark home.
_NOT_THE_USERS = ("PYTHONPATH", "VIRTUAL_ENV", "SPARK_HOME", "PYSPARK_PYTHON",
                  "PYSPARK_DRIVER_PYTHON")


def package_wheel(work: Path) -> Path:
    """The package's wheel: ``$EOS_WHEEL_DIR``'s (CI's wheel lane built it) or one built
    into ``work/dist`` here."""
    given = os.environ.get("EOS_WHEEL_DIR")
    out = Path(given) if given else work / "dist"
    if not given:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--disable-pip-version-check", "-w", str(out), str(REPO)],
                       check=True, timeout=600)
    (wheel,) = out.glob("spark_exactly_once-*.whl")
    return wheel


def clean_environ() -> dict[str, str]:
    """This process's environment without :data:`_NOT_THE_USERS`."""
    env = {k: v for k, v in os.environ.items() if k not in _NOT_THE_USERS}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def user_venv(where: Path, requirements: Sequence[str]) -> Path:
    """A new virtual environment at ``where`` with ``requirements`` pip-installed (as a user
    would, from the package index and pip's cache); returns its ``bin/python``."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=300)
    python = where / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", *requirements],
                   check=True, timeout=900, env=clean_environ())
    return python


def installed(python: Path) -> set[str]:
    """The distributions installed for ``python``, names normalised (``delta-spark``)."""
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format", "json"],
                            capture_output=True, text=True, check=True,
                            env=clean_environ()).stdout
    return {p["name"].lower().replace("_", "-") for p in json.loads(listed)}
