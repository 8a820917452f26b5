"""PostgresSink passes the same conformance suite as the in-memory sinks, on a real server,
as a callable and in its DataSource form.

Tasks run in-process (``LocalBatch``: simulated retries and speculative attempts), the
transactions are real PostgreSQL prepared transactions, the ledger real tables.
"""

from __future__ import annotations

import itertools
import secrets
from typing import Any

import psycopg
import pytest

from connectors.core.naming import TransactionId
from connectors.postgres import XID_FORMAT_ID, PostgresSink
from connectors.postgres._gid import decode_gid
from connectors.testing import DataSourceFormHarness, SinkConformanceTests, SinkHarness

pytestmark = pytest.mark.integration
_counter = itertools.count()
_RUN = secrets.token_hex(4)


class PostgresHarness(SinkHarness):
    def __init__(self, conninfo: str) -> None:
        n = next(_counter)
        self.conninfo = conninfo
        self.table = f"conformance_{_RUN}_{n}"
        self.sink_id = f"conf-{_RUN}-{n}"  # the ledger table outlives this test run
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {self.table}")
            conn.execute(f"CREATE TABLE {self.table} (batch bigint, seq bigint, payload text)")

    def new_sink(self, **overrides: Any) -> PostgresSink:
        options: dict[str, Any] = {"sink_id": self.sink_id, "ledger_table": "eos_conformance"}
        options.update(overrides)
        return PostgresSink(self.conninfo, self.table, **options)

    def committed_rows(self) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.conninfo) as conn:
            return conn.execute(f"SELECT batch, seq, payload FROM {self.table}").fetchall()

    def lingering_transactions(self) -> int:
        with psycopg.connect(self.conninfo) as conn:
            gids = [r[0] for r in conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall()]
        count = 0
        for gid in gids:
            xid = decode_gid(gid)
            if xid is None or xid[0] != XID_FORMAT_ID:
                continue
            tid = TransactionId.from_xid_parts(xid[1], xid[2])
            if tid is not None and tid.sink_id in (self.sink_id, f"{self.sink_id}-2"):
                count += 1
        return count


class TestPostgresSinkConformance(SinkConformanceTests):
    @pytest.fixture(autouse=True)
    def _conninfo(self, postgres_conninfo: str) -> None:
        self.conninfo = postgres_conninfo

    def make_harness(self) -> SinkHarness:
        return PostgresHarness(self.conninfo)


class TestPostgresSinkConformanceInItsDataSourceForm(SinkConformanceTests):
    """The same suite through the DataSource form's split batch (the sink driver's
    ``plan``, ``commit``): planned, tasks run, committed, each step with its own sink and
    ledger connection."""

    @pytest.fixture(autouse=True)
    def _conninfo(self, postgres_conninfo: str) -> None:
        self.conninfo = postgres_conninfo

    def make_harness(self) -> SinkHarness:
        return DataSourceFormHarness(PostgresHarness(self.conninfo))
