"""pytest configuration for the integration tests (real PostgreSQL, Kafka and Spark).

Service fixtures live in ``integration/_fixtures_services.py`` and are re-exported here:
``postgres_conninfo``, ``kafka_bootstrap`` (session-scoped), ``native_postgres`` and
``native_kafka`` (restart hooks). See that module for how services are found or started.

Add further fixtures (e.g. Spark) below the re-export block; extend ``pytest_configure``
instead of defining a second one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The fixtures import ``integration._services``: make the repository root importable even
# under ``--import-mode=importlib`` or when pytest is run from another directory.
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from integration._fixtures_services import (  # noqa: E402
    docker_compose_file,
    eos_services,
    kafka_bootstrap,
    native_kafka,
    native_postgres,
    postgres_conninfo,
    register_markers,
)

__all__ = [
    "docker_compose_file",
    "eos_services",
    "kafka_bootstrap",
    "native_kafka",
    "native_postgres",
    "postgres_conninfo",
]


def pytest_configure(config: pytest.Config) -> None:
    register_markers(config)
