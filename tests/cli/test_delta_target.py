"""``connectors status`` / ``doctor`` on local Delta tables read through delta-rs, and the
command line's refusal of secrets (no service; the object-store cases are in
``integration/cli/test_cli_delta_s3.py``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pytest

from connectors.cli import build_parser, main, storage_options
from connectors.cli._delta_target import DeltaTarget
from connectors.core.errors import ConfigurationError
from connectors.core.ledgers.ledger import LedgerEntry
from connectors.core.states import BatchState
from connectors.delta import CommitTag, DeltaLedger

deltalake = pytest.importorskip("deltalake")


def commit(table: Path, tag: CommitTag | None = None, *, txn: tuple[str, int, int] | None = None,
           configuration: dict[str, str] | None = None) -> None:
    props = deltalake.CommitProperties(
        custom_metadata={"userMetadata": tag.to_json()} if tag else None,
        app_transactions=[deltalake.Transaction(*txn)] if txn else None)
    deltalake.write_deltalake(str(table), pa.table({"id": [1]}), mode="append",
                              configuration=configuration, commit_properties=props)


def ledger(table: Path, sink_id: str, committed: range, query: str = "q") -> None:
    led = DeltaLedger(table / "_connectors" / sink_id, sink_id=sink_id)
    led.bind_query(query)
    for b in committed:
        led.decide(LedgerEntry(sink_id, b, "run", BatchState.COMMITTED))
    led.close()


def test_status_finds_a_tagged_commit_the_ledger_does_not_record(tmp_path: Path) -> None:
    """The default (tag) path writes no txn action: ``connectors status`` reads the sink's
    ``userMetadata`` tags to see a batch Delta committed that the ledger does not record."""
    table = tmp_path / "t"
    commit(table)  # another writer's commit, untagged
    for b in (1, 2):
        commit(table, CommitTag("s", "s", b, "q", "run"))
    ledger(table, "s", range(1, 2))
    status = DeltaTarget(str(table)).status("s")
    assert status.query_id == "q" and status.last_committed == 1
    assert status.unfinished == [2], status
    assert any("last batch committed by this sink = 2" in n for n in status.notes)


def test_status_reads_the_txn_path_and_drops_an_expired_transaction_id(tmp_path: Path) -> None:
    table = tmp_path / "t"
    now_ms = int(time.time() * 1000)
    commit(table, configuration={"delta.setTransactionRetentionDuration": "interval 1 hours"})
    commit(table, txn=("fresh", 3, now_ms))
    commit(table, txn=("stale", 5, now_ms - 2 * 3_600_000))
    ledger(table, "fresh", range(0, 3))
    ledger(table, "stale", range(0, 5))
    target = DeltaTarget(str(table))
    assert target.sink_ids() == ["fresh", "stale"]
    fresh, stale = (target.status(s) for s in ("fresh", "stale"))
    assert fresh.unfinished == [3] and fresh.last_committed == 2
    assert "Delta log: last batch committed by this sink = None" in stale.notes
    assert stale.unfinished == []


def test_status_and_doctor_through_the_command(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    table, ckpt = tmp_path / "t", tmp_path / "ckpt"
    for b in range(3):
        commit(table, CommitTag("s", "s", b, "q", "run"))
    ledger(table, "s", range(0, 3))
    (ckpt / "offsets").mkdir(parents=True)
    (ckpt / "commits").mkdir()
    (ckpt / "metadata").write_text(json.dumps({"id": "q"}))
    for b in range(3):
        (ckpt / "offsets" / str(b)).write_text("v1")
        (ckpt / "commits" / str(b)).write_text("v1")
    assert main(["status", "--delta", str(table)]) == 0
    out = capsys.readouterr().out
    assert f"delta {table}" in out and "last batch committed by this sink = 2" in out
    main(["doctor", "--delta", f"file://{table}", "--sink-id", "s", "--checkpoint",
          str(ckpt), "--json"])
    found = {f["check"]: f for f in json.loads(capsys.readouterr().out)}
    assert all(f["ok"] for name, f in found.items() if not name.startswith("jars:")), found
    assert found["binding"]["detail"] == "sink bound to query q, checkpoint belongs to q"


def test_not_a_delta_table(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="not a Delta table"):
        DeltaTarget(str(tmp_path))


def test_storage_options_refuse_secrets_without_echoing_them() -> None:
    assert storage_options(["AWS_REGION=us-east-1", "AWS_ACCESS_KEY_ID=AKIA1",
                            "AWS_ENDPOINT_URL=http://h:9000/x=y"]) == {
        "AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "AKIA1",
        "AWS_ENDPOINT_URL": "http://h:9000/x=y"}
    for pair in ("AWS_SECRET_ACCESS_KEY=hunter22", "aws_session_token=hunter22",
                 "AZURE_STORAGE_ACCOUNT_KEY=hunter22", "GOOGLE_SERVICE_ACCOUNT_KEY=hunter22"):
        with pytest.raises(ConfigurationError) as err:
            storage_options([pair])
        key = pair.split("=")[0]
        assert "hunter22" not in str(err.value)
        assert f"environment variable {key.upper()}" in str(err.value)
    with pytest.raises(ConfigurationError) as err:
        storage_options(["hunter22"])
    assert "hunter22" not in str(err.value)


def test_a_secret_on_the_command_line_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["status", "--delta", "s3a://b/t", "--storage-option",
                 "AWS_SECRET_ACCESS_KEY=hunter22"])
    captured = capsys.readouterr()
    assert code == 2 and "hunter22" not in captured.err + captured.out
    assert "AWS_SECRET_ACCESS_KEY" in captured.err


@pytest.mark.parametrize("command", ["status", "recover", "doctor"])
def test_no_flag_takes_a_secret(command: str) -> None:
    """``ps`` shows every process's arguments: no option of the operator commands is named
    for a secret (the store's credentials come from the environment)."""
    sub = build_parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    flags = [o for action in sub._actions for o in action.option_strings]
    assert "--storage-option" in flags
    assert not [f for f in flags if any(w in f for w in ("secret", "password", "token", "key"))]
