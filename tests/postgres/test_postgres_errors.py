"""psycopg errors -> the library's errors: by SQLSTATE, never by message text; no row
values unless ``values_in_errors``; no psycopg exception chained (no server needed)."""

from __future__ import annotations

import pickle
import traceback

import psycopg
import pytest

from connectors import (
    BadInputError,
    ConfigurationError,
    ConnectorError,
    FatalError,
    TransientError,
)
from connectors.postgres import Conninfo
from connectors.postgres._errors import (
    CONNECT_ADVICE,
    CannotConnectError,
    raise_translated,
    translate,
)

SECRET = "S3cr3t-pa55"
ROW = "Failing row contains (17993, null, p17993)."


def server_error(sqlstate: str, text: str) -> psycopg.Error:
    return psycopg.errors.lookup(sqlstate)(text)


@pytest.mark.parametrize(("sqlstate", "kind"), [
    ("42P01", BadInputError), ("23502", BadInputError), ("23505", BadInputError),
    ("23514", BadInputError), ("22003", BadInputError), ("22P02", BadInputError),
    ("42501", ConfigurationError), ("28P01", ConfigurationError),
    ("55P03", TransientError), ("40001", TransientError), ("40P01", TransientError),
    ("57P01", TransientError), ("53300", TransientError), ("58030", TransientError),
    ("XX000", FatalError), ("0A000", FatalError),
])
def test_sqlstates_map_to_the_error_tree(sqlstate: str, kind: type) -> None:
    err = translate(server_error(sqlstate, "irrelevant"), doing="x",
                    sink_id="s", batch_id=3)
    assert type(err) is kind and err.batch_id == 3
    assert f"SQLSTATE {sqlstate}" in str(err)
    assert type(pickle.loads(pickle.dumps(err))) is kind


@pytest.mark.parametrize("text", [
    "prepared transactions are disabled", "maximum number of prepared transactions reached",
    'password authentication failed for user "app"', 'database "x" does not exist',
    "permission denied for table t", 'null value in column "name" violates not-null',
])
def test_the_message_text_classifies_nothing(text: str) -> None:
    """The same English words under a SQLSTATE that means something else: the SQLSTATE
    decides (an internal error stays fatal, a lost connection transient)."""
    assert type(translate(server_error("XX000", text), doing="x")) is FatalError
    lost = translate(psycopg.OperationalError(text), doing="x")
    assert type(lost) is TransientError and "connection lost" in str(lost)


@pytest.mark.parametrize(("sqlstate", "setting"), [("55000", "max_prepared_transactions = 0"),
                                                   ("53200", "exhausted")])
def test_prepared_transaction_limits_by_sqlstate_in_the_prepare_step(
    sqlstate: str, setting: str
) -> None:
    exc = server_error(sqlstate, "Transaktionen sind abgeschaltet")  # any language
    err = translate(exc, doing="PREPARE", preparing=True)
    assert isinstance(err, ConfigurationError) and setting in str(err)
    assert "max_prepared_transactions" in str(err)
    # Outside the PREPARE step the same SQLSTATE means something else.
    assert not isinstance(translate(exc, doing="x"), ConfigurationError)


@pytest.mark.parametrize("text", [
    f'connection to server at "db", port 5432 failed: FATAL:  Passwort-Authentifizierung für '
    f'Benutzer »app« fehlgeschlagen (password={SECRET})',
    "connection to server at \"db\", port 1 failed: Connection refused",
    f'FATAL:  Datenbank »nodb« existiert nicht postgresql://app:{SECRET}@db/nodb',
])
def test_connect_failures_are_one_configuration_error_quoting_the_server(text: str) -> None:
    exc = psycopg.OperationalError(f"connection failed: {text}")
    info = Conninfo(f"host=db password={SECRET}")
    err = translate(exc, doing="connecting to db", conninfo=info, connecting=True, sink_id="s")
    assert type(err) is CannotConnectError and isinstance(err, ConfigurationError)
    assert CONNECT_ADVICE in str(err) and "connection failed" in str(err)
    assert SECRET not in str(err) and SECRET not in repr(pickle.loads(pickle.dumps(err)))
    # The same settings connected before in this process: a restart, worth retrying.
    again = translate(exc, doing="connecting", conninfo=info, connecting=True,
                      connected_before=True)
    assert type(again) is TransientError and SECRET not in str(again)


def test_row_values_only_with_values_in_errors() -> None:
    exc = server_error("23502", f'null value in column "name" violates not-null\nDETAIL: {ROW}')
    quiet = translate(exc, doing="COPY")
    assert "17993" not in str(quiet) and "p17993" not in repr(quiet)
    assert "NULL in a NOT NULL column" in str(quiet) and "NotNullViolation" in str(quiet)
    loud = translate(exc, doing="COPY", values=True)
    assert "p17993" in str(loud)
    # Client-side data errors (no SQLSTATE) may quote the value too.
    client = psycopg.DataError("cannot dump 17993")
    assert "17993" not in str(translate(client, doing="x"))
    assert "17993" in str(translate(client, doing="x", values=True))


def test_raise_translated_keeps_no_psycopg_exception() -> None:
    exc = server_error("23505", f"duplicate key\nDETAIL: Key (id)=(17993) already exists. {ROW}")

    def fail() -> None:
        raise exc

    with pytest.raises(BadInputError) as info:
        raise_translated(fail, lambda e: translate(e, doing="COPY"))
    err = info.value
    assert err.__cause__ is None and err.__context__ is None
    text = "".join(traceback.format_exception(err)) + repr(err.args) + repr(err.__dict__)
    assert "17993" not in text
    assert raise_translated(lambda: 5, lambda e: ConnectorError("unused")) == 5


def test_raise_translated_passes_other_errors() -> None:
    def fail() -> None:
        raise KeyError("k")

    with pytest.raises(KeyError):
        raise_translated(fail, lambda e: ConnectorError("unused"))


def test_other_exceptions_are_fatal_and_quoted_only_with_values() -> None:
    exc = ValueError("cannot encode 17993")
    quiet = translate(exc, doing="COPY")
    assert type(quiet) is FatalError and "ValueError" in str(quiet) and "17993" not in str(quiet)
    assert "17993" in str(translate(exc, doing="COPY", values=True))
