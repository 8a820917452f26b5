"""``connectors doctor``: the invariants between a Spark checkpoint and a sink's ledger."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyspark
import pytest

from connectors.cli import main
from connectors.cli._doctor import Checkpoint, check, offset_log_findings, read_checkpoint
from connectors.cli._model import EXIT_ATTENTION, EXIT_OK
from connectors.core.ledgers.ledger import BATCH_JOB_QUERY_ID, LedgerEntry
from connectors.core.states import BatchState
from connectors.spark.jars import _components

C, D = BatchState.COMMITTED, BatchState.DECIDED
Q = "3f2a-query"


def entries(*states: tuple[int, BatchState]) -> list[LedgerEntry]:
    return [LedgerEntry("s", b, "0badc0de", st) for b, st in states]


def failed(findings: list) -> dict[str, str]:
    return {f.check: f.detail for f in findings if not f.ok}


def ckpt(offsets: range, commits: range, query: str | None = Q) -> Checkpoint:
    return Checkpoint("/c", query, list(offsets), list(commits))


def test_a_healthy_pair_passes_every_check() -> None:
    findings = check(ckpt(range(5), range(5)), entries(*[(b, C) for b in range(5)]), Q)
    assert not failed(findings)
    assert {f.check for f in findings} == {"binding", "not-ahead-of-plan", "at-most-one-ahead",
                                           "spark-commits-in-ledger", "finished", "no-gaps"}


def test_one_batch_ahead_after_a_crash_is_fine_two_is_not() -> None:
    led = entries(*[(b, C) for b in range(5)])
    assert not failed(check(ckpt(range(5), range(4)), led, Q))
    bad = failed(check(ckpt(range(5), range(3)), led, Q))
    assert "at-most-one-ahead" in bad and "+2" in bad["at-most-one-ahead"]


def test_a_ledger_ahead_of_the_plan_means_an_older_checkpoint() -> None:
    bad = failed(check(ckpt(range(3), range(3)), entries(*[(b, C) for b in range(5)]), Q))
    assert "not-ahead-of-plan" in bad and "restored or reset checkpoint" in bad[
        "not-ahead-of-plan"]


def test_spark_committed_batches_missing_from_the_ledger_and_gaps() -> None:
    bad = failed(check(ckpt(range(5), range(5)), entries((0, C), (1, C), (3, C), (4, C)), Q))
    assert "[2]" in bad["spark-commits-in-ledger"] and "[2]" in bad["no-gaps"]


def test_an_empty_ledger_with_spark_commits_is_caught() -> None:
    bad = failed(check(ckpt(range(2), range(2)), [], None))
    assert "spark-commits-in-ledger" in bad and "binding" in bad


def test_bindings() -> None:
    led = entries((0, C))
    assert "another checkpoint" in failed(check(ckpt(range(1), range(1)), led, "other"))[
        "binding"]
    assert "batch job" in failed(check(ckpt(range(1), range(1)), led, BATCH_JOB_QUERY_ID))[
        "binding"]


def test_a_decided_batch_is_a_warning_not_an_error() -> None:
    findings = check(ckpt(range(3), range(3)), entries((0, C), (1, C), (2, D)), Q)
    (finished,) = [f for f in findings if f.check == "finished"]
    assert not finished.ok and finished.severity == "warning" and "recover" in finished.detail
    assert all(f.ok for f in findings if f.severity == "error")


def test_read_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    for b in range(3):
        (tmp_path / "offsets" / str(b)).write_text("v1\n{}")
        (tmp_path / "offsets" / f".{b}.crc").write_text("")
    (tmp_path / "commits" / "0").write_text("v1\n{}")
    (tmp_path / "commits" / "1").write_text("v1\n{}")
    (tmp_path / "metadata").write_text(json.dumps({"id": Q}) + "\n")
    got = read_checkpoint(str(tmp_path))
    assert (got.query_id, got.offsets, got.commits) == (Q, [0, 1, 2], [0, 1])
    with pytest.raises(FileNotFoundError, match="not a directory"):
        read_checkpoint(str(tmp_path / "nope"))


def test_what_a_killed_first_offset_write_left_is_named_with_the_exact_fix(
        tmp_path: Path) -> None:
    # Spark's atomic write: .0.<uuid>.tmp (and its checksum), renamed to 0 when complete
    root = tmp_path / "check point"  # a space: the fix must quote it
    (root / "offsets").mkdir(parents=True)
    (root / "metadata").write_text(json.dumps({"id": Q}) + "\n")
    uuid = "6f1c2d3e-aaaa-bbbb-cccc-0123456789ab"
    (root / "offsets" / f".0.{uuid}.tmp").write_text("v1\n")
    (root / "offsets" / f"..0.{uuid}.tmp.crc").write_text("")
    got = read_checkpoint(str(root))
    assert (got.offsets, got.offset_temps) == ([], (f"..0.{uuid}.tmp.crc", f".0.{uuid}.tmp"))
    (finding,) = offset_log_findings(got)
    assert (finding.check, finding.ok, finding.severity) == ("first-offset-write", False, "error")
    fix = (f"rm -- '{root}/offsets/..0.{uuid}.tmp.crc' '{root}/offsets/.0.{uuid}.tmp'")
    assert fix in finding.detail
    assert "STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY" in finding.detail
    assert "sink wrote nothing" in finding.detail
    # beside planned batches: harmless, a warning
    (root / "offsets" / "0").write_text("v1\n{}")
    (finding,) = offset_log_findings(read_checkpoint(str(root)))
    assert (finding.check, finding.severity) == ("offset-temp-files", "warning")
    assert "harmless" in finding.detail
    # no temporary file: no finding; Spark's own checksums are not temporary files
    for p in (root / "offsets").glob("*.tmp*"):
        p.unlink()
    (root / "offsets" / ".0.crc").write_text("")
    assert offset_log_findings(read_checkpoint(str(root))) == []


# ------------------------------------------------------------------ the jars section

SPARK = pyspark.__version__
SCALA = _components._scala_binary_version(_components.pyspark_home() / "jars")
# Delta's release line for this Spark (3.3 on Spark 3.5, 4.4 on 4.x), one release asked for,
# one of the same line it may be substituted by, one of another line (refused)
LINE = "4.4" if _components.version_tuple(SPARK) >= (4,) else "3.3"
WANT, SUB, OTHER = f"{LINE}.1", f"{LINE}.0", ("4.3.1" if LINE == "4.4" else "3.2.1")
DELTA_COORD = f"io.delta:{_components._delta_artifact_id(WANT, SPARK, SCALA)}"


def _stamp(cache: Path, dirname: str, jars: list[str], **fields: object) -> Path:
    target = cache / "jars" / dirname
    target.mkdir(parents=True)
    for name in jars:
        (target / name).write_bytes(b"jar")
    (target / ".complete.json").write_text(json.dumps({"jars": jars, **fields}))
    return target


@pytest.fixture
def doctor_args(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A healthy empty pair (a Delta table, a checkpoint) and a private jar cache."""
    monkeypatch.setenv("EOS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("EOS_DELTA_VERSION", WANT)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no Maven, no java: none needed
    (tmp_path / "table" / "_delta_log").mkdir(parents=True)
    (tmp_path / "ckpt").mkdir()
    return ["doctor", "--checkpoint", str(tmp_path / "ckpt"), "--delta",
            str(tmp_path / "table"), "--sink-id", "s"]


def test_doctor_shows_the_jars_a_session_would_get_without_starting_spark(
    doctor_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    delta = _stamp(tmp_path / "cache", f"delta-{WANT}-spark{SPARK}_{SCALA}",
                   [f"delta-spark-{SUB}.jar", f"delta-storage-{SUB}.jar"],
                   substituted={DELTA_COORD: SUB})
    assert main(doctor_args) == EXIT_OK
    rows = {line.split()[0]: line.split(None, 2)[1:] for line in
            capsys.readouterr().out.splitlines() if line.startswith("jars:")}
    assert rows["jars:delta"] == [
        "ok", f"{DELTA_COORD}:{SUB}; substituted {SUB} for {WANT} (2 jars in {delta})"]
    kafka = tmp_path / "cache" / "jars" / f"kafka-{SPARK}_{SCALA}"
    assert rows["jars:kafka"] == [
        "ok", f"org.apache.spark:spark-sql-kafka-0-10_{SCALA}:{SPARK} (not resolved yet: the "
        f"first session fetches it with Maven into {kafka})"]
    assert not kafka.exists()
    (hadoop,) = {n[len("hadoop-client-api-"):-len(".jar")] for n in
                 os.listdir(Path(pyspark.__file__).parent / "jars")
                 if n.startswith("hadoop-client-api-")}
    s3 = tmp_path / "cache" / "jars" / f"s3-{hadoop}-spark{SPARK}"
    assert rows["jars:s3"] == [
        "ok", f"org.apache.hadoop:hadoop-aws:{hadoop} (not resolved yet: the first session "
        f"with 's3' in components fetches it with Maven into {s3})"]
    # Iceberg: on a Spark it publishes no runtime for (the test lane's 4.2), a fact, not a fault
    from connectors.spark.jars import unavailable

    why = unavailable("iceberg")
    assert rows["jars:iceberg"][0] == "ok"
    if why is not None:
        assert rows["jars:iceberg"][1] == f"not for this Spark: {why}"
        assert "publishes no Spark runtime for Spark" in why

    assert main([*doctor_args, "--json"]) == EXIT_OK
    found = {f["check"]: f for f in json.loads(capsys.readouterr().out)}
    assert found["jars:delta"]["ok"] is True
    assert f"substituted {SUB} for {WANT}" in found["jars:delta"]["detail"]


def test_doctor_flags_a_cached_delta_jar_of_another_minor_version(
    doctor_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _stamp(tmp_path / "cache", f"delta-{WANT}-spark{SPARK}_{SCALA}", [f"delta-spark-{OTHER}.jar"],
           substituted={DELTA_COORD: OTHER})
    assert main([*doctor_args, "--json"]) == EXIT_ATTENTION
    found = {f["check"]: f for f in json.loads(capsys.readouterr().out)}
    assert found["jars:delta"]["ok"] is False
    assert found["jars:delta"]["severity"] == "error"
    assert f"{DELTA_COORD}:{OTHER}" in found["jars:delta"]["detail"]
    assert f"install delta-spark {OTHER[:3]}.x" in found["jars:delta"]["detail"]
    assert f"EOS_DELTA_VERSION={OTHER}" in found["jars:delta"]["detail"]
    assert found["jars:kafka"]["ok"] is True


def test_doctor_only_warns_when_the_s3_jars_cannot_be_planned(
    doctor_args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """"s3" is fetched only when a session names it: a Spark without a Hadoop jar to match
    is worth a warning, not a failed doctor run."""
    home = tmp_path / "spark-home"
    (home / "jars").mkdir(parents=True)
    monkeypatch.setenv("SPARK_HOME", str(home))
    assert main([*doctor_args, "--json"]) == EXIT_OK
    found = {f["check"]: f for f in json.loads(capsys.readouterr().out)}
    assert found["jars:s3"]["ok"] is False
    assert found["jars:s3"]["severity"] == "warning"
    assert "has no hadoop-client-api-<version>.jar" in found["jars:s3"]["detail"]


def test_doctor_fails_on_a_killed_first_offset_write_and_passes_after_the_fix(
    doctor_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    temp = tmp_path / "ckpt" / "offsets" / ".0.0e1f-uuid.tmp"
    temp.parent.mkdir()
    temp.write_text("v1\n")
    assert main([*doctor_args, "--json"]) == EXIT_ATTENTION
    found = {f["check"]: f for f in json.loads(capsys.readouterr().out)}
    assert found["first-offset-write"]["ok"] is False
    assert f"rm -- {temp}" in found["first-offset-write"]["detail"]
    temp.unlink()  # the documented fix
    assert main([*doctor_args, "--json"]) == EXIT_OK
    found = {f["check"]: f for f in json.loads(capsys.readouterr().out)}
    assert "first-offset-write" not in found
