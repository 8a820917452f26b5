"""pytest plugin of ``connectors.testing``: opt in with ``-p connectors.testing.plugin`` (or
``pytest_plugins = ["connectors.testing.plugin"]`` in your top-level conftest.py).

Fixtures:

- ``crash_points``: the :mod:`connectors.core.protocol.crash` module, disarmed before and after
  the test (arm in-process crashes with ``crash_points.arm(...)``).
- ``crash_log``: a file path exported as ``CONNECTORS_CRASH_LOG`` for child processes;
  read it to prove a crash point was reached.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from connectors.core.protocol import crash


@pytest.fixture
def crash_points() -> Iterator[ModuleType]:
    crash.disarm_all()
    yield crash
    crash.disarm_all()


@pytest.fixture
def crash_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "crash-points-reached.log"
    monkeypatch.setenv(crash.ENV_CRASH_LOG, str(path))
    return path
