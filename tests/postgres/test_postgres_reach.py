"""A first connect that failed (issue 40): libpq's ``PQping`` decides between a server
that is down or restarting (transient: ridden out within ``outage_timeout``) and settings
a server refused (a configuration error at once). No server needed: the ping's verdict is
given; the real ones are in integration/postgres/test_postgres_first_contact.py."""

from __future__ import annotations

import pickle
import socket

import psycopg
import pytest
from psycopg import pq

from connectors import ConfigurationError, TransientError
from connectors.postgres import Conninfo
from connectors.postgres._errors import CONNECT_ADVICE, CannotConnectError, translate
from connectors.postgres._reach import TargetDownError
from connectors.postgres._reach import _ping as real_ping  # before conftest's patch

SECRET = "Pa55-w0rd-77"


def first(conninfo: str, verdict: pq.Ping | Exception, monkeypatch: pytest.MonkeyPatch,
          text: str = "connection failed: Connection refused") -> object:
    asked: list[str] = []

    def ping(info: Conninfo) -> pq.Ping:
        asked.append(info.where())
        if isinstance(verdict, Exception):
            raise verdict
        return verdict

    monkeypatch.setattr("connectors.postgres._reach._ping", ping)
    err = translate(psycopg.OperationalError(text), doing="connecting",
                    conninfo=Conninfo(conninfo), connecting=True, sink_id="s", batch_id=3)
    assert asked == [Conninfo(conninfo).where()]
    assert SECRET not in str(err) and SECRET not in repr(pickle.loads(pickle.dumps(err)))
    return err


def test_no_server_answering_is_transient_and_names_host_and_port(
        monkeypatch: pytest.MonkeyPatch) -> None:
    err = first(f"host=localhost port=5999 dbname=app password={SECRET}", pq.Ping.NO_RESPONSE,
                monkeypatch)
    assert type(err) is TargetDownError and isinstance(err, TransientError)
    assert "no PostgreSQL server answers at localhost:5999/app" in str(err)
    assert "check host and port" in str(err) and "outage_timeout" in str(err)
    assert err.cannot_connect and err.batch_id == 3


def test_a_server_starting_up_is_transient(monkeypatch: pytest.MonkeyPatch) -> None:
    err = first("host=127.0.0.1 port=5432", pq.Ping.REJECT, monkeypatch,
                text="connection failed: FATAL:  the database system is starting up")
    assert type(err) is TargetDownError
    assert "does not accept connections yet" in str(err)


@pytest.mark.parametrize("verdict", [pq.Ping.OK, pq.Ping.NO_ATTEMPT, OSError("no ping")])
def test_a_server_that_refused_the_settings_is_a_configuration_error(
        verdict: pq.Ping | Exception, monkeypatch: pytest.MonkeyPatch) -> None:
    err = first(f"host=localhost password={SECRET}", verdict, monkeypatch,
                text=f"connection failed: FATAL: password authentication failed ({SECRET})")
    assert type(err) is CannotConnectError and isinstance(err, ConfigurationError)
    assert CONNECT_ADVICE in str(err)


def test_a_host_name_that_does_not_resolve_is_a_configuration_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    name = "no-such-host.invalid"  # RFC 2606: never resolves
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo(name, None)
    err = first(f"host={name} port=5432", pq.Ping.NO_RESPONSE, monkeypatch)
    assert type(err) is CannotConnectError
    assert f"the host name {name} does not resolve: check host" in str(err)
    # One resolvable host of several, a socket directory or a hostaddr: a server may come.
    for other in (f"host={name},localhost", f"host={name},/run/postgresql",
                  f"host={name} hostaddr=127.0.0.1"):
        assert type(first(other, pq.Ping.NO_RESPONSE, monkeypatch)) is TargetDownError


def test_tls_failures_are_configuration_errors_without_a_ping(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("connectors.postgres._reach._ping", pytest.fail)
    err = translate(psycopg.OperationalError("connection failed: SSL error: certificate verify "
                                             "failed"), doing="connecting",
                    conninfo=Conninfo("host=localhost sslmode=verify-full"), connecting=True)
    assert type(err) is CannotConnectError and "sslrootcert" in str(err)


def test_settings_that_connected_before_are_transient_without_a_ping(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("connectors.postgres._reach._ping", pytest.fail)
    err = translate(psycopg.OperationalError("connection failed: FATAL: whatever"),
                    doing="connecting", conninfo=Conninfo("host=localhost"), connecting=True,
                    connected_before=True)
    assert type(err) is TransientError


def test_the_real_ping_of_a_closed_port_says_no_response() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert real_ping(Conninfo(f"host=127.0.0.1 port={port} user=x password={SECRET}")) \
            is pq.Ping.NO_RESPONSE


def test_a_handshake_cut_short_by_a_restarting_server_is_transient(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the chaos soak: a driver starting while PostgreSQL restarts (``immediate``)
    got "SSL error: unexpected eof while reading" and ended as a TLS configuration error.
    A TLS failure that names no setting now goes through PQping like any other."""
    text = ('connection failed: connection to server at "127.0.0.1", port 5432 failed: SSL '
            'error: unexpected eof while reading')
    err = first("host=127.0.0.1 port=5432", pq.Ping.NO_RESPONSE, monkeypatch, text=text)
    assert type(err) is TargetDownError
    # A server that answers PQping: the handshake itself is the problem (the TLS advice).
    err = first("host=127.0.0.1 port=5432", pq.Ping.OK, monkeypatch, text=text)
    assert type(err) is CannotConnectError and "TLS: the handshake failed" in str(err)
