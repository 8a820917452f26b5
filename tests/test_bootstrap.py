"""``scripts/bootstrap``: the project's virtual environment on a stock Debian/Ubuntu Python.

A stock ``/usr/bin/python3`` refuses ``pip install`` outside a virtual environment (PEP 668),
and a minimal image lacks the venv module (Debian package ``python3-venv``, which provides
``ensurepip``). These tests hide ``ensurepip`` the way such a machine lacks it: a private mount
namespace (``unshare -m``) bind-mounts an empty directory over it, for the child only. That
needs root; CI runs as root, so under ``CI=true`` the tests fail rather than skip without it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEBIAN_PYTHON = "/usr/bin/python3"
NOBODY = "65534"


def _needs_namespaces() -> None:
    missing = [t for t in ("unshare", "setpriv") if shutil.which(t) is None]
    why = ("needs root (unshare -m)" if os.geteuid() != 0 else
           f"needs {', '.join(missing)}" if missing else
           f"needs Debian's {DEBIAN_PYTHON}" if not Path(DEBIAN_PYTHON).exists() else "")
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"bootstrap test {why}; CI runs as root on Debian")
        pytest.skip(why)


@pytest.fixture
def clone() -> Iterator[Path]:
    """A minimal world-readable copy of the repository: the script and pyproject.toml."""
    root = Path(tempfile.mkdtemp(prefix="eos-bootstrap-"))
    try:
        (root / "scripts").mkdir()
        shutil.copy(REPO / "scripts" / "bootstrap", root / "scripts" / "bootstrap")
        shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
        for p in (root, root / "scripts"):
            p.chmod(0o777)  # the non-root run creates .venv here
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _ensurepip_dir() -> str:
    out = subprocess.run([DEBIAN_PYTHON, "-c", "import ensurepip, os; "
                          "print(os.path.dirname(ensurepip.__file__))"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _without_venv_module(clone: Path, *cmd: str,
                         env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` where Debian's python3 has no ensurepip (python3-venv not installed)."""
    empty = clone / "empty"
    empty.mkdir()
    script = 'mount --bind "$0" "$1" && shift && exec "$@"'
    return subprocess.run(["unshare", "-m", "sh", "-c", script, str(empty), _ensurepip_dir(),
                           *cmd], capture_output=True, text=True, env=env, timeout=120,
                          check=False)


def _env(**extra: str) -> dict[str, str]:
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "HOME": "/tmp"}
    env.update(extra)
    return env


def test_non_root_without_venv_module_stops_with_the_exact_apt_command(clone: Path) -> None:
    _needs_namespaces()
    run = _without_venv_module(
        clone, "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
        "bash", str(clone / "scripts" / "bootstrap"), env=_env(PYTHON=DEBIAN_PYTHON))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "    sudo apt-get install -y python3-venv\n" in run.stderr, run.stderr
    assert not (clone / ".venv").exists()  # no half-made environment left behind


def test_root_without_venv_module_installs_python3_venv(clone: Path) -> None:
    """As root the script installs the package itself (here a recording stand-in for
    apt-get; the namespace keeps ensurepip hidden, so the retry fails and says so)."""
    _needs_namespaces()
    bindir = clone / "bin"
    bindir.mkdir()
    calls = clone / "apt-calls"
    (bindir / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bindir / "apt-get").chmod(0o755)
    run = _without_venv_module(clone, "bash", str(clone / "scripts" / "bootstrap"),
                               env=_env(PYTHON=DEBIAN_PYTHON,
                                        PATH=f"{bindir}:{os.environ['PATH']}"))
    assert run.returncode == 1
    assert calls.read_text().splitlines() == ["update -qq", "install -y -qq python3-venv"]
    assert "still fails after installing the venv module" in run.stderr
    assert not (clone / ".venv").exists()


def test_an_active_virtual_environment_is_used_as_it_is(clone: Path) -> None:
    """With $VIRTUAL_ENV set the script makes no .venv and hands that interpreter on."""
    venv = clone / "users-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # The user's environment already has everything: it sees this interpreter's packages and
    # carries the stamp of this pyproject.toml, so nothing is installed.
    site = next(venv.glob("lib/python*/site-packages"))
    paths = [p for p in sys.path if p.endswith("site-packages")] + [str(REPO)]
    # A lane without an extra (no delta-spark on the newest pyspark) stands it in, empty:
    # what is tested here is which interpreter is chosen, not the packages' contents.
    stubs = clone / "stubs"
    stubs.mkdir()
    missing = subprocess.run(  # asked outside pytest's sys.path, which holds tests/delta/
        [sys.executable, "-c", "import importlib.util as u; print(*(n for n in ('connectors', "
         "'pyspark', 'psycopg', 'confluent_kafka', 'delta', 'deltalake') "
         "if u.find_spec(n) is None))"],
        cwd=clone, capture_output=True, text=True, check=True).stdout.split()
    for name in missing:
        (stubs / f"{name}.py").touch()
    (site / "eos-test.pth").write_text("\n".join([*paths, str(stubs)]) + "\n")
    digest = subprocess.run(["sha256sum", str(clone / "pyproject.toml")], capture_output=True,
                            text=True, check=True).stdout[:16]
    (venv / f".spark-exactly-once-{digest}-dev").touch()  # the stamp of the [dev] set
    # scripts/test's set, then the demo's smaller one (the core, pyspark and Delta): dev's
    # stamp covers it, nothing is installed either time.
    for extras in ("dev", "spark,delta"):
        run = subprocess.run(["bash", "-c", '. "$0"; echo "EOS_PYTHON=$EOS_PYTHON"',
                              str(clone / "scripts" / "bootstrap")],
                             env=_env(VIRTUAL_ENV=str(venv), EOS_EXTRAS=extras),
                             capture_output=True, text=True, timeout=120, check=False)
        assert run.returncode == 0, run.stderr
        assert f"EOS_PYTHON={venv}/bin/python" in run.stdout.splitlines()
        assert "pip install" not in run.stdout, extras
    assert not (clone / ".venv").exists()
