"""The operator CLI on a Delta table in S3 (``s3a://``), through a real S3 API.

The table is written by delta-rs with commits tagged like the sink's; the ledgers are
written with the sink's own ledger classes over :class:`ObstoreStore`. No Spark. The CLI
runs as a subprocess whose store settings and credentials come from the environment only
(``AWS_*``): nothing secret on its command line.

The S3 service is the shared ``s3_service`` fixture (``integration/support/_fixtures_services.py``:
``EOS_S3_*``, ``.services.env`` or a native moto server started for the session); without
one the tests skip, under ``CI=true`` they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from connectors.core.ledgers.ledger import LedgerEntry
from connectors.core.ledgers.object_ledger import ObjectLedger
from connectors.core.states import BatchState
from connectors.delta import CommitTag
from connectors.delta._table_commits import TableCommits
from connectors.lake.object_ledger import TableObjectLedger
from connectors.lake.store import ObstoreStore, options_for, store_url
from integration.support._driver import REPO
from integration.support._fixtures_services import S3Service

pytestmark = [pytest.mark.integration]

deltalake = pytest.importorskip("deltalake")


def s3_env(s3: S3Service, **override: str) -> dict[str, str]:
    """delta-rs's and obstore's environment variables for the S3 service (reads only: no
    unsafe-rename switch), ``override`` over them."""
    env = {k: v for k, v in s3.storage_options().items() if k != "AWS_S3_ALLOW_UNSAFE_RENAME"}
    env.update(override)
    return env


@dataclass(frozen=True)
class Table:
    s3: S3Service
    location: str  # s3a://bucket/<unique>/events

    def store(self, sink_id: str) -> ObstoreStore:
        url = store_url(self.location, sink_id)
        assert url is not None
        return ObstoreStore(url, options_for(self.location, lambda k: None, s3_env(self.s3)))


def _commit(s3: S3Service, location: str, tag: CommitTag | None) -> None:
    props = deltalake.CommitProperties(
        custom_metadata={"userMetadata": tag.to_json()} if tag else None)
    deltalake.write_deltalake(
        location.replace("s3a://", "s3://", 1), pa.table({"id": [1, 2]}), mode="append",
        storage_options=s3.storage_options(), commit_properties=props)


@pytest.fixture
def table(s3_service: S3Service) -> Iterator[Table]:
    """Two sinks' commits in one table: ``ahead`` has batches 0..3 in Delta and 0..2 in
    its ledger (the driver died before recording 3), ``even`` has 0..1 in both; one
    untagged commit of another writer."""
    t = Table(s3_service, f"{s3_service.prefix('cli')}/events")
    _commit(s3_service, t.location, None)
    for sink_id, batches in (("ahead", 4), ("even", 2)):
        for b in range(batches):
            _commit(s3_service, t.location, CommitTag(sink_id, sink_id, b, f"q-{sink_id}", "r1"))
    for sink_id, recorded in (("ahead", 3), ("even", 2)):
        ledger = ObjectLedger(t.store(sink_id), sink_id=sink_id)
        ledger.bind_query(f"q-{sink_id}")
        for b in range(recorded):
            ledger.decide(LedgerEntry(sink_id, b, "r1", BatchState.DECIDED))
            ledger.mark_committed(b)
    yield t


def cli(env: dict[str, str], *args: str) -> tuple[int, Any, str]:
    """``python -m connectors ARGS`` with only ``env``'s store settings: (exit code, JSON
    or text, stderr)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "EOS_S3_"))}
    full.update(env)
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), full.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "connectors", *args], cwd=REPO, env=full,
                          capture_output=True, text=True, timeout=180, check=False)
    out = proc.stdout
    data = json.loads(out) if out.strip().startswith("[") else out
    return proc.returncode, data, proc.stderr


def test_status_shows_the_ledgers_and_the_tagged_commits(table: Table) -> None:
    code, found, err = cli(s3_env(table.s3), "status", "--delta", table.location, "--json")
    assert code == 1, err  # "ahead" needs attention: batch 3 is in Delta, not in its ledger
    by_sink = {s["sink_id"]: s for s in found}
    assert sorted(by_sink) == ["ahead", "even"]
    ahead, even = by_sink["ahead"], by_sink["even"]
    assert ahead["target"] == f"delta {table.location}"
    assert (ahead["query_id"], ahead["last_committed"], ahead["unfinished"]) == (
        "q-ahead", 2, [3])
    assert "Delta log: last batch committed by this sink = 3" in ahead["notes"]
    assert (even["query_id"], even["last_committed"], even["unfinished"]) == ("q-even", 1, [])
    assert even["notes"] == ["Delta log: last batch committed by this sink = 1"]
    # the same as a table, as for a local table; a non-secret option is taken
    code, text, err = cli(s3_env(table.s3, AWS_REGION="eu-west-3"), "status", "--delta",
                          table.location, "--sink-id", "even",
                          "--storage-option", "AWS_REGION=us-east-1")
    assert code == 0, err
    assert text.splitlines()[0] == f"delta {table.location}"
    assert text.splitlines()[4].split() == ["even", "q-even", "1", "none", "0"]


