"""Each source's offset log line -> its position and starting option, or why none (the
table of docs/design/savepoints.md)."""

from __future__ import annotations

import json

import pytest

from connectors.savepoints._positions import SourcePosition, position_of

KAFKA = '{"orders":{"0":12,"1":7,"10":3},"audit":{"0":5}}'
DELTA = ('{"sourceVersion":1,"reservoirId":"5f76cb07","reservoirVersion":%d,"index":%d,'
         '"isStartingVersion":%s}')


def test_kafka_end_offsets_are_the_new_querys_starting_offsets_as_written() -> None:
    p = position_of(0, KAFKA)
    assert p.kind == "kafka" and p.resumable
    assert p.options == {"startingOffsets": KAFKA}  # the end offsets: the next records
    assert json.loads(p.options["startingOffsets"])["orders"]["10"] == 3
    assert p.detail == "audit: 0@5; orders: 0@12, 1@7, 10@3"  # partitions in number order


def test_delta_at_the_start_of_a_version_resumes_with_starting_version() -> None:
    p = position_of(1, DELTA % (4, -1, "false"))
    assert (p.index, p.kind, p.resumable) == (1, "delta", True)
    assert p.options == {"startingVersion": "4"}
    assert "version 4" in p.detail and "5f76cb07" in p.detail


@pytest.mark.parametrize(("line", "reason"), [
    (DELTA % (4, 2, "false"), "inside version 4 of the Delta table (after file index 2)"),
    (DELTA % (4, -20, "false"), "inside version 4"),  # a schema change's index (format 3)
    (DELTA % (3, 1, "true"), "initial snapshot (version 3, file 1)"),
    (DELTA % (3, -1, "true"), "initial snapshot"),
])
def test_delta_inside_a_version_or_the_initial_snapshot_is_refused(line: str, reason: str
                                                                   ) -> None:
    p = position_of(0, line)
    assert p.kind == "delta" and not p.resumable and p.options == {}
    assert reason in (p.refusal or "")


@pytest.mark.parametrize(("line", "kind", "reason"), [
    ("9", "rate", "rate source"),
    ('{"offset":15,"timestamp":3000}', "rate-micro-batch", "no option to start at an offset"),
    ('{"logOffset":0}', "file", "no starting position"),
    (None, "none", "no offset yet"),
    ('{"something":"else"}', "unknown", "does not know"),
    ("not json", "unknown", "does not know"),
    ('{"t":{"0":"12"}}', "unknown", "does not know"),  # offsets are numbers
    ('{"t":{}}', "unknown", "does not know"),
    ("true", "unknown", "does not know"),
])
def test_sources_without_a_starting_position_are_refused_with_the_reason(
        line: str | None, kind: str, reason: str) -> None:
    p = position_of(2, line)
    assert (p.index, p.kind, p.resumable, p.options) == (2, kind, False, {})
    assert reason in (p.refusal or "")


def test_a_position_survives_json() -> None:
    for p in (position_of(0, KAFKA), position_of(1, "9"), position_of(2, None)):
        assert SourcePosition.from_json(json.loads(json.dumps(p.to_json()))) == p
