"""PostgresSink over TLS, as a least-privilege role: killed drivers, bad credentials, secrets.

The role ``eos_cert`` logs in with a client certificate whose key is encrypted
(``sslpassword``), ``sslmode=verify-full`` against the test CA, and holds only what
docs/security.md lists: CONNECT, USAGE and CREATE on schema ``secure`` (the sink creates
its ledger tables there) and INSERT on the target table. Its drivers
(``examples/stream_to_postgres.py``) read the conninfo from ``$EOS_POSTGRES_CONNINFO``,
never from an argument. Every run's output (driver stdout and stderr, which on
``local[2]`` hold Spark's executor log too) is searched for every secret of the secured
services.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from connectors.sdk import CrashPoint
from examples.stream_to_files import make_input_files
from integration.services import secured as _secured
from integration.support._driver import (
    REPO,
    SEED,
    DriverRun,
    KillJob,
    kill_at_random,
    reached,
    run_cli,
)
from integration.support._fixtures_secured import PgTls, grep_secrets
from integration.support._pg import (
    DRIVER_PGOPTIONS,
    EVENTS_DDL,
    LEDGER_SUFFIXES,
    check_restart,
    token,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FILES, ROWS_PER_FILE = 4, 400


class SecureTarget:
    """A table in schema ``secure`` the role may INSERT into, and the sink's names."""

    def __init__(self, pg: PgTls, role: str = _secured.PG_CERT_ROLE) -> None:
        self.pg = pg
        suffix = token()
        self.name = f"sec_{suffix}"
        self.ledger_name = f"sec_ledger_{suffix}"
        self.sink_id = f"sec-{suffix}"
        self.role = role

    @property
    def table(self) -> str:
        return f"{self.pg.schema}.{self.name}"

    @property
    def ledger(self) -> str:
        return f"{self.pg.schema}.{self.ledger_name}"

    def _ident(self, name: str) -> sql.Composable:
        return sql.Identifier(self.pg.schema, name)

    def admin(self, statement: sql.Composable | str, params: object = None) -> list[tuple]:
        with psycopg.connect(self.pg.admin_conninfo, autocommit=True) as conn:
            cur = conn.execute(statement, params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def create(self) -> None:
        self.admin(sql.SQL("CREATE TABLE {} ({})").format(self._ident(self.name),
                                                          sql.SQL(EVENTS_DDL)))
        self.admin(sql.SQL("GRANT INSERT ON {} TO {}").format(self._ident(self.name),
                                                             sql.Identifier(self.role)))

    def ids(self) -> list[int]:
        return [int(r[0]) for r in self.admin(sql.SQL("SELECT id FROM {}").format(
            self._ident(self.name)))]

    def prepared(self) -> list[str]:
        return [str(r[0]) for r in self.admin(
            "SELECT gid FROM pg_prepared_xacts WHERE owner = %s", [self.role])]

    def ledger_states(self) -> dict[int, str]:
        if not self.admin("SELECT to_regclass(%s)", [self.ledger])[0][0]:
            return {}
        return {int(b): str(s) for b, s in self.admin(
            sql.SQL("SELECT batch_id, state FROM {} WHERE sink_id = %s").format(
                self._ident(self.ledger_name)), [self.sink_id])}

    def assert_exact(self, total: int) -> None:
        ids = self.ids()
        assert sorted(ids) == list(range(total)), (
            f"{len(ids)} rows, {len(set(ids))} distinct, expected {total}")
        assert not self.prepared(), f"prepared transactions left: {self.prepared()}"
        states = self.ledger_states()
        assert states and set(states.values()) == {"COMMITTED"}, states

    def cleanup(self) -> None:
        for gid in self.prepared():
            self.admin(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
        for name in [self.name, *(self.ledger_name + s for s in LEDGER_SUFFIXES)]:
            self.admin(sql.SQL("DROP TABLE IF EXISTS {}").format(self._ident(name)))


class SecureJob(KillJob):
    module = "examples.stream_to_postgres"

    def __init__(self, root: Path, target: SecureTarget, files: int = FILES) -> None:
        super().__init__(root, sink_id=target.sink_id, cwd=REPO)
        self.target = target
        self.input = root / "in"
        self.total = make_input_files(self.input, files, ROWS_PER_FILE)
        self.outputs: list[str] = []

    def args(self) -> list[str]:
        return ["--source", "files", "--input", str(self.input), "--checkpoint",
                str(self.checkpoint), "--table", self.target.table, "--sink-id",
                self.target.sink_id, "--ledger-table", self.target.ledger]

    def run(self, *extra: str, **kwargs: object) -> DriverRun:
        result = super().run(*extra, **kwargs)
        self.outputs.append(result.output)
        return result


@pytest.fixture
def target(pg_tls: PgTls, monkeypatch: pytest.MonkeyPatch) -> Iterator[SecureTarget]:
    monkeypatch.setenv("EOS_POSTGRES_CONNINFO", pg_tls.cert_conninfo)  # never an argument
    monkeypatch.setenv("PGOPTIONS", DRIVER_PGOPTIONS)
    found = SecureTarget(pg_tls)
    found.create()
    yield found
    found.cleanup()


def assert_no_secret(job: SecureJob, *more: str) -> None:
    leaks = grep_secrets(*job.outputs, *more, paths=(job.root,))
    assert not leaks, f"secrets in the output: {leaks}"


def test_tls_role_driver_killed_at_crash_point_and_at_random_is_exact(
    tmp_path: Path, target: SecureTarget
) -> None:
    """One job, two kills: SIGKILL at after_decision (batch 1), then at a random moment;
    each restart completes the decided batch and the table ends exact."""
    job = SecureJob(tmp_path, target, files=6)
    first = job.run(crash=f"{CrashPoint.AFTER_DECISION.value}:batch=1")
    assert first.returncode == -9, first.tail()
    assert job.reached(CrashPoint.AFTER_DECISION, 1), reached(job.crash_log)
    assert target.ledger_states().get(1) == "DECIDED", target.ledger_states()
    assert target.prepared(), "the decided batch's transactions should be prepared"
    kill_at_random(job, progress=lambda: len(target.ledger_states()), runs=1,
                   max_delay=1.5, seed=SEED, check=check_restart)
    target.assert_exact(job.total)
    # The operator CLI over TLS, the connection string from the variable (no argument).
    code, status, err = run_cli("status", "--postgres-env", "EOS_POSTGRES_CONNINFO",
                                "--ledger-table", target.ledger, "--sink-id", target.sink_id)
    assert code == 0, (status, err)
    assert target.sink_id in json.dumps(status), status
    assert_no_secret(job, json.dumps(status), err)


def _bad_run(tmp_path: Path, target: SecureTarget, conninfo: str,
             monkeypatch: pytest.MonkeyPatch) -> tuple[SecureJob, DriverRun]:
    monkeypatch.setenv("EOS_POSTGRES_CONNINFO", conninfo)
    job = SecureJob(tmp_path, target, files=2)
    bad = job.run()
    assert bad.returncode != 0, bad.tail()
    assert target.ids() == [] and not target.prepared() and not target.ledger_states()
    return job, bad


def _fixed_run(job: SecureJob, target: SecureTarget, monkeypatch: pytest.MonkeyPatch,
               conninfo: str) -> None:
    monkeypatch.setenv("EOS_POSTGRES_CONNINFO", conninfo)
    check_restart(job.run())
    target.assert_exact(job.total)
    assert_no_secret(job)


def test_wrong_password_names_the_password_then_exact_after_the_fix(
    tmp_path: Path, pg_tls: PgTls, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = SecureTarget(pg_tls, role=_secured.PG_TLS_ROLE)
    target.create()
    try:
        wrong = pg_tls.scram_conninfo.replace(_secured.PG_TLS_PASSWORD, "Wrong-Pass-77x")
        job, bad = _bad_run(tmp_path, target, wrong, monkeypatch)
        assert "password" in bad.output and "Wrong-Pass-77x" not in bad.output, bad.tail()
        assert "CannotConnectError" in bad.output, bad.tail()  # a ConfigurationError
        _fixed_run(job, target, monkeypatch, pg_tls.scram_conninfo)
    finally:
        target.cleanup()


def test_verify_full_against_another_ca_names_sslrootcert_then_exact_after_the_fix(
    tmp_path: Path, target: SecureTarget, pg_tls: PgTls, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = pg_tls.cert_conninfo.replace(f"sslrootcert={pg_tls.tls.ca}",
                                         f"sslrootcert={pg_tls.tls.other_ca}")
    assert other != pg_tls.cert_conninfo
    job, bad = _bad_run(tmp_path, target, other, monkeypatch)
    assert "sslrootcert must name the CA" in bad.output, bad.tail()
    assert "CannotConnectError" in bad.output, bad.tail()
    code, out, err = run_cli("status", "--postgres-env", "EOS_POSTGRES_CONNINFO",
                             "--ledger-table", target.ledger, "--sink-id", target.sink_id)
    assert code == 3 and "sslrootcert must name the CA" in err, (code, out, err)
    job.outputs.append(f"{out}\n{err}")
    _fixed_run(job, target, monkeypatch, pg_tls.cert_conninfo)


def test_secured_role_cannot_use_plain_tcp(pg_tls: PgTls) -> None:
    """The service's pg_hba.conf lets the secured roles in over TLS only."""
    plain = pg_tls.scram_conninfo.replace("sslmode=verify-full", "sslmode=disable")
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(plain, connect_timeout=5).close()
    assert os.path.exists(pg_tls.tls.ca)


def test_upsert_as_a_role_holding_insert_select_update(pg_tls: PgTls, spark: object) -> None:
    """mode="upsert" needs INSERT, SELECT and UPDATE on the table (docs/security.md): as
    the scram role with exactly those (and the schema's USAGE, CREATE for its ledger), a
    batch job run twice over the same keys leaves the newest value of each."""
    from connectors.postgres import PostgresSink

    target = SecureTarget(pg_tls, role=_secured.PG_TLS_ROLE)
    target.admin(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, name text)").format(
        target._ident(target.name)))
    target.admin(sql.SQL("GRANT INSERT, SELECT, UPDATE ON {} TO {}").format(
        target._ident(target.name), sql.Identifier(target.role)))
    try:
        for run, suffix in ((0, "a"), (1, "b")):
            rows = spark.range(50).selectExpr(  # type: ignore[attr-defined]
                "id", f"CONCAT('user-', CAST(id AS STRING), '-{suffix}') AS name")
            sink = PostgresSink(pg_tls.scram_conninfo, target.table, sink_id=target.sink_id,
                                ledger_table=target.ledger, mode="upsert", key_columns=["id"])
            sink(rows, run)
            assert _secured.PG_TLS_PASSWORD not in repr(sink)
        got = target.admin(sql.SQL("SELECT id, name FROM {} ORDER BY id").format(
            target._ident(target.name)))
        assert got == [(i, f"user-{i}-b") for i in range(50)], got[:5]
        assert not target.prepared()
    finally:
        target.cleanup()


def test_the_conninfos_own_options_reach_the_server_beside_the_sinks(pg_tls: PgTls) -> None:
    """A user's ``options`` (``-c search_path=...``) is kept: the sink adds its
    ``lock_timeout`` to it instead of replacing it."""
    from connectors.postgres._config import Conninfo
    from connectors.postgres._ledger import DriverConnection

    conninfo = Conninfo(pg_tls.scram_conninfo + " options='-c search_path=secure'")
    driver = DriverConnection(conninfo, 10, "sec-options", lock_timeout="7s")
    assert driver.fetch("reading settings", "SHOW search_path") == [("secure",)]
    assert driver.fetch("reading settings", "SHOW lock_timeout") == [("7s",)]
