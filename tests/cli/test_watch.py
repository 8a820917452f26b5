"""``connectors status --watch``: rows, tables, the JSON Lines stream and the gauges, with
fake targets (no services; integration/cli/test_cli_watch.py runs it against real ones)."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import pytest

from connectors.cli import build_parser, main
from connectors.cli._gauges import GAUGES, LINGERING, OLDEST_LINGERING, TARGET_UP
from connectors.cli._model import EXIT_OK, EXIT_USAGE, Lingering, RecoverReport, SinkStatus
from connectors.cli._targets import Target
from connectors.cli._watch import Observer, WatchRow, json_line, lag_of, render_screen
from connectors.cli._watch_loop import CLEAR_HOME, HIDE_CURSOR, SHOW_CURSOR, run_watch
from connectors.core.errors import DependencyError, TransientError
from connectors.core.ledgers.ledger import Ledger


class FakeTarget(Target):
    """A target whose sinks and reachability the test sets."""

    kind = "postgres"

    def __init__(self, world: dict[str, object]) -> None:
        self.world = world
        self.closed = False

    def describe(self) -> str:
        return "postgres user=eos password=*** host=db"

    def _check(self) -> None:
        if self.world.get("down"):
            raise TransientError("connecting to host=db failed: connection refused")
        if self.world.get("interrupt"):
            raise KeyboardInterrupt

    def sink_ids(self) -> list[str]:
        self._check()
        return sorted(self.world["sinks"])  # type: ignore[call-overload]

    def status(self, sink_id: str) -> SinkStatus:
        self._check()
        return self.world["sinks"][sink_id]  # type: ignore[index,no-any-return]

    def ledger(self, sink_id: str) -> Ledger:
        raise NotImplementedError

    def lingering(self, sink_id: str) -> list[Lingering]:
        raise NotImplementedError

    def recover(self, sink_id: str, *, commit_decided: bool, abort_undecided: bool,
                min_age_s: float) -> RecoverReport:
        raise NotImplementedError

    def close(self) -> None:
        self.closed = True


def status(sink_id: str, last: int | None, lingering: int = 0, unfinished: int = 0,
           query: str | None = "q1") -> SinkStatus:
    return SinkStatus(sink_id, "postgres ...", query_id=query, last_committed=last,
                      unfinished=list(range(unfinished)),
                      lingering=[Lingering(f"t{i}", last, 10.0 * (i + 1))
                                 for i in range(lingering)])


def world(**sinks: SinkStatus) -> dict[str, object]:
    return {"sinks": dict(sinks)}


def observer(w: dict[str, object], **kw: object) -> tuple[Observer, list[FakeTarget]]:
    made = [FakeTarget(w)]

    def rebuild(kind: str) -> Target:
        made.append(FakeTarget(w))
        return made[-1]

    return Observer([made[0]], rebuild, **kw), made  # type: ignore[arg-type]


def watch_args(*extra: str) -> argparse.Namespace:
    return build_parser().parse_args(["status", "--postgres", "host=db", "--watch",
                                      "--interval", "0.01", *extra])


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_row_per_sink_with_lingering_count_and_oldest_age() -> None:
    obs, _ = observer(world(a=status("a", 4, lingering=3, unfinished=1), b=status("b", None)))
    rows = {r.sink_id: r for r in obs.refresh().rows}
    assert rows["a"].lingering == 3 and rows["a"].oldest_lingering_s == 30.0
    assert rows["a"].unfinished == [0] and rows["a"].last_committed == 4
    assert rows["b"].lingering == 0 and rows["b"].oldest_lingering_s is None
    assert all(r.reachable and r.error is None for r in rows.values())


def test_an_unreachable_target_is_a_row_and_recovers_with_a_fresh_target() -> None:
    w = world(a=status("a", 4))
    obs, made = observer(w)
    assert obs.refresh().rows[0].error is None
    w["down"] = True
    (row,) = obs.refresh().rows  # the sink last seen, with the error
    assert row.sink_id == "a" and not row.reachable and "connection refused" in str(row.error)
    text = render_screen(obs.refresh(), 1.0)
    assert "connection refused" in text and "password=***" in text
    w["down"] = False
    (row,) = obs.refresh().rows
    assert row.reachable and row.error is None and row.last_committed == 4
    assert len(made) >= 2 and made[0].closed  # the broken target was closed and rebuilt


def test_lag_is_measured_against_the_checkpoint_of_the_sinks_query(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    (ckpt / "offsets").mkdir(parents=True)
    (ckpt / "metadata").write_text('{"id":"q1"}\n')
    for n in range(8):
        (ckpt / "offsets" / str(n)).write_text("v1\n")
    obs, _ = observer(world(a=status("a", 5), b=status("b", 5, query="q2"),
                            c=status("c", None, query=None)), checkpoints=[str(ckpt)])
    rows = {r.sink_id: r for r in obs.refresh().rows}
    assert rows["a"].lag == 2 and rows["b"].lag is None and rows["c"].lag is None
    from connectors.cli._doctor import read_checkpoint

    assert lag_of([read_checkpoint(str(ckpt))], "q1", None) == 8


def test_the_table_shows_every_column_and_a_long_error_cut() -> None:
    from connectors.cli._watch import Snapshot

    rows = [WatchRow("a", "postgres", "pg", last_committed=7, lag=1, unfinished=[8],
                     lingering=2, oldest_lingering_s=61.4),
            WatchRow("k", "kafka", "kafka b:9092", reachable=False, error="x" * 500)]
    text = render_screen(Snapshot(0.0, rows), 2.0)
    lines = text.splitlines()
    assert "every 2 s" in lines[0]
    header = lines[2].split()
    assert header[:2] == ["target", "sink"] and "lingering" in header and "error" in header
    assert lines[4].split() == ["postgres", "a", "7", "1", "1", "2", "61", "-"]
    assert lines[5].split()[:7] == ["kafka", "k", "-", "-", "-", "-", "-"]
    assert "x" * 200 not in text and "..." in lines[5]
    assert "kafka: kafka b:9092" in text


def test_json_stream_is_one_flushed_document_per_refresh() -> None:
    out = io.StringIO()
    w = world(a=status("a", 1, lingering=1))
    obs, _ = observer(w)
    target = obs._targets[0]  # the fake's own world, reached through run_watch
    code = run_watch(watch_args("--json"), [target], lambda k: FakeTarget(w), out=out,
                     refreshes=3)
    assert code == EXIT_OK
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    docs = [json.loads(line) for line in lines]
    assert all(d["sinks"][0]["sink_id"] == "a" and d["sinks"][0]["lingering"] == 1
               for d in docs)
    assert docs[0]["time"] <= docs[-1]["time"]
    assert "\x1b" not in out.getvalue()
    assert json.loads(json_line(obs.refresh()))["sinks"][0]["oldest_lingering_s"] == 10.0


def test_a_terminal_is_redrawn_in_place_and_restored() -> None:
    out = Tty()
    w = world(a=status("a", 1))
    run_watch(watch_args(), [FakeTarget(w)], lambda k: FakeTarget(w), out=out, refreshes=2)
    text = out.getvalue()
    assert text.startswith(HIDE_CURSOR) and text.count(CLEAR_HOME) == 2
    assert text.rstrip("\n").endswith(SHOW_CURSOR)


def test_appended_tables_when_not_a_terminal() -> None:
    out = io.StringIO()
    w = world(a=status("a", 1))
    run_watch(watch_args(), [FakeTarget(w)], lambda k: FakeTarget(w), out=out, refreshes=2)
    text = out.getvalue()
    assert "\x1b" not in text and text.count("connectors status --watch") == 2


def test_ctrl_c_ends_the_watch_with_0_and_the_cursor_back() -> None:
    out = Tty()
    w = world(a=status("a", 1))
    w["interrupt"] = True
    assert run_watch(watch_args(), [FakeTarget(w)], lambda k: FakeTarget(w), out=out) == 0
    assert out.getvalue().endswith(SHOW_CURSOR + "\n")


def test_gauges_rise_fall_and_name_the_target_without_secrets() -> None:
    pytest.importorskip("prometheus_client")
    from connectors.cli._gauges import PrometheusGauges

    w = world(a=status("a", 3, lingering=2), b=status("b", 3))
    obs, _ = observer(w)
    gauges = PrometheusGauges()
    gauges.update(obs.refresh())
    text = gauges.exposition()
    assert f'{LINGERING}{{sink_id="a",target="postgres"}} 2.0' in text
    assert f'{OLDEST_LINGERING}{{sink_id="a",target="postgres"}} 20.0' in text
    assert f'{TARGET_UP}{{target="postgres"}} 1.0' in text
    assert "password" not in text and "host=db" not in text
    assert all(name.startswith("connectors_") for name in GAUGES)
    assert all(f"# TYPE {name} gauge" in text for name in GAUGES)
    w["sinks"] = {"a": status("a", 4)}  # settled; b is gone
    gauges.update(obs.refresh())
    text = gauges.exposition()
    assert f'{LINGERING}{{sink_id="a",target="postgres"}} 0.0' in text
    assert 'sink_id="b"' not in text
    w["down"] = True  # unreachable: up 0, the last values kept
    gauges.update(obs.refresh())
    text = gauges.exposition()
    assert f'{TARGET_UP}{{target="postgres"}} 0.0' in text
    assert f'{LINGERING}{{sink_id="a",target="postgres"}} 0.0' in text


def test_textfile_is_written_every_refresh(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    path = tmp_path / "connectors.prom"
    w = world(a=status("a", 1, lingering=1))
    run_watch(watch_args("--json", "--prometheus-textfile", str(path)), [FakeTarget(w)],
              lambda k: FakeTarget(w), out=io.StringIO(), refreshes=1)
    assert f'{LINGERING}{{sink_id="a",target="postgres"}} 1.0' in path.read_text()


def test_a_missing_prometheus_client_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from connectors.cli._gauges import PrometheusGauges

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(DependencyError, match=r"spark-exactly-once\[prometheus\]"):
        PrometheusGauges()


def test_watch_options_without_watch_are_a_usage_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--postgres", "host=db", "--prometheus-port", "9"]) == EXIT_USAGE
    assert "--watch" in capsys.readouterr().err
    assert main(["status", "--postgres", "host=db", "--watch", "--interval", "0"]) == EXIT_USAGE
    assert "--interval" in capsys.readouterr().err


def test_the_docs_name_every_gauge_and_the_cli_help_the_options() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "watching.md").read_text()
    assert all(f"`{name}`" in page for name in GAUGES)
    helptext = build_parser()._subparsers._group_actions[0].choices["status"].format_help()  # type: ignore[union-attr]
    for option in ("--watch", "--interval", "--checkpoint", "--prometheus-port",
                   "--prometheus-textfile"):
        assert option in helptext


def test_sigterm_ends_the_watch_like_ctrl_c_and_the_handler_is_restored() -> None:
    import os
    import signal

    class Terminating(FakeTarget):
        def status(self, sink_id: str) -> SinkStatus:
            os.kill(os.getpid(), signal.SIGTERM)
            return super().status(sink_id)

    before = signal.getsignal(signal.SIGTERM)
    w = world(a=status("a", 1))
    out = Tty()
    assert run_watch(watch_args(), [Terminating(w)], lambda k: Terminating(w), out=out,
                     refreshes=3) == 0
    assert out.getvalue().count(CLEAR_HOME) == 0  # it ended inside the first refresh
    assert out.getvalue().endswith(SHOW_CURSOR + "\n")
    assert signal.getsignal(signal.SIGTERM) == before


def test_an_unexpected_error_is_shown_with_its_type() -> None:
    class Odd(FakeTarget):
        def sink_ids(self) -> list[str]:
            raise RuntimeError("odd")

    obs = Observer([Odd(world())], lambda k: Odd(world()))
    (row,) = obs.refresh().rows
    assert row.sink_id == "-" and row.error == "RuntimeError: odd" and not row.reachable
