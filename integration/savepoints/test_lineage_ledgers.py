"""The lineage of a resumed sink in the ledgers of the real services: the Kafka ledger
topic (``lineage/<query>`` keys, read back by a new driver's ledger and by the operator's
read-only one) and PostgreSQL (``<ledger>_lineage``, made by the first link only).
The file and object ledgers are proved in tests/savepoints/test_lineage.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from connectors.core.ledgers.ledger import Lineage, lineage_chain
from connectors.kafka._config import KafkaConfig
from connectors.kafka._io import Admin
from connectors.kafka._ledger import KafkaLedger
from connectors.postgres.admin import PostgresAdmin
from integration.support._kafka import KafkaTarget
from integration.support._pg import PgTarget

pytestmark = pytest.mark.integration

A_TO_B = Lineage("q-b", "q-a", 4, 100.0, 200.0)
B_TO_C = Lineage("q-c", "q-b", 9, 300.0, 400.0)


@pytest.fixture
def kafka(kafka_bootstrap: str) -> Iterator[KafkaTarget]:
    target = KafkaTarget(kafka_bootstrap, prefix="lineage")
    yield target
    target.cleanup()


def test_the_kafka_ledger_keeps_the_links_across_drivers(kafka: KafkaTarget) -> None:
    config = KafkaConfig({"bootstrap.servers": kafka.bootstrap})
    admin = Admin(config, 30.0, kafka.sink_id)

    def ledger(read_only: bool = False) -> KafkaLedger:
        return KafkaLedger(config, kafka.ledger_topic, sink_id=kafka.sink_id, admin=admin,
                           read_only=read_only)

    first = ledger()
    try:
        first.bind_query("q-a")
        first.record_lineage(A_TO_B)
        first.bind_query("q-b", reset=True)
        first.record_lineage(B_TO_C)
        first.record_lineage(B_TO_C)  # a restart records it again: one link
        first.bind_query("q-c", reset=True)
        assert sorted(first.lineage(), key=lambda x: x.query_id) == [A_TO_B, B_TO_C]
    finally:
        first.close()
    for later in (ledger(), ledger(read_only=True)):  # a new driver; the operator's view
        try:
            assert lineage_chain(later.lineage(), later.bound_query()) == [A_TO_B, B_TO_C]
        finally:
            later.close()


def test_the_postgres_ledger_makes_its_lineage_table_with_the_first_link(
        postgres_conninfo: str) -> None:
    pg = PgTarget(postgres_conninfo, prefix="lineage")
    admin = PostgresAdmin(postgres_conninfo, f"public.{pg.ledger}")
    try:
        ledger = admin.ledger(pg.sink_id)
        assert ledger.lineage() == [] and not pg.exists(pg.ledger + "_lineage")
        ledger.record_lineage(A_TO_B)
        ledger.record_lineage(A_TO_B)
        other = admin.ledger(f"{pg.sink_id}-{uuid.uuid4().hex[:4]}")  # its own links only
        assert other.lineage() == []
        assert ledger.lineage() == [A_TO_B] and pg.exists(pg.ledger + "_lineage")
    finally:
        admin.close()
        pg.cleanup()
