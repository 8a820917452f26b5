"""``connectors status`` / ``doctor`` on Iceberg tables read from their metadata files (no
Spark, no catalog client): a Hadoop catalog's table (``version-hint.text``), a catalog's
(``<n>-<uuid>.metadata.json``), gzipped metadata, and the refusal of a location without a
table. The real tables (a kill between the commit and the ledger) are in
``integration/iceberg/test_iceberg_kill.py``."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from connectors.cli import main
from connectors.cli._iceberg_target import IcebergTarget
from connectors.core.errors import ConfigurationError
from connectors.core.ledgers.ledger import LedgerEntry
from connectors.core.states import BatchState
from connectors.iceberg import SnapshotTag
from connectors.iceberg.admin import IcebergAdmin
from connectors.lake.ledger import TableLedger


def snapshot(sid: int, parent: int | None, batch: int | None, app: str = "s") -> dict[str, Any]:
    summary: dict[str, str] = {"operation": "append", "added-records": "3"}
    if batch is not None:
        summary.update(SnapshotTag(app.split(".")[0], app, batch, "q", "run").properties())
    snap: dict[str, Any] = {"snapshot-id": sid, "summary": summary,
                            "timestamp-ms": 1_700_000_000_000 + sid}
    if parent is not None:
        snap["parent-snapshot-id"] = parent
    return snap


def metadata(*snaps: dict[str, Any]) -> dict[str, Any]:
    current = snaps[-1]["snapshot-id"] if snaps else -1
    meta: dict[str, Any] = {"format-version": 2, "current-snapshot-id": current,
                            "snapshots": list(snaps)}
    if snaps:
        meta["refs"] = {"main": {"snapshot-id": current, "type": "branch"}}
    return meta


def hadoop_table(root: Path, *versions: dict[str, Any], hint: int | None = None) -> Path:
    folder = root / "metadata"
    folder.mkdir(parents=True)
    for i, meta in enumerate(versions, start=1):
        (folder / f"v{i}.metadata.json").write_text(json.dumps(meta))
    (folder / "version-hint.text").write_text(str(hint or len(versions)))
    return root


def ledger(table: Path, sink_id: str, committed: range, query: str = "q") -> None:
    led = TableLedger(table / "_connectors" / sink_id, sink_id=sink_id)
    led.bind_query(query)
    for b in committed:
        led.decide(LedgerEntry(sink_id, b, "run", BatchState.COMMITTED))
    led.close()


def test_status_finds_a_committed_batch_the_ledger_does_not_record(tmp_path: Path) -> None:
    """A snapshot tagged with batch 2 while the ledger records up to 1 (the driver died
    between the two): the gap is an unfinished batch, with the note saying what happens."""
    table = hadoop_table(tmp_path / "t", metadata(snapshot(1, None, None)),
                         metadata(snapshot(1, None, None), snapshot(2, 1, 1),
                                  snapshot(3, 2, 2), snapshot(4, 3, None)))
    ledger(table, "s", range(0, 2))
    target = IcebergTarget(str(table))
    assert target.sink_ids() == ["s"]
    status = target.status("s")
    assert status.query_id == "q" and status.last_committed == 1
    assert status.unfinished == [2], status
    assert "Iceberg snapshots: last batch committed by this sink = 2" in status.notes
    assert target.lingering("s") == []
    assert "nothing to commit or roll back" in target.recover(
        "s", commit_decided=True, abort_undecided=True, min_age_s=0).notes[0]


def test_a_stale_hint_a_catalogs_names_and_gzip_are_read(tmp_path: Path) -> None:
    # A writer renamed v2 in and died before it updated the hint.
    stale = hadoop_table(tmp_path / "stale", metadata(snapshot(1, None, 0)),
                         metadata(snapshot(1, None, 0), snapshot(2, 1, 1)), hint=1)
    assert IcebergAdmin(str(stale)).metadata_location.endswith("v2.metadata.json")
    assert IcebergAdmin(str(stale)).snapshots().last_batch("s") == 1
    # A JDBC/REST catalog's table: <n>-<uuid>.metadata.json, gzipped here; two files of the
    # newest sequence (a commit that lost a race) are said in a note.
    table = tmp_path / "cat"
    (table / "metadata").mkdir(parents=True)
    for n, meta in ((1, metadata(snapshot(1, None, 0))),
                    (2, metadata(snapshot(1, None, 0), snapshot(2, 1, 1)))):
        name = f"{n:05d}-0b5f1c9e-8a41-4f7d-9d55-{n:012d}.gz.metadata.json"
        (table / "metadata" / name).write_bytes(gzip.compress(json.dumps(meta).encode()))
    admin = IcebergAdmin(str(table))
    assert admin.snapshots().last_batch("s") == 1 and admin.notes == []
    (table / "metadata" / "00002-ffffffff-8a41-4f7d-9d55-000000000009.metadata.json") \
        .write_text(json.dumps(metadata(snapshot(1, None, 0))))
    raced = IcebergAdmin(str(table))
    assert "share sequence 2" in raced.notes[0] and "--iceberg-metadata" in raced.notes[0]
    exact = IcebergAdmin(str(table), metadata_location=str(
        table / "metadata" / "00002-0b5f1c9e-8a41-4f7d-9d55-000000000002.gz.metadata.json"))
    assert exact.snapshots().last_batch("s") == 1


def test_a_reset_binding_generation_is_the_tags_app_id(tmp_path: Path) -> None:
    """After ``reset_binding`` the sink's tags carry app id ``s.g1``: batch 7 of the old
    binding is not the new one's."""
    table = hadoop_table(tmp_path / "t", metadata(snapshot(1, None, 7),
                                                  snapshot(2, 1, 0, "s.g1")))
    led = TableLedger(table / "_connectors" / "s", sink_id="s")
    led.bind_query("q")
    assert IcebergAdmin(str(table)).last_batch_in_table("s") == 7
    assert led.bind_query("q2", reset=True) == 1
    led.close()
    assert IcebergAdmin(str(table)).last_batch_in_table("s") == 0


def test_status_through_the_command_and_a_location_without_a_table(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = hadoop_table(tmp_path / "t", metadata(snapshot(1, None, 0), snapshot(2, 1, 1)))
    ledger(table, "s", range(0, 2))
    assert main(["status", "--iceberg", str(table)]) == 0
    out = capsys.readouterr().out
    assert f"iceberg {table}" in out and "last batch committed by this sink = 1" in out
    assert main(["status", "--iceberg", str(table), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["last_committed"] == 1
    with pytest.raises(ConfigurationError, match="not an Iceberg table"):
        IcebergTarget(str(tmp_path / "empty"))
    assert main(["status", "--iceberg", str(tmp_path)]) != 0
    assert "not an Iceberg table" in capsys.readouterr().err
