"""Shared fixtures of the fast unit tests (no Spark JVM, no network).

Every test starts and ends with no crash armed in-process and no crash spec in the
environment, so a test that arms a crash point and fails cannot crash the next one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from connectors.core.protocol import crash


@pytest.fixture(autouse=True)
def _no_crash_armed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(crash.ENV_CRASH_AT, raising=False)
    monkeypatch.delenv(crash.ENV_CRASH_LOG, raising=False)
    monkeypatch.delenv(crash.ENV_TEST_MODE, raising=False)
    # A lane that turns accelerators off for its integration tests (.ci/run's oldest) must
    # not change what the unit tests of the accelerators' gates see; they set it themselves.
    monkeypatch.delenv("CONNECTORS_ACCELERATORS", raising=False)
    crash.disarm_all()
    yield
    crash.disarm_all()
