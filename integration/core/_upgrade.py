"""Upgrade tests: run a driver program of an earlier release's tree, or of this one.

As a program (``python -m <launcher> MODULE ARGS...``) it names the ``connectors`` it
imported (``connectors <version> from <file>``) and then runs ``MODULE`` as ``__main__``
with ``ARGS``. The same file is copied into a release tree (:func:`release_tree`) as
:data:`LAUNCHER`, so a test can prove which tree's code each driver ran. The launcher part
uses the standard library and ``connectors`` only: the release tree has no ``integration``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from integration.support._driver import DriverRun

__all__ = ["LAUNCHER", "connectors_of", "release_tree", "run_tree"]

#: The launcher's module name inside a release tree.
LAUNCHER = "upgrade_launch"


def release_tree(root: Path, commit: str) -> Path:
    """The package and examples as of ``commit`` (``git archive`` of this clone's history,
    as the Kafka order test takes its release), with the launcher beside them. A history
    without ``commit`` fails the test (never a skip)."""
    from integration.kafka.test_kafka_order import _release_tree

    tree = _release_tree(root, commit)
    shutil.copy(Path(__file__), tree / f"{LAUNCHER}.py")
    return tree


def connectors_of(root: Path) -> str:
    """The line the launcher prints for a driver that imported ``root``'s connectors."""
    return f" from {root / 'connectors' / '__init__.py'}"


def run_tree(tree: Path | None, module: str, args: list[str], **kwargs: Any) -> DriverRun:
    """Run ``module`` (a driver program) with ``args`` from ``tree`` (None: this tree);
    ``kwargs`` go to :func:`integration.support._driver.run_driver` (crash, crash_log, ...). The
    run must show it imported that tree's ``connectors``."""
    from integration.support._driver import REPO, run_driver

    root = REPO if tree is None else tree
    launcher = "integration.core._upgrade" if tree is None else LAUNCHER
    run = run_driver([module, *args], module=launcher, root=root, **kwargs)
    assert connectors_of(root) in run.output, (
        f"the driver did not run {root}'s connectors:\n{run.tail()}")
    return run


def main(argv: list[str]) -> None:
    import runpy

    import connectors

    if not argv:
        raise SystemExit("usage: python -m upgrade_launch MODULE [ARGS...]")
    print(f"connectors {connectors.__version__} from {connectors.__file__}",
          file=sys.stderr, flush=True)
    sys.argv = [argv[0], *argv[1:]]
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
