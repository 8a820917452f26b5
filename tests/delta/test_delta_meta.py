"""The userMetadata tag of the sink's Delta commits: round trip, and foreign metadata."""

from __future__ import annotations

import json

import pytest

from connectors.delta import CommitTag, parse_user_metadata


def test_tag_round_trips_through_user_metadata() -> None:
    tag = CommitTag("events", "events.g1", 7, query_id="q", run_id="r")
    assert parse_user_metadata(tag.to_json()) == tag


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "not json",
        "[1, 2]",
        json.dumps({"other": 1}),
        json.dumps({"connectors": {"v": 2, "sink": "s", "app": "s", "batch": 1}}),
        json.dumps({"connectors": {"v": 1, "sink": "s", "app": "s", "batch": "1"}}),
        json.dumps({"connectors": {"v": 1, "sink": "s", "app": "s", "batch": True}}),
        json.dumps({"connectors": {"v": 1, "sink": "s", "batch": 1}}),
    ],
)
def test_foreign_or_malformed_metadata_is_never_a_sink_commit(text: str | None) -> None:
    assert parse_user_metadata(text) is None