def test_doctor_on_an_s3a_table(table: Table, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    for sub in ("offsets", "commits"):
        (ckpt / sub).mkdir(parents=True)
        for b in range(2):
            (ckpt / sub / str(b)).write_text("v1")
    (ckpt / "metadata").write_text(json.dumps({"id": "q-even"}))
    code, findings, err = cli(s3_env(table.s3), "doctor", "--delta", table.location,
                              "--sink-id", "even", "--checkpoint", str(ckpt), "--json")
    checks = {f["check"]: f for f in findings if not f["check"].startswith("jars:")}
    assert all(f["ok"] for f in checks.values()), (checks, err)
    assert sorted(checks) == ["at-most-one-ahead", "binding", "finished", "no-gaps",
                              "not-ahead-of-plan", "spark-commits-in-ledger"]
    (ckpt / "metadata").write_text(json.dumps({"id": "another-query"}))
    code, findings, err = cli(s3_env(table.s3), "doctor", "--delta", table.location,
                              "--sink-id", "even", "--checkpoint", str(ckpt), "--json")
    assert code == 1 and not {f["check"]: f for f in findings}["binding"]["ok"], err


def test_status_never_takes_the_lease_of_a_live_driver(table: Table) -> None:
    live = TableObjectLedger(table.store("even"), sink_id="even")
    live.open_run("live-run")  # a driver of the sink, running
    try:
        before = table.store("even").read("lease")
        assert before is not None
        code, found, err = cli(s3_env(table.s3), "status", "--delta", table.location,
                               "--sink-id", "even", "--json")
        assert code == 0 and found[0]["last_committed"] == 1, err
        live.check_lease()  # still the holder
        assert [k for k in table.store("ahead").keys("") if "lease" in k] == []
    finally:
        live.close()


def test_wrong_credentials_name_the_table_and_the_setting_never_the_secret(
    table: Table, s3_service: S3Service
) -> None:
    import boto3
    import botocore.exceptions

    wrong = "WRONG-" + uuid.uuid4().hex
    client = boto3.client("s3", endpoint_url=s3_service.endpoint, region_name="us-east-1",
                          aws_access_key_id=s3_service.access_key, aws_secret_access_key=wrong)
    try:
        client.list_objects_v2(Bucket=s3_service.bucket, MaxKeys=1)
        pytest.skip("this S3 service accepts any credentials (moto without "
                    "INITIAL_NO_AUTH_ACTION_COUNT)")
    except botocore.exceptions.ClientError:
        pass
    for command in (["status"], ["doctor", "--sink-id", "even", "--checkpoint", "/nonexistent"]):
        code, out, err = cli(s3_env(s3_service, AWS_SECRET_ACCESS_KEY=wrong), *command,
                             "--delta", table.location)
        assert code in (2, 3), (code, out, err)
        text = f"{out}{err}"
        assert wrong not in text and s3_service.secret_key not in text
        if command == ["status"]:
            assert code == 3  # unreachable, as for a database that refuses the password
            assert table.location in err and "AWS_SECRET_ACCESS_KEY" in err, err
    code, out, err = cli(s3_env(s3_service), "status", "--delta", table.location,
                         "--storage-option", f"AWS_SECRET_ACCESS_KEY={wrong}")
    assert code == 2 and wrong not in out + err and "environment variable" in err


def test_the_sink_reads_the_log_through_delta_rs_without_a_jvm(
    table: Table, s3_service: S3Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TableCommits.read_log under Spark Connect (no JVM gateway): the session's s3a
    confs, mapped to delta-rs's settings; nothing from the environment."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    endpoint = s3_service.endpoint
    confs = {"spark.hadoop.fs.s3a.endpoint": endpoint.split("://", 1)[1],
             "spark.hadoop.fs.s3a.connection.ssl.enabled": str(
                 endpoint.startswith("https://")).lower(),
             "spark.hadoop.fs.s3a.access.key": s3_service.access_key,
             "spark.hadoop.fs.s3a.secret.key": s3_service.secret_key,
             "spark.hadoop.fs.s3a.path.style.access": "true"}

    class Connect:  # a Spark Connect session as the committer sees it
        _jvm = None
        conf = confs

    committer = TableCommits("ahead", delta_txn_id=True, txn_seed=None)
    committer.storage_options = {"AWS_REGION": "us-east-1"}
    state = committer.read_log(Connect(), table.location, ["ahead"])  # type: ignore[arg-type]
    assert state.exists and state.table_version == 6 and state.versions == {}
