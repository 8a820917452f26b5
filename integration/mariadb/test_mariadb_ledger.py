"""The MariaDB sink's driver side on a real server: its ledger (decisions, aborts, the query
binding, the epoch that fences an older driver, pruning) and its committer (``XA COMMIT``
by xid, idempotent through receipts; a branch still attached to its session retried, never
presumed lost; one rolled back by hand a ``DataLossError``; ``XA RECOVER`` filtered by sink).

Branches are prepared the way the sink's tasks prepare them: on a PyMySQL connection of
their own, with the receipt row inside the branch."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from connectors.core.errors import DataLossError, FencedError, TransientError
from connectors.core.fingerprint import Fingerprint
from connectors.core.ledgers.ledger import LedgerEntry, TaskCommit
from connectors.core.naming import TransactionId
from connectors.core.states import BatchState
from connectors.mariadb._client import connect
from connectors.mariadb._committer import Committer
from connectors.mariadb._config import Address, TableName
from connectors.mariadb._ledger import DriverConnection, MariaDBLedger
from connectors.mariadb._xid import xid_sql

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


#: This module's sink ids, unique per run (other tests' sinks prepare branches meanwhile);
#: the other sink's id extends this one's (the committer must match ids exactly).
S1 = f"s1-{uuid.uuid4().hex[:6]}"
S10 = f"{S1}0"


@pytest.fixture
def env(mariadb_url: str) -> Iterator[dict[str, Any]]:
    address = Address(mariadb_url)
    name = f"led_{uuid.uuid4().hex[:10]}"
    db = DriverConnection(address, connect_timeout=10, lock_wait_timeout=10, sink_id=S1)
    yield {"address": address, "table": TableName(address.database, name), "db": db}
    for sink in (S1, S10):  # what a failed test left prepared
        for tid in Committer(db, TableName(address.database, name), sink_id=sink).list_prepared():
            Committer(db, TableName(address.database, name), sink_id=sink).abort(tid)
    for suffix in ("", "_aborts", "_bindings", "_receipts", "_lineage", "_t"):
        db.fetch("cleanup", f"DROP TABLE IF EXISTS {TableName(address.database, name).sql(suffix)}")
    db.close()


def commit_of(tid: str) -> TaskCommit:
    return TaskCommit(tid, 0, 0, Fingerprint(1, 0xAB))


def entry(batch: int, run: str = "r1", state: BatchState = BatchState.DECIDED,
          *tids: str) -> LedgerEntry:
    return LedgerEntry(sink_id=S1, batch_id=batch, run_id=run, state=state,
                       commits=tuple(commit_of(t) for t in tids),
                       fingerprint=Fingerprint(3, 0xABC), query_id="q1")


def test_decisions_first_wins_aborts_fence_and_epochs_fence_older_drivers(
        env: dict[str, Any]) -> None:
    ledger = MariaDBLedger(env["db"], env["table"], sink_id=S1)
    ledger.open_run("r1")
    assert ledger.bind_query("q1") == 0 and ledger.bound_query() == "q1"
    first = ledger.decide(entry(0, "r1", BatchState.DECIDED, f"eos1|{S1}|0a0a0a0a|0|1"))
    again = ledger.decide(entry(0, "r2"))
    assert again.run_id == "r1" and again.commits == first.commits
    assert ledger.get(0) is not None and ledger.get(0).fingerprint == Fingerprint(3, 0xABC)  # type: ignore[union-attr]
    assert ledger.unfinished()[0].batch_id == 0
    ledger.mark_committed(0)
    assert ledger.unfinished() == [] and ledger.last_batch_id() == 0
    assert ledger.forbid_decision(1, "r9") is None
    with pytest.raises(FencedError, match="aborted"):
        ledger.decide(entry(1, "r9"))
    newer = MariaDBLedger(DriverConnection(env["address"], connect_timeout=10,
                                           lock_wait_timeout=10, sink_id=S1),
                          env["table"], sink_id=S1)
    newer.open_run("r3")  # another driver took over
    with pytest.raises(FencedError, match="took over"):
        ledger.decide(entry(2))
    newer.decide(entry(2, "r3"))
    for batch in range(3, 25):
        newer.decide(entry(batch, "r3", BatchState.COMMITTED))
    newer.prune(5)  # a DECIDED batch (2) is never pruned
    assert [e.batch_id for e in newer.entries()] == [2, 20, 21, 22, 23, 24]
    with pytest.raises(Exception, match="bound"):
        newer.bind_query("q2")
    assert newer.bind_query("q2", reset=True) == 1 and newer.entries() == []
    newer.close()


def prepare(address: Address, ledger: TableName, tid: TransactionId, *,
            disconnect: bool = True) -> Any:
    """A branch prepared as a task prepares it (rows, receipt, XA END, XA PREPARE)."""
    conn = connect(address, connect_timeout=10, lock_wait_timeout=10)
    cur = conn.cursor()
    cur.execute(f"XA START {xid_sql(tid)}")
    cur.execute(f"INSERT INTO {ledger.sql('_t')} VALUES (%s)", (tid.batch_id,))
    cur.execute(f"INSERT INTO {ledger.sql('_receipts')} (xid, sink_id, batch_id, `rows`, "
                "digest) VALUES (%s, %s, %s, 1, 'ab')", (str(tid), tid.sink_id, tid.batch_id))
    cur.execute(f"XA END {xid_sql(tid)}")
    cur.execute(f"XA PREPARE {xid_sql(tid)}")
    if disconnect:
        close_session(address, conn)
        return None
    return conn


def close_session(address: Address, conn: Any) -> None:
    """Close ``conn`` and wait until the server has ended its session: a client's close
    returns before the server detaches the session's prepared branch (CI once committed
    in that gap and got the branch's ``XAER_NOTA``)."""
    session = conn.thread_id()
    conn.close()
    probe = connect(address, connect_timeout=10, lock_wait_timeout=10)
    try:
        cur = probe.cursor()
        deadline = time.monotonic() + 30
        while True:
            cur.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s",
                        (session,))
            if cur.fetchone()[0] == 0:
                return
            assert time.monotonic() < deadline, f"session {session} still open after 30 s"
            time.sleep(0.02)
    finally:
        probe.close()


