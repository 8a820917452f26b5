"""MariaDBSink passes the same conformance suite as the in-memory sinks, on a real server.

Tasks run in-process (``LocalBatch``: simulated retries and speculative attempts), the
branches are real XA branches of MariaDB (each prepared on a connection of its own, then
detached), the ledger real InnoDB tables.
"""

from __future__ import annotations

import itertools
import secrets
from typing import Any

import pytest

from connectors.core.naming import TransactionId
from connectors.mariadb._client import connect
from connectors.mariadb._config import Address, TableName
from connectors.mariadb._sink import MariaDBSink
from connectors.mariadb._xid import transaction_id_of_row
from connectors.testing import SinkConformanceTests, SinkHarness

pytestmark = pytest.mark.integration
_counter = itertools.count()
_RUN = secrets.token_hex(4)
LEDGER = "eos_conformance"


def _rows(address: Address, statement: str) -> list[Any]:
    conn = connect(address, connect_timeout=10, lock_wait_timeout=10)
    try:
        with conn.cursor() as cur:
            cur.execute(statement)
            return list(cur.fetchall())
    finally:
        conn.close()


class MariaDBHarness(SinkHarness):
    def __init__(self, url: str) -> None:
        n = next(_counter)
        self.url = url
        self.address = Address(url)
        self.table = TableName(self.address.database, f"conformance_{_RUN}_{n}")
        self.sink_id = f"conf-{_RUN}-{n}"  # the ledger tables outlive this test run
        _rows(self.address, f"DROP TABLE IF EXISTS {self.table.sql()}")
        _rows(self.address, f"CREATE TABLE {self.table.sql()} (batch BIGINT, seq BIGINT, "
                            "payload TEXT) ENGINE=InnoDB")

    def new_sink(self, **overrides: Any) -> MariaDBSink:
        options: dict[str, Any] = {"sink_id": self.sink_id, "ledger_table": LEDGER}
        options.update(overrides)
        return MariaDBSink(self.url, self.table.name, **options)

    def committed_rows(self) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in _rows(self.address,
                                        f"SELECT batch, seq, payload FROM {self.table.sql()}")]

    def lingering_transactions(self) -> int:
        found = [transaction_id_of_row(r) for r in _rows(self.address, "XA RECOVER")]
        mine: list[TransactionId] = [t for t in found if t is not None]
        return sum(1 for t in mine if t.sink_id in (self.sink_id, f"{self.sink_id}-2"))


class TestMariaDBSinkConformance(SinkConformanceTests):
    @pytest.fixture(autouse=True)
    def _url(self, mariadb_url: str) -> None:
        self.url = mariadb_url

    def make_harness(self) -> SinkHarness:
        return MariaDBHarness(self.url)
