"""The MariaDB test service really provides what an exactly-once sink relies on.

Through the ``mariadb`` command line (no Python driver is a dependency yet): the
least-privilege users, TLS, and prepared XA branches that outlive their connection, a
SIGKILL of the server and a graceful restart, then finished from another connection.

Found on MariaDB 10.11.19 and pinned here:

* ``XA RECOVER`` needs no privilege and lists the prepared branches of every user; any
  user may ``XA COMMIT`` / ``XA ROLLBACK`` a branch whose connection has gone (a
  ``USAGE``-only account did, tried by hand). The sink's user needs its table privileges
  only.
* While connection A that prepared branch X is still connected, X stays A's: B sees it
  in ``XA RECOVER`` but ``XA COMMIT X`` / ``XA ROLLBACK X`` fail with 1397 (XAE04)
  ``XAER_NOTA``; A itself can run ``SELECT 1`` (no table) but any other statement, a
  write or a read of a table, and ``XA START`` of another branch fail with 1399 (XAE07)
  ``XAER_RMFAIL`` until X is finished; A may ``XA COMMIT X`` itself. Once A disconnects,
  B can finish X. So a task must not reuse its connection after ``XA PREPARE``: it
  disconnects (handing X to the driver) or the driver cannot commit.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration import services as _services
from integration.services.tls import TlsFiles
from integration.support._fixtures_mariadb import NativeMariaDB
from integration.support._mariadb import MariaDBAddress, MariaDBSession, mariadb_sql

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

XAER_NOTA = "ERROR 1397 (XAE04)"
XAER_RMFAIL = "ERROR 1399 (XAE07)"


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def _setting(name: str, default: str) -> str:
    """A variable of the environment, else of ``.services.env``, else the native default."""
    return (os.environ.get(name, "").strip() or _services.read_env_file().get(name, "").strip()
            or default)


def _ssl_ca() -> Path:
    return Path(_setting(_services.ENV_MARIADB_SSL_CA,
                         str(TlsFiles(_services.state_dir() / "tls").ca)))


def _tls_user(address: MariaDBAddress) -> MariaDBAddress:
    return address.as_user(_setting(_services.ENV_MARIADB_TLS_USER, _services.MARIADB_TLS_USER),
                           _setting(_services.ENV_MARIADB_TLS_PASSWORD,
                                    _services.MARIADB_TLS_PASSWORD))


def _rows(address: MariaDBAddress, sql: str) -> list[str]:
    return mariadb_sql(address, sql).stdout.split()


def _recovered(address: MariaDBAddress) -> set[str]:
    """The prepared branches ``XA RECOVER`` lists, as ``gtrid,bqual`` (``FORMAT='SQL'``)."""
    out = mariadb_sql(address, "XA RECOVER FORMAT='SQL'").stdout
    return {line.split("\t")[3].replace("'", "") for line in out.splitlines() if line}


def _prepare(session: MariaDBSession, gtrid: str, table: str, ids: range) -> None:
    values = ", ".join(f"({i})" for i in ids)
    out = session.run(f"XA START '{gtrid}','b1'; INSERT INTO {table} VALUES {values}; "
                      f"XA END '{gtrid}','b1'; XA PREPARE '{gtrid}','b1'")
    assert "ERROR" not in out, out


@pytest.fixture
def shared(mariadb_url: str) -> MariaDBAddress:
    return MariaDBAddress.from_url(mariadb_url)


@pytest.fixture
def table(shared: MariaDBAddress) -> Iterator[str]:
    """A fresh InnoDB table on the shared MariaDB (dropped after, with the test's branches)."""
    name = _unique("svc_xa")
    mariadb_sql(shared, f"CREATE TABLE {name} (id INT PRIMARY KEY) ENGINE=InnoDB")
    yield name
    for xid in _recovered(shared):
        if xid.startswith(name):
            mariadb_sql(shared, "XA ROLLBACK " + ",".join(f"'{p}'" for p in xid.split(",")))
    mariadb_sql(shared, f"DROP TABLE IF EXISTS {name}")


@pytest.fixture
def own(native_mariadb: NativeMariaDB) -> tuple[NativeMariaDB, MariaDBAddress, str]:
    """The module's own MariaDB, its address as ``eos`` and a fresh table there."""
    address = MariaDBAddress.from_url(native_mariadb.url)
    name = _unique("svc_xa")
    mariadb_sql(address, f"CREATE TABLE {name} (id INT PRIMARY KEY) ENGINE=InnoDB")
    return native_mariadb, address, name


# ============================================================================= service


def test_start_is_idempotent_and_the_env_file_holds_the_addresses(
        native_mariadb: NativeMariaDB) -> None:
    before = native_mariadb.status()
    again = native_mariadb.instance.mariadb()  # a running server is verified, not restarted
    after = native_mariadb.status()
    assert again == native_mariadb.info
    assert before.mariadb_pid is not None and after.mariadb_pid == before.mariadb_pid
    assert re.fullmatch(r"10\.11\.\d+", again.version), again.version

    env = _services.read_env_file(native_mariadb.instance.env)
    assert env["EOS_MARIADB_URL"] == f"mariadb://eos:eos@127.0.0.1:{again.port}/eos"
    assert (env["EOS_MARIADB_HOST"], env["EOS_MARIADB_PORT"]) == ("127.0.0.1", str(again.port))
    assert (env["EOS_MARIADB_USER"], env["EOS_MARIADB_PASSWORD"]) == ("eos", "eos")
    assert (env["EOS_MARIADB_DATABASE"], env["EOS_MARIADB_TLS_USER"]) == ("eos", "eos_tls")
    assert Path(env["EOS_MARIADB_SSL_CA"]) == native_mariadb.instance.state / "tls" / "ca.pem"
    assert Path(env["EOS_MARIADB_SSL_CA"]).is_file()

    proc = subprocess.run(
        [sys.executable, "-m", "integration.services", "status", "--only", "mariadb"],
        capture_output=True, text=True, env=native_mariadb.instance.environ(),
        cwd=_services.REPO_ROOT, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(rf"^mariadb:  running  127\.0\.0\.1:{again.port}  \(MariaDB 10\.11\.\d+, "
                     rf"pid {after.mariadb_pid}, data \S+/data\)$", proc.stdout, re.M), proc.stdout


def test_the_sink_user_writes_its_tables_but_administers_nothing(
        shared: MariaDBAddress, table: str, tmp_path: Path) -> None:
    mariadb_sql(shared, f"ALTER TABLE {table} ADD COLUMN note VARCHAR(20) NULL; "
                        f"CREATE INDEX {table}_note ON {table} (note); "
                        f"INSERT INTO {table} VALUES (1, 'ä'); UPDATE {table} SET note = 'ü'; "
                        f"INSERT INTO {table} VALUES (2, NULL); DELETE FROM {table} WHERE id = 2")
    rows = tmp_path / "rows.tsv"
    rows.write_text("3\tdrei\n4\tvier\n")
    mariadb_sql(shared, f"LOAD DATA LOCAL INFILE '{rows}' INTO TABLE {table}",
                options=("--local-infile=1",))  # the server's local_infile is ON
    assert _rows(shared, f"SELECT CONCAT(id, note) FROM {table} ORDER BY id") == [
        "1ü", "3drei", "4vier"]
    assert _rows(shared, "SELECT @@character_set_server, @@time_zone, @@local_infile") == [
        "utf8mb4", "+00:00", "1"]

    create_user = mariadb_sql(shared, "CREATE USER intruder IDENTIFIED BY 'x'", check=False)
    assert create_user.returncode != 0 and "ERROR 1227" in create_user.stderr, create_user.stderr
    read_users = mariadb_sql(shared, "SELECT user FROM mysql.user", check=False)
    assert read_users.returncode != 0 and "ERROR 1142" in read_users.stderr, read_users.stderr
    other_db = mariadb_sql(shared, "CREATE DATABASE intruder", check=False)
    assert other_db.returncode != 0 and "ERROR 1044" in other_db.stderr, other_db.stderr


def test_the_tls_user_needs_tls_and_the_server_certificate_verifies(
        shared: MariaDBAddress) -> None:
    tls_user = _tls_user(shared)
    plain = mariadb_sql(tls_user.with_tls(None, ssl=False), "SELECT 1", check=False)
    assert plain.returncode != 0 and "ERROR 1045" in plain.stderr, plain.stderr

    verified = tls_user.with_tls(_ssl_ca())
    cipher = _rows(verified, "SHOW SESSION STATUS LIKE 'Ssl_cipher'")
    assert len(cipher) == 2 and cipher[1], cipher  # ['Ssl_cipher', '<the cipher>']
    assert _rows(verified, "SELECT CURRENT_USER()") == [f"{tls_user.user}@%"]

    other_ca = _ssl_ca().with_name("other-ca.pem")
    refused = mariadb_sql(tls_user.with_tls(other_ca), "SELECT 1", check=False)
    assert refused.returncode != 0 and "ERROR 2026" in refused.stderr, refused.stderr


# ============================================================================ prepared XA


def test_a_prepared_branch_survives_a_disconnect_and_a_sigkill_of_the_server(
        own: tuple[NativeMariaDB, MariaDBAddress, str]) -> None:
    server, address, table = own
    # A branch whose connection merely went away: listed, and another connection rolls
    # it back.
    gone = MariaDBSession(address)
    _prepare(gone, f"{table}_gone", table, range(100, 103))
    gone.kill()  # the TCP connection dropped, as a crashed task's
    assert f"{table}_gone,b1" in _recovered(address)
    mariadb_sql(address, f"XA ROLLBACK '{table}_gone','b1'")
    assert f"{table}_gone,b1" not in _recovered(address)

    # Prepared, its connection still open, then the server SIGKILLed and started again.
    crashed = MariaDBSession(address)
    _prepare(crashed, f"{table}_crash", table, range(1, 4))
    left = MariaDBSession(address)
    _prepare(left, f"{table}_left", table, range(10, 12))
    left.close()
    pid = server.status().mariadb_pid
    info = server.restart(mode="immediate")
    crashed.kill()
    assert info.port == server.info.port and server.status().mariadb_pid != pid

    assert {f"{table}_crash,b1", f"{table}_left,b1"} <= _recovered(address)  # as eos
    assert _rows(address, f"SELECT COUNT(*) FROM {table}") == ["0"]
    mariadb_sql(address, f"XA COMMIT '{table}_crash','b1'")
    mariadb_sql(address, f"XA ROLLBACK '{table}_left','b1'")
    assert _rows(address, f"SELECT id FROM {table} ORDER BY id") == ["1", "2", "3"]
    assert not {x for x in _recovered(address) if x.startswith(table)}


def test_a_graceful_restart_keeps_prepared_branches(
        own: tuple[NativeMariaDB, MariaDBAddress, str]) -> None:
    server, address, table = own
    connected = MariaDBSession(address)  # still connected when the server shuts down
    _prepare(connected, f"{table}_a", table, range(1, 3))
    gone = MariaDBSession(address)
    _prepare(gone, f"{table}_b", table, range(5, 7))
    gone.close()
    server.restart(mode="fast")
    connected.kill()

    assert {f"{table}_a,b1", f"{table}_b,b1"} <= _recovered(address)
    mariadb_sql(address, f"XA COMMIT '{table}_a','b1'; XA COMMIT '{table}_b','b1'")
    assert _rows(address, f"SELECT id FROM {table} ORDER BY id") == ["1", "2", "5", "6"]


def test_a_branch_stays_its_connections_until_that_one_disconnects(
        shared: MariaDBAddress, table: str) -> None:
    """The connection-reuse finding of the module docstring."""
    a, b = MariaDBSession(shared), MariaDBSession(shared)
    try:
        gtrid = f"{table}_x"
        _prepare(a, gtrid, table, range(1, 3))
        assert f"{gtrid},b1" in _recovered(shared)
        assert XAER_NOTA in b.run(f"XA COMMIT '{gtrid}','b1'")
        assert XAER_NOTA in b.run(f"XA ROLLBACK '{gtrid}','b1'")

        assert a.run("SELECT 1") == "1"  # no table: allowed
        assert XAER_RMFAIL in a.run(f"SELECT COUNT(*) FROM {table}")
        assert XAER_RMFAIL in a.run(f"INSERT INTO {table} VALUES (9)")
        assert XAER_RMFAIL in a.run(f"XA START '{table}_y','b1'")

        a.close()  # the branch is handed over: now any connection may finish it
        assert b.run(f"XA COMMIT '{gtrid}','b1'") == ""
        assert _rows(shared, f"SELECT id FROM {table} ORDER BY id") == ["1", "2"]
    finally:
        a.kill()
        b.kill()


def test_xa_recover_needs_no_privilege_and_shows_every_users_branches(
        shared: MariaDBAddress, table: str) -> None:
    """Another user (the TLS one, no grant beyond its tables) sees ``eos``'s prepared branch
    and may roll it back: the sink must tell its branches by their xids."""
    grants = "\n".join(mariadb_sql(shared, "SHOW GRANTS").stdout.splitlines())
    assert "XA" not in grants and "SUPER" not in grants and "ADMIN" not in grants, grants
    gone = MariaDBSession(shared)
    _prepare(gone, f"{table}_z", table, range(1, 2))
    gone.close()
    other = _tls_user(shared).with_tls(_ssl_ca())
    assert f"{table}_z,b1" in _recovered(other)
    mariadb_sql(other, f"XA ROLLBACK '{table}_z','b1'")
    assert f"{table}_z,b1" not in _recovered(shared)
