"""The CLI's MariaDB target without a server: its flags, its secrets, its recover guard.

``--mariadb URL`` / ``--mariadb-env VAR`` / ``--mariadb-file FILE`` follow ``--postgres``'s
rules (one of them; a password on the command line warned about on stderr); the password
shows in no output, error or description. ``recover`` never rolls back an undecided branch
of unknown age (``XA RECOVER`` gives none) unless the ledger decided its batch or a later
one, or ``--min-age`` is 0. The real server's run is
``integration/mariadb/test_mariadb_operator.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from connectors.cli import build_parser, main
from connectors.cli._inputs import mariadb_url
from connectors.cli._target_args import FACTORIES, targets
from connectors.cli._targets import MariaDBTarget, PreparedTarget
from connectors.core.driver.operator import PreparedAdmin, PreparedTransaction
from connectors.core.errors import ConfigurationError
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers.ledger import Ledger, LedgerEntry, TaskCommit
from connectors.core.naming import TransactionId
from connectors.core.protocol.recovery import Settled
from connectors.core.states import BatchState
from connectors.mariadb.admin import DEFAULT_LEDGER_TABLE, MariaDBAdmin, address_has_secret
from connectors.testing import InMemoryTarget

SECRET = "Zq9-Secr3t-Wk7"
#: Nothing listens on port 1: a connect fails at once.
URL = f"mariadb://app:{SECRET}@127.0.0.1:1/shop"


def test_the_mariadb_flags_parse_and_the_ledger_table_defaults_to_the_sinks() -> None:
    for command in ("status", "recover", "doctor", "savepoint"):
        extra = ["--checkpoint", "c"] if command in ("doctor", "savepoint") else []
        args = build_parser().parse_args([command, *extra, "--mariadb-env", "V"])
        assert (args.mariadb, args.mariadb_env, args.mariadb_file) == (None, "V", None)
        assert args.mariadb_ledger_table is None
    args = build_parser().parse_args(["status", "--mariadb-file", "f", "--mariadb-ledger-table",
                                      "ops.led"])
    assert args.mariadb_file == "f" and args.mariadb_ledger_table == "ops.led"
    assert "mariadb" in FACTORIES  # status --watch rebuilds targets of this kind
    target = MariaDBTarget(URL)
    assert target.describe().endswith(f" ledger shop.{DEFAULT_LEDGER_TABLE}")
    assert target.kind == "mariadb"
    assert MariaDBTarget(URL, "ops.led").describe().endswith(" ledger ops.led")


def test_describe_and_repr_mask_the_password() -> None:
    admin = MariaDBAdmin(URL)
    assert admin.describe() == "mariadb mariadb://app:***@127.0.0.1:1/shop ledger shop.eos_ledger"
    assert SECRET not in repr(admin) and SECRET not in admin.describe()
    assert address_has_secret(URL) and not address_has_secret("mariadb://app@db:3306/shop")


def test_one_source_of_the_address_and_a_password_on_the_command_line_is_warned(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert mariadb_url(None, env=None, file=None) is None
    assert mariadb_url(None, env="U", file=None, environ={"U": f" {URL}\n"}) == URL
    path = tmp_path / "url.txt"
    path.write_text(URL + "\n")
    assert mariadb_url(None, env=None, file=str(path)) == URL
    assert capsys.readouterr().err == ""
    assert mariadb_url(URL, env=None, file=None) == URL
    err = capsys.readouterr().err
    assert "--mariadb carries a secret" in err and "--mariadb-env" in err and SECRET not in err
    with pytest.raises(ConfigurationError, match="give one of --mariadb"):
        mariadb_url(URL, env="U", file=None, environ={"U": URL})
    with pytest.raises(ConfigurationError, match="--mariadb-env U: the environment variable"):
        mariadb_url(None, env="U", file=None, environ={})


@pytest.mark.parametrize("how", ["arg", "env", "file"])
@pytest.mark.parametrize("json_out", [False, True])
def test_the_cli_never_prints_the_password(how: str, json_out: bool, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("EOS_TEST_MARIADB", URL)
    (tmp_path / "url").write_text(URL)
    flags = {"arg": ["--mariadb", URL], "env": ["--mariadb-env", "EOS_TEST_MARIADB"],
             "file": ["--mariadb-file", str(tmp_path / "url")]}[how]
    code = main(["-v", "status", *flags, "--sink-id", "s1", *(["--json"] if json_out else [])])
    out = capsys.readouterr()
    assert code == 3, out  # unreachable: nothing listens on port 1
    assert "127.0.0.1:1" in out.err and SECRET not in out.out + out.err


def test_a_bad_address_is_refused_without_quoting_it(capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EOS_TEST_MARIADB", f"postgres://app:{SECRET}@db/x")
    assert main(["status", "--mariadb-env", "EOS_TEST_MARIADB"]) == 2
    err = capsys.readouterr().err
    assert "mariadb://" in err and SECRET not in err
    assert main(["status"]) == 2
    assert "--mariadb URL" in capsys.readouterr().err
    with pytest.raises(ConfigurationError, match="--mariadb-ledger-table"):
        targets(build_parser().parse_args(["status", "--mariadb", "mariadb://a@h/d",
                                           "--mariadb-ledger-table", "a.b.c"]))


# ---- recover's guard for branches of unknown age, on a fake admin ----

def _tid(batch: int, attempt: int = 0) -> TransactionId:
    return TransactionId("s1", "0a1b2c3d", batch, attempt)


class FakeAdmin(PreparedAdmin):
    """Branches without an age; ``settle`` records what it was asked to keep."""

    def __init__(self, prepared: Sequence[TransactionId], entries: Sequence[LedgerEntry]):
        self._prepared = [PreparedTransaction(t, None) for t in prepared]
        self._entries = entries
        self.kept: frozenset[str] = frozenset()

    def describe(self) -> str:
        return "fake"

    def prepared(self, sink_id: str | None = None) -> list[PreparedTransaction]:
        return list(self._prepared)

    def sink_ids(self) -> list[str]:
        return ["s1"]

    def ledger(self, sink_id: str) -> Ledger:
        ledger = InMemoryTarget().ledger(sink_id)
        for entry in self._entries:
            ledger.decide(entry)
        return ledger

    def operator_sink(self, sink_id: str) -> Any:  # pragma: no cover - settle is faked
        raise AssertionError

    def close(self) -> None:
        pass

    def settle(self, sink_id: str, transactions: Sequence[str], *, commit_decided: bool,
               abort_undecided: bool, keep: frozenset[str] = frozenset(),
               adopt: Sequence[LedgerEntry] = ()) -> Settled:
        self.kept = keep
        return Settled(aborted=[t for t in transactions if t not in keep], left=sorted(keep))


def _committed(batch: int) -> LedgerEntry:
    commit = TaskCommit(str(_tid(batch, 9)), 0, 9, Fingerprint())
    return LedgerEntry("s1", batch, "0a1b2c3d", BatchState.COMMITTED, (commit,))


@pytest.mark.parametrize(("entries", "min_age", "kept"), [
    ([_committed(0)], 60.0, True),   # its batch undecided, no age: a live driver may decide
    ([_committed(0)], 0.0, False),   # the operator says no driver runs
    ([_committed(0), _committed(1)], 60.0, False),  # its batch decided without it: a loser
    ([_committed(2)], 3600.0, False),  # a later batch decided: its run is past it
])
def test_an_undecided_branch_of_unknown_age_is_kept_unless_proved_past(
        entries: list[LedgerEntry], min_age: float, kept: bool) -> None:
    admin = FakeAdmin([_tid(1)], entries)
    target = PreparedTarget(admin)
    (item,) = target.lingering("s1")
    assert item.age_s is None and item.decided is False
    report = target.recover("s1", commit_decided=True, abort_undecided=True, min_age_s=min_age)
    assert (str(_tid(1)) in admin.kept) is kept
    assert bool(report.notes) is kept
    if kept:
        assert "--min-age 0" in report.notes[0] and "age is unknown" in report.notes[0]


def test_a_target_not_named_needs_no_client_library() -> None:
    """``connectors status --kafka ...`` runs without PyMySQL and psycopg installed (CI's
    wheel lane installs ``[postgres,kafka,delta]`` only): the address readers import a
    target's extra only when its address is given."""
    import subprocess
    import sys

    code = ("import sys\n"
            "sys.modules.update(dict.fromkeys(['pymysql', 'psycopg']))\n"
            "from connectors.cli._inputs import mariadb_url, postgres_conninfo\n"
            "assert mariadb_url(None, env=None, file=None) is None\n"
            "assert postgres_conninfo(None, env=None, file=None) is None\n"
            "try:\n"
            "    mariadb_url('mariadb://u:pw@h:3306/db', env=None, file=None)\n"
            "except ImportError as e:\n"
            "    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert "DependencyError" in out and "spark-exactly-once[mariadb]" in out, out
