"""The Kafka cluster ids of ``scripts/services`` (integration/services/): never one that
``kafka-storage format --cluster-id`` takes for an option, and a kept one that was is
replaced, so a checkout that drew one starts again. No Kafka, no Java."""

from __future__ import annotations

import base64
import json
import logging
import uuid
from pathlib import Path

import pytest

from integration.services import kafka_cluster, process

#: The bytes of a UUID whose URL-safe base64 begins with ``-`` (first 6 bits 62: 0xF8-0xFB).
DASH_BYTES = bytes([0xF8]) + bytes(15)
#: A checkout's state.json as the old generator could leave it (one start in 64).
DASH_ID = base64.urlsafe_b64encode(DASH_BYTES).decode().rstrip("=")


def _decoded(cluster_id: str) -> bytes:
    return base64.urlsafe_b64decode(cluster_id + "==")


def test_the_dash_id_is_the_case_that_failed() -> None:
    assert DASH_ID.startswith("-")
    assert len(DASH_ID) == 22


def test_many_new_ids_are_uuids_in_base64url_that_never_begin_with_a_dash() -> None:
    ids = [kafka_cluster._new_cluster_id() for _ in range(20_000)]
    # One in 64 random UUIDs begins with "-": 20,000 draws meet ~312 of them.
    for cluster_id in ids:
        assert len(cluster_id) == 22, cluster_id
        assert not cluster_id.startswith("-"), cluster_id
        assert set(cluster_id) <= set(
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        ), cluster_id
        raw = _decoded(cluster_id)
        assert len(raw) == 16
        assert base64.urlsafe_b64encode(raw).decode().rstrip("=") == cluster_id
    assert len(set(ids)) == len(ids)
    # The generator still draws from all 64 first characters but "-" (not, say, letters only).
    assert len({cluster_id[0] for cluster_id in ids}) == 63


def test_a_draw_that_begins_with_a_dash_is_drawn_again(monkeypatch: pytest.MonkeyPatch) -> None:
    good = uuid.UUID(bytes=bytes(range(16)))
    draws = iter([uuid.UUID(bytes=DASH_BYTES), uuid.UUID(bytes=DASH_BYTES), good])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(draws))
    assert kafka_cluster._new_cluster_id() == base64.urlsafe_b64encode(good.bytes).decode()[:22]


def test_a_kept_dash_id_is_replaced_before_the_storage_is_formatted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("EOS_SERVICES_DIR", str(tmp_path / "services"))
    state = {"kafka": {"cluster_id": DASH_ID, "port": 12345, "controller_port": 12346}}
    process._save_state(state)
    data_dir = tmp_path / "services" / "kafka" / "data"
    data_dir.mkdir(parents=True)

    section = process._section(process._load_state(), "kafka")
    with caplog.at_level(logging.WARNING, logger="connectors.services"):
        cluster_id = kafka_cluster._cluster_id_for_start(section, data_dir)
    assert cluster_id != DASH_ID
    assert not cluster_id.startswith("-")
    assert len(_decoded(cluster_id)) == 16
    assert section["cluster_id"] == cluster_id  # kept for the next start
    assert DASH_ID in caplog.text
    # Asked again (the next start), the replacement stays.
    assert kafka_cluster._cluster_id_for_start(section, data_dir) == cluster_id


def test_a_good_kept_id_stays(tmp_path: Path) -> None:
    kept = "5FAD5d5QSea9ZPI7i8Z-AA"
    section: dict[str, object] = {"cluster_id": kept}
    assert kafka_cluster._cluster_id_for_start(section, tmp_path) == kept
    assert section == {"cluster_id": kept}


def test_without_state_the_formatted_storage_keeps_its_id(tmp_path: Path) -> None:
    (tmp_path / "meta.properties").write_text("version=1\ncluster.id=5FAD5d5QSea9ZPI7i8Z-AA\n")
    section: dict[str, object] = {}
    assert kafka_cluster._cluster_id_for_start(section, tmp_path) == "5FAD5d5QSea9ZPI7i8Z-AA"


def test_formatted_storage_is_left_alone_whatever_id_is_kept(tmp_path: Path) -> None:
    # The format already ran (it is not run again), so the kept id is not replaced.
    (tmp_path / "meta.properties").write_text(f"version=1\ncluster.id={DASH_ID}\n")
    section: dict[str, object] = {"cluster_id": DASH_ID}
    assert kafka_cluster._cluster_id_for_start(section, tmp_path) == DASH_ID


def test_a_missing_id_is_drawn_and_kept(tmp_path: Path) -> None:
    section: dict[str, object] = {}
    cluster_id = kafka_cluster._cluster_id_for_start(section, tmp_path)
    assert section["cluster_id"] == cluster_id
    assert kafka_cluster._CLUSTER_ID.fullmatch(cluster_id)
    json.dumps(section)  # state.json can hold it
