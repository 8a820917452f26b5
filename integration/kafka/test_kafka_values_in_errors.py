"""No record values in KafkaSink's errors or logs unless ``values_in_errors=True``.

A real streaming query (``integration/kafka/_kafka_values_driver.py``, a child process on
``local[2]``) writes one micro-batch holding a bad record whose key and value are
distinctive strings: too large for ``message.max.bytes`` (checked in the shuffle's map
stage, or by the JVM aggregation of a ``topic`` column), or asking for a partition the
topic lacks (checked in the barrier slots). The query must fail with the sink's error,
commit nothing, and everything the driver printed (the traceback, the log lines, Spark's
own stderr) must not contain the key or the value; with ``values_in_errors=True`` the
error names them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from integration.kafka._kafka_values_driver import SECRET_KEY, SECRET_VALUE
from integration.support._driver import run_driver
from integration.support._kafka import KafkaTarget, target_fixture

pytestmark = [pytest.mark.integration, pytest.mark.slow]

kafka = target_fixture("values", partitions=2)

#: (case, barrier, what the error says)
CASES = [
    ("too_large", False, "bytes the producer/topic accept"),
    ("topic_column", False, "bytes the producer/topic accept"),
    ("partition", True, "but topic"),
]


@pytest.mark.parametrize(("case", "barrier", "message"), CASES)
@pytest.mark.parametrize("values_in_errors", [False, True])
def test_a_bad_record_s_key_and_value_appear_only_when_opted_in(
    tmp_path: Path, kafka: KafkaTarget, case: str, barrier: bool, message: str,
    values_in_errors: bool,
) -> None:
    args = ["--input", str(tmp_path / "in"), "--checkpoint", str(tmp_path / "ckpt"),
            "--topic", kafka.topic, "--sink-id", kafka.sink_id, "--bootstrap",
            kafka.bootstrap, "--case", case,
            *(["--barrier"] if barrier else []),
            *(["--values-in-errors"] if values_in_errors else [])]
    run = run_driver(args, module="integration.kafka._kafka_values_driver")
    assert run.returncode != 0, run.tail()
    assert "BadInputError" in run.output and message in run.output, run.tail(80)
    assert kafka.messages() == []  # the bad batch committed nothing
    if values_in_errors:
        assert SECRET_KEY in run.output, run.tail(80)
        assert SECRET_VALUE in run.output, run.tail(80)
    else:
        for secret in (SECRET_KEY, SECRET_VALUE):
            lines = [line for line in run.output.splitlines() if secret in line]
            assert not lines, lines[:5]
