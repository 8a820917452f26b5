"""ObstoreStore over obstore's in-memory store (no service): what an absent object reads as,
and the store's settings."""

from __future__ import annotations

import pytest

pytest.importorskip("obstore")  # the [delta] extra's (CI's newest lane installs no [delta])

from connectors.lake.store import ObstoreStore


@pytest.fixture
def store() -> ObstoreStore:
    return ObstoreStore("memory:///ledger")


def test_an_absent_object_reads_as_none_and_deletes_quietly(store: ObstoreStore) -> None:
    # obstore 0.12 raises the builtin FileNotFoundError (not obstore's NotFoundError) for a
    # missing object: it must read as "absent", not as a failure worth a retry.
    assert store.read("binding.json") is None
    store.delete("decisions/00000000000000000001.json")


def test_create_and_replace_are_conditional(store: ObstoreStore) -> None:
    version = store.create("binding.json", b"a")
    assert version is not None
    assert store.create("binding.json", b"b") is None  # another writer created it first
    assert store.read("binding.json") == (b"a", version)
    newer = store.replace("binding.json", b"c", version)
    assert newer is not None and store.replace("binding.json", b"d", version) is None
    assert store.read("binding.json") == (b"c", newer)
    assert store.replace("absent.json", b"x", version) is None
    assert sorted(store.keys("")) == ["binding.json"]


@pytest.mark.parametrize("key", ["aws_allow_http", "allow_http", "AWS_ALLOW_HTTP"])
def test_allow_http_never_reaches_obstores_s3_config(key: str) -> None:
    # With an http:// endpoint the flag used to stay in the S3 config, where obstore
    # panics (a BaseException) when it builds the store.
    ObstoreStore("s3a://bucket/t/_connectors/s", {
        "endpoint": "http://127.0.0.1:1", key: "true", "aws_region": "us-east-1",
        "aws_access_key_id": "id", "aws_secret_access_key": "never-shown"})