def test_the_committer_settles_branches_by_xid(env: dict[str, Any]) -> None:
    db, table, address = env["db"], env["table"], env["address"]
    ledger = MariaDBLedger(db, table, sink_id=S1)
    ledger.open_run("r1")  # makes the ledger's tables
    db.fetch("t", f"CREATE TABLE {table.sql('_t')} (b BIGINT) ENGINE=InnoDB")
    committer = Committer(db, table, sink_id=S1)
    a, b, c = (TransactionId(S1, "0b0b0b0b", n, n + 100) for n in (1, 2, 3))
    other = TransactionId(S10, "0b0b0b0b", 4, 104)  # another sink: a longer id, not ours
    for tid in (a, b, other):
        prepare(address, table, tid)
    attached = prepare(address, table, c, disconnect=False)
    try:
        assert sorted(committer.list_prepared()) == sorted(str(t) for t in (a, b, c))
        committer.commit(commit_of(str(a)))
        committer.commit(commit_of(str(a)))  # again: its receipt proves it
        with pytest.raises(TransientError, match="still attached"):
            committer.commit(commit_of(str(c)))  # XAER_NOTA, but listed: retried
    finally:
        close_session(address, attached)
    committer.commit(commit_of(str(c)))  # once its session is gone
    committer.abort(str(b))
    committer.abort(str(b))  # gone already: nothing to do
    with pytest.raises(DataLossError, match="neither prepared nor committed"):
        committer.commit(commit_of(str(b)))
    assert committer.list_prepared() == []
    rows = sorted(r[0] for r in db.fetch("read", f"SELECT b FROM {table.sql('_t')}"))
    assert rows == [1, 3], "a and c committed once each, b rolled back"
    assert Committer(db, table, sink_id=S10).list_prepared() == [str(other)]
    Committer(db, table, sink_id=S10).abort(str(other))
    assert Committer(db, table, sink_id=S10).list_prepared() == []


def test_an_address_with_ssl_ca_connects_over_verified_tls_and_one_without_is_refused(
        mariadb_url: str) -> None:
    """The TLS-only user (``REQUIRE SSL``): ``?ssl_ca=`` connects over TLS with the server's
    certificate verified; without it the sink connects in plain TCP and is refused with a
    configuration error that names no password; a wrong CA is refused too."""
    from urllib.parse import quote as q

    from connectors.core.errors import ConfigurationError
    from integration.mariadb.test_mariadb_service import _setting, _ssl_ca
    from integration.services import (
        ENV_MARIADB_TLS_PASSWORD,
        ENV_MARIADB_TLS_USER,
        MARIADB_TLS_PASSWORD,
        MARIADB_TLS_USER,
    )

    plain = Address(mariadb_url)
    user = _setting(ENV_MARIADB_TLS_USER, MARIADB_TLS_USER)
    password = _setting(ENV_MARIADB_TLS_PASSWORD, MARIADB_TLS_PASSWORD)
    base = f"mariadb://{q(user)}:{q(password)}@{plain.host}:{plain.port}/{plain.database}"
    conn = connect(Address(f"{base}?ssl_ca={_ssl_ca()}&ssl_verify_identity=false"),
                   connect_timeout=10, lock_wait_timeout=10)
    with conn.cursor() as cur:
        cur.execute("SHOW SESSION STATUS LIKE 'Ssl_version'")
        assert str(cur.fetchone()[1]).startswith("TLS")
    conn.close()
    with pytest.raises(ConfigurationError) as err:
        connect(Address(base), connect_timeout=10, lock_wait_timeout=10)
    assert password not in str(err.value) and "1045" in str(err.value)
    with pytest.raises(ConfigurationError, match="ssl_ca") as wrong:  # not the test CA
        connect(Address(f"{base}?ssl_ca=/etc/ssl/certs/ca-certificates.crt"),
                connect_timeout=10, lock_wait_timeout=10)
    assert password not in str(wrong.value)
