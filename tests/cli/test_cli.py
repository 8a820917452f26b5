"""The ``connectors`` command line: arguments, exit codes, output (no services)."""

from __future__ import annotations

import pytest

from connectors.cli import build_parser, main
from connectors.cli._model import EXIT_USAGE, render_table


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
