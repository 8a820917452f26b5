"""The docstring examples of ``connectors/`` that need Spark, PostgreSQL, MariaDB or Kafka
(issue 19).

The collector and its conventions are in ``tests/_examples.py``; the examples that need
nothing run in ``tests/test_docstring_examples.py``. Each example gets only the services
it needs (the ``spark``, ``postgres_conninfo``, ``mariadb_url`` and ``kafka_bootstrap``
fixtures), a fresh PostgreSQL or MariaDB database, unique Kafka names and fresh
directories; every streaming query it starts is driven to the end of its input and
stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests import _examples

pytestmark = pytest.mark.integration

_FIXTURE_OF_NEED = {"spark": "spark", "postgres": "postgres_conninfo",
                    "kafka": "kafka_bootstrap", "mariadb": "mariadb_url"}


@pytest.mark.parametrize("example", _examples.params(_examples.collection().integration))
def test_example(example: _examples.Example, request: pytest.FixtureRequest,
                 tmp_path: Path) -> None:
    def services(need: str) -> Any:
        return request.getfixturevalue(_FIXTURE_OF_NEED[need])

    _examples.run_recorded(example, request.config, services, tmp_path)
