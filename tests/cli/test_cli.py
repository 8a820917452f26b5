"""The ``connectors`` command line: arguments, exit codes, output (no services)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from connectors.cli import _demo, build_parser, main
from connectors.cli._model import EXIT_USAGE, render_table
from connectors.core.errors import ConfigurationError


def test_render_table_pads_columns() -> None:
    out = render_table(["a", "long header"], [[1, None], ["wide cell", "x"]]).splitlines()
    assert out[0].startswith("a          long header")
    assert set(out[1].replace(" ", "")) == {"-"}
    assert out[2].split() == ["1", "-"]


def test_every_command_parses() -> None:
    p = build_parser()
    assert p.parse_args(["demo"]).sink == "delta"
    args = p.parse_args(["recover", "--postgres", "x", "--commit-decided", "--sink-id", "a",
                         "--sink-id", "b"])
    assert args.sink_ids == ["a", "b"] and args.min_age == 60.0
    assert p.parse_args(["doctor", "--checkpoint", "/c", "--delta", "/t"]).delta == "/t"


def test_usage_errors_exit_2_and_name_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status"]) == EXIT_USAGE
    assert "--postgres CONNINFO" in capsys.readouterr().err
    assert main(["recover", "--postgres", "host=x"]) == EXIT_USAGE
    assert "--commit-decided" in capsys.readouterr().err
    assert main(["doctor", "--checkpoint", "/c", "--postgres", "host=x"]) == EXIT_USAGE
    assert "exactly one --sink-id" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["nope"])
    assert exc.value.code == 2


def test_demo_refuses_a_crash_batch_it_never_reaches(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--files", "3", "--crash-batch", "5"]) == EXIT_USAGE
    assert "--crash-batch" in capsys.readouterr().err


class _StopAfterSetUp(Exception):
    pass


def _stop(*args: object, **kwargs: object) -> tuple[int, float]:
    raise _StopAfterSetUp


def test_demo_sets_up_in_a_new_temp_dir_without_workdir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The README's ``bash scripts/demo`` passes no --workdir: the set-up must work with the
    temp dir ``mkdtemp`` already created (it once crashed there with FileExistsError)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(_demo, "_drive", _stop)  # stop before the first Spark driver starts
    args = build_parser().parse_args(["demo", "--files", "2", "--rows-per-file", "10",
                                      "--crash-batch", "0"])
    assert args.workdir is None
    with pytest.raises(_StopAfterSetUp):
        _demo.run(args)
    (root,) = tmp_path.iterdir()
    assert root.name.startswith("connectors-demo-")
    assert sorted(p.name for p in root.iterdir()) == ["input"]
    assert len(list((root / "input").iterdir())) == 2
    assert f"work dir {root}" in capsys.readouterr().out


def test_demo_empties_a_given_workdir(tmp_path: Path) -> None:
    old = tmp_path / "demo" / "checkpoint"
    old.mkdir(parents=True)
    assert _demo._workdir(str(tmp_path / "demo")) == tmp_path / "demo"
    assert list((tmp_path / "demo").iterdir()) == []
    fresh = tmp_path / "new" / "nested"
    assert _demo._workdir(str(fresh)).is_dir()


@pytest.mark.parametrize("key", [
    "spark.hadoop.fs.s3a.secret.key",
    "spark.kafka.clusters.c1.kafka.sasl.jaas.config",
    "spark.kafka.clusters.c1.kafka.ssl.key.password",
    "spark.ssl.keyStorePassword",
    "spark.hadoop.fs.azure.sas.token",
])
def test_demo_conf_refuses_every_secret_a_spark_conf_can_hold(key: str) -> None:
    """A ``--conf`` value sits on a command line (``ps`` shows it): a JAAS config is a
    secret as much as an S3 key (before, only the object-store words were refused)."""
    with pytest.raises(ConfigurationError, match="holds a secret") as caught:
        _demo._confs([f"{key}=hunter2"])
    assert "hunter2" not in str(caught.value)


def test_demo_conf_keeps_settings_that_are_not_secret() -> None:
    items = ["spark.sql.shuffle.partitions=4",
             "spark.kafka.clusters.c1.kafka.ssl.keystore.type=PEM"]
    assert _demo._confs(items) == items


def test_demo_reads_a_restarts_three_times_from_its_log(tmp_path: Path) -> None:
    """The verdict's restart rows: seconds from the process's start to each milestone the
    job printed (the first of each), None for one it never reached."""
    log = tmp_path / "run-2.log"
    log.write_text("noise\nMILESTONE session 1000.5\nINFO something\n"
                   "MILESTONE query_started 1002.25\nMILESTONE first_commit 1009.0\n"
                   "MILESTONE first_commit 1012.0\nMILESTONE broken x\n")
    assert _demo.restart_times(log, 990.0) == {
        "session": 10.5, "query_started": 12.2, "first_commit": 19.0}
    assert _demo.restart_times(tmp_path / "none.log", 0.0) == {
        "session": None, "query_started": None, "first_commit": None}
