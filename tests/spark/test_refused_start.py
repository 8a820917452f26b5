"""Spark >= 4.1 refuses to start a query whose offset log holds only what a killed driver's
first offset write left: :func:`connectors.await_termination` raises that error with a note
(and an ERROR log line) naming ``connectors doctor`` and the safe fix."""

from __future__ import annotations

import logging
import sys

import pytest

from connectors import await_termination
from connectors.spark._stop import refused_start_hint

REFUSAL = ("[STREAM_FAILED] Query [id = 1785, runId = a5bb] terminated with exception: "
           "[STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY] The checkpoint location "
           "file:/tmp/ck/offsets should be empty on batch 0")


class StreamingQueryException(Exception):
    pass


class FailedQuery:
    id = "q-1"

    def __init__(self, error: Exception) -> None:
        self.error = error

    def awaitTermination(self, timeout: float | None = None) -> bool:
        raise self.error


def test_the_refusal_is_raised_with_the_doctor_and_the_fix(
        caplog: pytest.LogCaptureFixture) -> None:
    error = StreamingQueryException(REFUSAL)
    with caplog.at_level(logging.ERROR, logger="connectors.spark._stop"), \
            pytest.raises(StreamingQueryException) as raised:
        await_termination(FailedQuery(error))
    assert raised.value is error  # the query's own error, unchanged in type and text
    hint = refused_start_hint(error)
    assert hint is not None and "connectors doctor --checkpoint" in hint
    assert "offsets/.0.<uuid>.tmp" in hint and "remove only them" in hint
    assert [r.getMessage() for r in caplog.records] == [hint]
    if sys.version_info >= (3, 11):
        assert raised.value.__notes__ == [hint]


def test_other_failures_get_no_note(caplog: pytest.LogCaptureFixture) -> None:
    error = StreamingQueryException("[STREAM_FAILED] division by zero")
    with caplog.at_level(logging.ERROR, logger="connectors.spark._stop"), \
            pytest.raises(StreamingQueryException):
        await_termination(FailedQuery(error))
    assert refused_start_hint(error) is None
    assert not caplog.records
    assert not getattr(error, "__notes__", [])
    # the same error class about another directory (a state store's) is not this case
    assert refused_start_hint(Exception(
        "[STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY] file:/tmp/ck/state/0")) is None
