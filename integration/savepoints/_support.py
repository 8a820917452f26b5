"""What the savepoint tests share: the Kafka input topic and ``connectors savepoint``
(through :func:`integration.support._driver.run_cli`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.support._driver import run_cli
from integration.support._kafka import KafkaTarget

#: The driver every savepoint test runs (``_job.py``'s docstring has its flags).
JOB = "integration.savepoints._job"
#: Records in the input topic before the old query, and added before the changed one.
OLD, NEW = 1500, 1000


def kafka_source(bootstrap: str, monkeypatch: pytest.MonkeyPatch, prefix: str
                 ) -> Iterator[KafkaTarget]:
    """A test's input topic (3 partitions) holding ids ``0..OLD-1``; deleted afterwards.
    The drivers read the broker from ``EOS_KAFKA_BOOTSTRAP``."""
    monkeypatch.setenv("EOS_KAFKA_BOOTSTRAP", bootstrap)
    target = KafkaTarget(bootstrap, prefix=prefix, partitions=3)
    target.create()
    target.produce_input(target.topic, OLD)
    yield target
    target.cleanup()


def take(checkpoint: Path, sink_id: str, out: Path, *args: str) -> tuple[int, Any, str]:
    """``connectors savepoint --checkpoint ... --sink-id ... --output OUT ARGS --json``:
    (exit code, the printed savepoint, stderr)."""
    return run_cli("savepoint", "--checkpoint", str(checkpoint), "--sink-id", sink_id,
                   "--output", str(out), *args, timeout=300)


def savepoint(checkpoint: Path, sink_id: str, out: Path, *args: str) -> dict[str, Any]:
    """:func:`take`, which must succeed; the savepoint it printed is the one in ``out``."""
    code, found, err = take(checkpoint, sink_id, out, *args)
    assert code == 0, err
    assert found == json.loads(out.read_text())
    return dict(found)
