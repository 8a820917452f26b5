"""LocalDeltaLog: the pure-Python reader of ``_delta_log`` (no JVM), on hand-made logs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from connectors.core.errors import ConfigurationError
from connectors.delta import LocalDeltaLog
from connectors.delta._log import RETENTION_KEY, parse_interval_ms

NOW_MS = 1_800_000_000_000


def _commit(root: Path, version: int, *actions: dict[str, Any]) -> None:
    log = root / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(a) for a in actions]
    (log / f"{version:020d}.json").write_text("\n".join(lines) + "\n")


def _meta(configuration: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metaData": {"id": "x", "configuration": configuration or {}}}


def _txn(app: str, version: int, updated: int | None = NOW_MS) -> dict[str, Any]:
    return {"txn": {"appId": app, "version": version, "lastUpdated": updated}}


def _checkpoint(path: Path, txns: list[tuple[str, int, int]], conf: dict[str, str]) -> None:
    txn_type = pa.struct([("appId", pa.string()), ("version", pa.int64()),
                          ("lastUpdated", pa.int64())])
    meta_type = pa.struct([("id", pa.string()),
                           ("configuration", pa.map_(pa.string(), pa.string()))])
    txn_col = [{"appId": a, "version": v, "lastUpdated": u} for a, v, u in txns] + [None]
    meta_col = [None] * len(txns) + [{"id": "x", "configuration": list(conf.items())}]
    table = pa.table({"txn": pa.array(txn_col, txn_type), "metaData": pa.array(meta_col,
                                                                                meta_type)})
    pq.write_table(table, path)


def reader(root: Path) -> LocalDeltaLog:
    return LocalDeltaLog(root, clock_ms=lambda: NOW_MS)


def test_no_log_means_no_table(tmp_path: Path) -> None:
    assert not reader(tmp_path).read().exists


def test_json_commits_give_the_last_version_per_app_id(tmp_path: Path) -> None:
    _commit(tmp_path, 0, {"commitInfo": {"operation": "WRITE"}}, _meta(), _txn("a", 0))
    _commit(tmp_path, 1, _txn("a", 1), _txn("b", 0))
    _commit(tmp_path, 2, {"commitInfo": {"userMetadata": "x"}})
    state = reader(tmp_path).read()
    assert state.exists and state.table_version == 2
    assert state.versions == {"a": 1, "b": 0}
    assert state.version("c") is None
    assert [v for v, _ in reader(tmp_path).commit_infos()] == [0, 2]


def test_checkpoint_then_later_commits(tmp_path: Path) -> None:
    _commit(tmp_path, 0, _meta(), _txn("a", 0))  # replaced by the checkpoint below
    _commit(tmp_path, 1, _txn("a", 5))
    _checkpoint(tmp_path / "_delta_log" / f"{1:020d}.checkpoint.parquet",
                [("a", 5, NOW_MS), ("z", 3, NOW_MS)], {"k": "v"})
    (tmp_path / "_delta_log" / f"{0:020d}.json").unlink()  # cleaned up by Delta
    (tmp_path / "_delta_log" / f"{1:020d}.json").unlink()
    _commit(tmp_path, 2, _txn("a", 6))
    state = reader(tmp_path).read()
    assert state.versions == {"a": 6, "z": 3}
    assert state.configuration == {"k": "v"}
    assert state.table_version == 2


def test_multi_part_checkpoint_is_read_only_when_complete(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    _commit(tmp_path, 0, _meta(), _txn("a", 0))
    _commit(tmp_path, 1, _txn("a", 1))
    _commit(tmp_path, 2, _txn("a", 2))
    _checkpoint(log / f"{2:020d}.checkpoint.{1:010d}.{2:010d}.parquet", [("a", 2, NOW_MS)], {})
    # Part 2 of 2 is missing: the reader replays the JSON commits instead.
    assert reader(tmp_path).read().versions == {"a": 2}
    _checkpoint(log / f"{2:020d}.checkpoint.{2:010d}.{2:010d}.parquet", [("b", 9, NOW_MS)], {})
    for v in (0, 1, 2):
        (log / f"{v:020d}.json").unlink()
    assert reader(tmp_path).read().versions == {"a": 2, "b": 9}


def test_expired_transaction_ids_are_dropped_like_delta_does(tmp_path: Path) -> None:
    day = 86_400_000
    _commit(tmp_path, 0, _meta({RETENTION_KEY: "interval 2 days"}),
            _txn("old", 4, NOW_MS - 3 * day), _txn("new", 7, NOW_MS - day))
    state = reader(tmp_path).read()
    assert state.retention == "interval 2 days"
    assert state.versions == {"new": 7}


def test_a_gap_in_the_commits_is_an_error(tmp_path: Path) -> None:
    _commit(tmp_path, 0, _meta(), _txn("a", 0))
    _commit(tmp_path, 2, _txn("a", 2))
    with pytest.raises(ConfigurationError, match="misses commit 1"):
        reader(tmp_path).read()


def test_v2_checkpoints_are_refused_with_the_fix(tmp_path: Path) -> None:
    _commit(tmp_path, 0, _meta(), _txn("a", 0))
    name = f"{0:020d}.checkpoint.3a0d65cd-4056-49b8-937b-95f9e3ee90e5.json"
    (tmp_path / "_delta_log" / name).write_text("{}")
    with pytest.raises(ConfigurationError, match=r"V2 checkpoints.*JVM gateway"):
        reader(tmp_path).read()


@pytest.mark.parametrize(
    ("text", "ms"),
    [("interval 7 days", 7 * 86_400_000), ("interval 1 seconds", 1000),
     ("INTERVAL 3 HOURS", 3 * 3_600_000), ("2 weeks", 14 * 86_400_000)],
)
def test_parse_interval(text: str, ms: int) -> None:
    assert parse_interval_ms(text) == ms


def test_parse_interval_refuses_months_with_the_format() -> None:
    with pytest.raises(ConfigurationError, match="interval <n>"):
        parse_interval_ms("interval 1 month")
