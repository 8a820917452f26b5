"""Fast tests: a connect failure's ``PQping`` answers "a server is there" (``OK``) unless a
test says otherwise, so that no test reaches for a host of its made-up connection strings
and each keeps the meaning it was written with (the server refused the settings)."""

from __future__ import annotations

import pytest
from psycopg import pq


@pytest.fixture(autouse=True)
def _server_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("connectors.postgres._reach._ping", lambda _conninfo: pq.Ping.OK)
