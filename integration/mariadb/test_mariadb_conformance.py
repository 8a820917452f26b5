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


class MariaDBUpsertHarness(MariaDBHarness):
    """The same suite through ``mode="upsert"`` on a table keyed by (batch, seq): each row
    its own key, so the upsert must land exactly the rows an append would, through its
    staging table, key routing and ``ON DUPLICATE KEY UPDATE``. A speculative attempt
    meets the keys the accepted attempt's prepared branch locks: a short lock wait fails it
    (discarded, as Spark discards it), never a second write. The prefix-isolation scenario's
    second sink (``<id>-2``) writes the same keys: it upserts into a table of its own (two
    sinks upserting one key wait on each other's prepared branches by design), and the
    committed rows are both tables'."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.other = TableName(self.table.database, f"{self.table.name}_2")
        _rows(self.address, f"ALTER TABLE {self.table.sql()} MODIFY batch BIGINT NOT NULL, "
                            "MODIFY seq BIGINT NOT NULL, ADD PRIMARY KEY (batch, seq)")
        _rows(self.address, f"DROP TABLE IF EXISTS {self.other.sql()}")
        _rows(self.address, f"CREATE TABLE {self.other.sql()} LIKE {self.table.sql()}")

    def new_sink(self, **overrides: Any) -> MariaDBSink:
        options: dict[str, Any] = {"sink_id": self.sink_id, "ledger_table": LEDGER,
                                   "mode": "upsert", "key_columns": ["batch", "seq"],
                                   "lock_wait_timeout": 2}
        options.update(overrides)
        table = self.table if options["sink_id"] == self.sink_id else self.other
        return MariaDBSink(self.url, table.name, **options)

    def committed_rows(self) -> list[tuple[Any, ...]]:
        return [tuple(r) for t in (self.table, self.other) for r in _rows(
            self.address, f"SELECT batch, seq, payload FROM {t.sql()}")]


class TestMariaDBSinkConformanceInUpsertMode(SinkConformanceTests):
    @pytest.fixture(autouse=True)
    def _url(self, mariadb_url: str) -> None:
        self.url = mariadb_url

    def make_harness(self) -> SinkHarness:
        return MariaDBUpsertHarness(self.url)
