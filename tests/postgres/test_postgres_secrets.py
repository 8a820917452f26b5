"""No secret of a connection string anywhere: every secret keyword x every form x every output.

Forms: keyword conninfo, quoted keyword (a space and an escaped quote in the value), a URI's
query parameter, a URI's userinfo (the password only). The connection string itself is a
string: PostgresSink takes no dict. Outputs: repr/str of the Conninfo and the sink, the
error of a connect failure whose text quotes the string, a real refused connection (port 1
of this machine: no server needed), log records, and the CLI's human and ``--json`` runs
(the string given as ``--postgres``, ``--postgres-env`` and ``--postgres-file``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from connectors.cli import main
from connectors.core.errors import ConfigurationError, ConnectorError
from connectors.postgres import Conninfo, PostgresSink
from connectors.postgres._errors import translate
from connectors.postgres._ledger import DriverConnection
from connectors.postgres._redact import redact, secret_keywords

#: Distinct fragments: each must be gone, whatever the form split the value at.
ONE, TWO = "Alpha9Zq", "Beta7Wk"
PLAIN = f"{ONE}-{TWO}"
QUOTED = f"{ONE} {TWO}'x"  # written 'Alpha9Zq Beta7Wk\'x'
#: The secret keywords this libpq parses: an older one (the oldest psycopg[binary] the
#: project supports) lacks oauth_client_secret and scram_*_key, and refuses a conninfo
#: naming them. The conninfo forms use these; ``redact`` is tested on every secret keyword
#: in text (test_redact_masks_every_secret_keyword_in_text).
LIBPQ_KEYWORDS = frozenset(o.keyword.decode() for o in psycopg.pq.Conninfo.get_defaults())
KEYS = sorted(k for k in secret_keywords() if k in LIBPQ_KEYWORDS)
BASE = "host=127.0.0.1 port=1 user=u dbname=db connect_timeout=2 sslmode=disable"
URI = "postgresql://u{userinfo}@127.0.0.1:1/db?connect_timeout=2&sslmode=disable"


def _forms() -> list[tuple[str, str, str]]:
    """(id, conninfo, value) for every secret keyword and form."""
    forms = []
    for key in KEYS:
        forms += [
            (f"{key}-keyword", f"{BASE} {key}={PLAIN}", PLAIN),
            (f"{key}-spaced", f"{key} = {PLAIN} {BASE}", PLAIN),
            (f"{key}-quoted", f"{BASE} {key}='{QUOTED.replace(chr(39), chr(92) + chr(39))}'",
             QUOTED),
            (f"{key}-uri-query", URI.format(userinfo="") + f"&{key}={quote(QUOTED, safe='')}",
             QUOTED),
        ]
    forms += [
        ("password-uri-userinfo", URI.format(userinfo=f":{quote(QUOTED, safe='')}"), QUOTED),
        ("options-keyword", f"{BASE} options='-c app.secret={PLAIN} -c search_path=s'", PLAIN),
        ("options-uri-query",
         URI.format(userinfo="") + "&options=" + quote(f"-c app.password={PLAIN}", safe=""),
         PLAIN),
    ]
    return forms


FORMS = _forms()


def assert_clean(text: str) -> None:
    for fragment in (ONE, TWO, quote(ONE), quote(TWO)):
        assert fragment not in text, text


def test_the_table_covers_libpq_s_hidden_keywords() -> None:
    # Every secret keyword is masked; those this libpq parses are also tried as conninfos.
    assert {"password", "sslpassword", "oauth_client_secret", "scram_client_key",
            "scram_server_key"} <= secret_keywords()
    assert {"password", "sslpassword"} <= set(KEYS)
    hidden = {o.keyword.decode() for o in psycopg.pq.Conninfo.get_defaults()
              if o.dispchar == b"*"}
    assert hidden <= set(KEYS)


@pytest.mark.parametrize(("raw", "value"), [f[1:] for f in FORMS], ids=[f[0] for f in FORMS])
class TestEveryOutput:
    def test_conninfo_and_sink_reprs(self, raw: str, value: str) -> None:
        info = Conninfo(raw)
        assert value in info.secrets or any(value in s for s in info.secrets)
        sink = PostgresSink(raw, "t", sink_id="s")
        for text in (repr(info), str(info), info.redacted(), repr(sink), str(sink)):
            assert_clean(text)
        assert "***" in info.redacted()
        assert "127.0.0.1" in info.redacted()  # the rest stays readable

    def test_redact_masks_the_text_of_the_string_and_bare_values(self, raw: str,
                                                                 value: str) -> None:
        info = Conninfo(raw)
        assert_clean(info.redact(f"invalid connection string {raw}; value {value}"))
        # Without the values, the keyword and URI forms still go.
        if "options" not in raw:
            assert_clean(redact(f"invalid connection string {raw}"))

    def test_translated_connect_failure(self, raw: str, value: str) -> None:
        exc = psycopg.OperationalError(f"connection failed: {raw} (secret {value})")
        for before in (False, True):
            err = translate(exc, doing=f"connecting to {Conninfo(raw)}",
                            conninfo=Conninfo(raw), connecting=True, connected_before=before)
            assert_clean(str(err))
            assert_clean(repr(err))

    def test_a_refused_connection_and_its_log_records(
            self, raw: str, value: str, caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.DEBUG)
        db = DriverConnection(Conninfo(raw), 2, "s")
        with pytest.raises(ConnectorError) as err:
            db.get()
        assert_clean(str(err.value))
        assert err.value.__context__ is None and err.value.__cause__ is None
        for record in caplog.records:
            assert_clean(record.getMessage())
        assert_clean(caplog.text)

    @pytest.mark.parametrize("how", ["arg", "env", "file"])
    @pytest.mark.parametrize("json", [False, True])
    def test_cli(self, raw: str, value: str, how: str, json: bool, tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                 caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.DEBUG)
        if how == "arg":
            flags = ["--postgres", raw]
        elif how == "env":
            monkeypatch.setenv("EOS_TEST_CONNINFO", raw)
            flags = ["--postgres-env", "EOS_TEST_CONNINFO"]
        else:
            (tmp_path / "conn").write_text(raw + "\n")
            flags = ["--postgres-file", str(tmp_path / "conn")]
        code = main(["-v", "status", *flags, *(["--json"] if json else [])])
        out, err = capsys.readouterr()
        assert code == 3, err
        assert "cannot connect" in err
        assert_clean(out + err)
        assert_clean(caplog.text)
        # A secret on the command line is warned about; from the environment or a file not.
        assert ("warning: --postgres carries a secret" in err) is (how == "arg")


def test_errors_name_the_flag_and_variable_or_file_never_the_content(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("EOS_TEST_NOPE", raising=False)
    assert main(["status", "--postgres-env", "EOS_TEST_NOPE"]) == 2
    assert "--postgres-env EOS_TEST_NOPE: the environment variable EOS_TEST_NOPE" in (
        capsys.readouterr().err)
    missing = tmp_path / "missing"
    assert main(["status", "--postgres-file", str(missing)]) == 2
    assert f"--postgres-file {missing}: cannot read" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.write_text(f"host=db password={PLAIN} nonsense")
    assert main(["status", "--postgres-file", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "not a valid libpq connection string" in err
    assert_clean(err)
    monkeypatch.setenv("EOS_TEST_CONN", "host=db")
    assert main(["status", "--postgres", "host=db", "--postgres-env", "EOS_TEST_CONN"]) == 2
    assert "one of --postgres" in capsys.readouterr().err


def test_short_values_are_masked_where_they_have_a_key() -> None:
    info = Conninfo("host=db password=pw1 sslpassword=ab")
    assert info.redacted() == "password=*** host=db sslpassword=***"
    assert info.redact("password=pw1 sslpassword='ab'") == "password=*** sslpassword=***"
    with pytest.raises(ConfigurationError):
        Conninfo("password=pw1 host")  # not a conninfo: the message does not quote it


@pytest.mark.parametrize("key", sorted(secret_keywords()))
def test_redact_masks_every_secret_keyword_in_text(key: str) -> None:
    """Also those this libpq does not know (a newer server's client may write them)."""
    for text in (f"{BASE} {key}={PLAIN}", f"{key} = {PLAIN} {BASE}",
                 f"{BASE} {key}='{ONE} {TWO}'",
                 URI.format(userinfo="") + f"&{key}={quote(QUOTED, safe='')}"):
        assert_clean(redact(f"invalid connection string {text}"))
