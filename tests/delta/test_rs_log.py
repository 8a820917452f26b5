"""DeltaRsLog (the Delta log through delta-rs), the delta-rs storage options and URIs, and
TableCommits.read_log without a JVM gateway; local tables written by delta-rs, no
service."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from connectors.core.errors import ConfigurationError, DependencyError, TransientError
from connectors.delta._rs_log import DeltaRsLog, StoreRefusedError, delta_rs_uri, redact_uri
from connectors.delta._rs_options import delta_rs_options
from connectors.delta._table_commits import TableCommits
from connectors.lake.store import is_secret_option

deltalake = pytest.importorskip("deltalake")

RETENTION = "delta.setTransactionRetentionDuration"


def write(path: Path, *, txns: list[Any] | None = None, meta: str | None = None,
          configuration: dict[str, str] | None = None) -> None:
    props = deltalake.CommitProperties(
        custom_metadata={"userMetadata": meta} if meta else None, app_transactions=txns)
    deltalake.write_deltalake(str(path), pa.table({"id": [1]}), mode="append",
                              configuration=configuration, commit_properties=props)


def test_txn_versions_configuration_and_history(tmp_path: Path) -> None:
    write(tmp_path, meta="first")
    write(tmp_path, txns=[deltalake.Transaction("app", 4)], meta="second")
    log = DeltaRsLog(str(tmp_path))
    state = log.read(["app", "other"])
    assert state.exists and state.table_version == 1
    assert state.versions == {"app": 4} and state.version("other") is None
    assert [(v, info.get("userMetadata")) for v, info in log.commit_infos()] == [
        (0, "first"), (1, "second")]


def test_retention_expires_an_old_transaction_id_as_delta_does(tmp_path: Path) -> None:
    now_ms = int(time.time() * 1000)
    write(tmp_path, configuration={RETENTION: "interval 1 hours"})
    write(tmp_path, txns=[deltalake.Transaction("old", 5, now_ms - 2 * 3_600_000),
                          deltalake.Transaction("new", 7, now_ms)])
    state = DeltaRsLog(str(tmp_path)).read(["old", "new"])
    assert state.versions == {"new": 7}
    assert state.retention == "interval 1 hours"


def test_a_checkpoint_without_the_commits_before_it(tmp_path: Path) -> None:
    for v in range(3):
        write(tmp_path, txns=[deltalake.Transaction("app", v)], meta=f"m{v}")
    deltalake.DeltaTable(str(tmp_path)).create_checkpoint()
    write(tmp_path, meta="m3")
    for name in ("00000000000000000000.json", "00000000000000000001.json"):
        (tmp_path / "_delta_log" / name).unlink()  # as the log clean-up does
    log = DeltaRsLog(str(tmp_path))
    assert log.read(["app"]).version("app") == 2
    assert [v for v, _ in log.commit_infos()] == [2, 3]


def test_no_table_yet(tmp_path: Path) -> None:
    log = DeltaRsLog(str(tmp_path / "none"))
    assert not log.exists()
    assert not log.read(["app"]).exists
    assert log.commit_infos() == []


def test_without_deltalake_a_local_table_is_read_with_the_pure_python_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, txns=[deltalake.Transaction("app", 3), deltalake.Transaction("b", 1)])
    monkeypatch.setitem(sys.modules, "deltalake", None)  # import deltalake -> ImportError
    log = DeltaRsLog(str(tmp_path))
    assert log.read(["app"]).versions == {"app": 3}
    assert len(log.commit_infos()) == 1
    with pytest.raises(DependencyError, match=r"\[delta\]"):
        DeltaRsLog("s3a://bucket/t").read(["app"])


def test_a_refusing_store_is_named_with_the_settings_to_check_and_no_secret(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret-value")
    log = DeltaRsLog("s3a://bucket/events", {"AWS_SESSION_TOKEN": "token-value-1"})

    def refused() -> None:
        raise OSError("Kernel error -> The operation lacked the necessary privileges "
                      "(env-secret-value token-value-1)\n  \x1b[31m↳\x1b[0m 403 Forbidden\n"
                      "<Error><Code>SignatureDoesNotMatch</Code></Error>")

    with pytest.raises(StoreRefusedError) as err:
        log._call("opening", refused)
    text = str(err.value)
    assert "s3a://bucket/events" in text and "403 Forbidden" in text
    assert "SignatureDoesNotMatch" in text and "AWS_SECRET_ACCESS_KEY" in text
    assert "env-secret-value" not in text and "token-value-1" not in text
    assert err.value.cannot_connect  # the CLI exits 3

    def unreachable() -> None:
        raise OSError("Generic S3 error: error sending request: Connection refused")

    with pytest.raises(TransientError, match="AWS_ENDPOINT_URL"):
        log._call("opening", unreachable)


def test_delta_rs_options_from_the_s3a_confs_then_the_sinks_options() -> None:
    confs = {
        "spark.hadoop.fs.s3a.endpoint": "127.0.0.1:9000",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.access.key": "id",
        "spark.hadoop.fs.s3a.secret.key": "secret",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.bucket.b.endpoint.region": "eu-west-1",
    }
    options = delta_rs_options("s3a://b/t", confs.get, {"aws_region": "us-east-1"})
    assert options == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ACCESS_KEY_ID": "id",
        "AWS_SECRET_ACCESS_KEY": "secret", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        "aws_region": "us-east-1", "AWS_ALLOW_HTTP": "true"}
    assert delta_rs_options("gs://b/t", confs.get, None) == {}
    assert delta_rs_options("s3://b/t", lambda k: None, {
        "AWS_ENDPOINT_URL": "http://h:1", "AWS_ALLOW_HTTP": "false"}) == {
        "AWS_ENDPOINT_URL": "http://h:1", "AWS_ALLOW_HTTP": "false"}


def test_uris() -> None:
    assert delta_rs_uri("s3n://b/t") == "s3a://b/t"
    assert delta_rs_uri("s3a://b/t") == "s3a://b/t"
    assert delta_rs_uri("file:///tmp/x") == "/tmp/x"
    with pytest.raises(ConfigurationError, match="abfss://"):
        delta_rs_uri("wasbs://c@acct.blob.core.windows.net/t")
    with pytest.raises(ConfigurationError) as err:
        delta_rs_uri("s3a://id:pa55word@b/t")
    assert "pa55word" not in str(err.value) and "s3a://b/t" in str(err.value)
    assert redact_uri("s3a://id:pa55word@b/t") == "s3a://b/t"
    assert "pa55word" not in repr(DeltaRsLog("s3a://b/t", {"AWS_SECRET_ACCESS_KEY": "pa55word"}))


@pytest.mark.parametrize(("name", "secret"), [
    ("AWS_SECRET_ACCESS_KEY", True), ("aws_session_token", True),
    ("AZURE_STORAGE_ACCOUNT_KEY", True), ("GOOGLE_SERVICE_ACCOUNT_KEY", True),
    ("AZURE_STORAGE_SAS_KEY", True), ("AZURE_CLIENT_SECRET", True), ("PASSWORD", True),
    ("AWS_ACCESS_KEY_ID", False), ("AWS_REGION", False), ("AWS_ENDPOINT_URL", False),
    ("GOOGLE_SERVICE_ACCOUNT", False), ("AZURE_STORAGE_ACCOUNT_NAME", False),
])
def test_is_secret_option(name: str, secret: bool) -> None:
    assert is_secret_option(name) is secret


class _ConnectSession:
    """A Spark Connect session as the committer sees it: no JVM gateway, confs only."""

    _jvm = None

    def __init__(self, confs: dict[str, str]) -> None:
        self.conf = self
        self._confs = confs

    def get(self, key: str, default: str | None = None) -> str | None:
        return self._confs.get(key, default)


def test_read_log_without_a_jvm_gateway_reads_through_delta_rs(tmp_path: Path) -> None:
    write(tmp_path, txns=[deltalake.Transaction("s", 2)])
    committer = TableCommits("s", delta_txn_id=True, txn_seed=None)
    state = committer.read_log(_ConnectSession({}), str(tmp_path), ["s"])  # type: ignore[arg-type]
    assert state.exists and state.version("s") == 2
    empty = committer.read_log(_ConnectSession({}), str(tmp_path / "new"), ["s"])  # type: ignore[arg-type]
    assert not empty.exists
