"""The test services really provide what the exactly-once sinks rely on.

PostgreSQL: two-phase commit (prepared transactions that another connection finishes,
that stay invisible until committed and survive a crash). Kafka: transactions with
read_committed isolation, enforced by the broker, and a last stable offset that trails
the high watermark while a transaction is open.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]
from confluent_kafka.cimpl import NewTopic
from psycopg import sql

from integration._fixtures_services import NativeKafka, NativePostgres

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

KAFKA_TIMEOUT = 30.0


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


# =========================================================================== PostgreSQL


@pytest.fixture
def pg_table(postgres_conninfo: str) -> Iterator[str]:
    """A fresh table; afterwards leftover prepared transactions on it are rolled back."""
    table = _unique("svc_tpc")
    with psycopg.connect(postgres_conninfo, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text NOT NULL)").format(
                sql.Identifier(table)
            )
        )
    yield table
    with psycopg.connect(postgres_conninfo, autocommit=True) as conn:
        # A forgotten prepared transaction would hold its locks (and block DROP) forever.
        for xid in conn.tpc_recover():
            if table in xid.gtrid:
                conn.tpc_rollback(xid)
        conn.execute("SET lock_timeout = '10s'")
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


def _count(conninfo: str, table: str) -> int:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
        ).fetchone()
    assert row is not None
    return int(row[0])


def _prepared_gids(conninfo: str) -> set[str]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
        ).fetchall()
    return {str(gid) for (gid,) in rows}


def _prepare_row(conninfo: str, table: str, xid_gtrid: str) -> None:
    """Insert one row in a two-phase transaction and prepare it; the connection closes."""
    # Not ``with connect()``: its exit calls commit(), which psycopg forbids after
    # tpc_prepare(). Closing leaves the prepared transaction in place (the point here).
    conn = psycopg.connect(conninfo)
    try:
        xid = conn.xid(4242, xid_gtrid, "branch-0")
        conn.tpc_begin(xid)
        conn.execute(
            sql.SQL("INSERT INTO {} (id, note) VALUES (%s, %s)").format(sql.Identifier(table)),
            [1, "prepared"],
        )
        conn.tpc_prepare()
    finally:
        conn.close()


def test_postgres_settings_allow_two_phase_commit(postgres_conninfo: str) -> None:
    with psycopg.connect(postgres_conninfo, autocommit=True) as conn:
        settings: dict[str, str] = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings "
                "WHERE name IN ('max_prepared_transactions', 'max_connections', "
                "'server_version_num')"
            ).fetchall()
        )
    assert int(settings["max_prepared_transactions"]) >= 64
    assert int(settings["max_connections"]) >= 100
    assert int(settings["server_version_num"]) >= 150000


def test_tpc_commit_from_another_connection(postgres_conninfo: str, pg_table: str) -> None:
    gtrid = f"commit-{pg_table}"
    _prepare_row(postgres_conninfo, pg_table, gtrid)

    with psycopg.connect(postgres_conninfo, autocommit=True) as other:
        recovered = {x.gtrid: x for x in other.tpc_recover()}
        assert gtrid in recovered, f"prepared xid not recovered: {sorted(recovered)}"
        assert recovered[gtrid].format_id == 4242
        assert recovered[gtrid].bqual == "branch-0"
        assert recovered[gtrid].database == other.info.dbname
        # Prepared but not committed: invisible to everybody.
        assert _count(postgres_conninfo, pg_table) == 0

        other.tpc_commit(recovered[gtrid])

    assert _count(postgres_conninfo, pg_table) == 1
    with psycopg.connect(postgres_conninfo, autocommit=True) as conn:
        assert gtrid not in {x.gtrid for x in conn.tpc_recover()}


def test_tpc_rollback_from_another_connection(postgres_conninfo: str, pg_table: str) -> None:
    gtrid = f"rollback-{pg_table}"
    _prepare_row(postgres_conninfo, pg_table, gtrid)

    with psycopg.connect(postgres_conninfo, autocommit=True) as other:
        recovered = {x.gtrid: x for x in other.tpc_recover()}
        assert gtrid in recovered
        assert _count(postgres_conninfo, pg_table) == 0
        other.tpc_rollback(recovered[gtrid])
        assert gtrid not in {x.gtrid for x in other.tpc_recover()}

    assert _count(postgres_conninfo, pg_table) == 0


def test_sql_prepare_transaction_and_commit_prepared(postgres_conninfo: str, pg_table: str) -> None:
    committed_gid = f"sql-commit-{pg_table}"
    rolled_back_gid = f"sql-rollback-{pg_table}"
    insert = sql.SQL("INSERT INTO {} (id, note) VALUES (%s, %s)").format(sql.Identifier(pg_table))

    with psycopg.connect(postgres_conninfo, autocommit=True) as conn:
        for row_id, gid in ((1, committed_gid), (2, rolled_back_gid)):
            conn.execute("BEGIN")
            conn.execute(insert, [row_id, gid])
            conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
        # The session is free again: PREPARE TRANSACTION detached the work from it.
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE

    assert {committed_gid, rolled_back_gid} <= _prepared_gids(postgres_conninfo)
    assert _count(postgres_conninfo, pg_table) == 0

    with psycopg.connect(postgres_conninfo, autocommit=True) as other:
        other.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(committed_gid)))
        other.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(rolled_back_gid)))
        rows = other.execute(
            sql.SQL("SELECT id, note FROM {} ORDER BY id").format(sql.Identifier(pg_table))
        ).fetchall()
        with pytest.raises(psycopg.errors.UndefinedObject):
            other.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(committed_gid)))

    assert rows == [(1, committed_gid)]
    assert not {committed_gid, rolled_back_gid} & _prepared_gids(postgres_conninfo)


def test_prepared_transaction_survives_postgres_crash(
    native_postgres: NativePostgres, pg_table: str
) -> None:
    conninfo = native_postgres.conninfo
    gtrid = f"crash-{pg_table}"
    _prepare_row(conninfo, pg_table, gtrid)

    info = native_postgres.restart(mode="immediate")  # no shutdown checkpoint: crash recovery
    assert info.conninfo == conninfo

    with psycopg.connect(conninfo, autocommit=True) as conn:
        recovered = {x.gtrid: x for x in conn.tpc_recover()}
        assert gtrid in recovered
        assert _count(conninfo, pg_table) == 0
        conn.tpc_commit(recovered[gtrid])
    assert _count(conninfo, pg_table) == 1


# ================================================================================ Kafka


@pytest.fixture
def admin(kafka_bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_bootstrap})


@pytest.fixture
def topic(admin: AdminClient) -> Iterator[str]:
    name = _unique("svc-topic")
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=1, replication_factor=1)], request_timeout=KAFKA_TIMEOUT
    )
    futures[name].result(timeout=KAFKA_TIMEOUT)
    yield name
    admin.delete_topics([name], request_timeout=KAFKA_TIMEOUT)[name].result(timeout=KAFKA_TIMEOUT)


def _producer(bootstrap: str, transactional_id: str) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "enable.idempotence": True,
            "acks": "all",
            "transaction.timeout.ms": 60000,
        }
    )
    producer.init_transactions(KAFKA_TIMEOUT)
    return producer


def _produce(producer: Producer, topic: str, values: list[str]) -> None:
    for value in values:
        producer.produce(topic, value=value.encode())
    remaining = producer.flush(KAFKA_TIMEOUT)
    assert remaining == 0, f"{remaining} records not delivered within {KAFKA_TIMEOUT}s"


def _consume_all(bootstrap: str, topic: str, isolation: str) -> list[str]:
    """Every value in partition 0 from the start up to its end for ``isolation``."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": _unique("svc-group"),
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    values: list[str] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + KAFKA_TIMEOUT
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return values
                raise KafkaException(error)
            payload = message.value()
            assert isinstance(payload, bytes)
            values.append(payload.decode())
    finally:
        consumer.close()
    raise AssertionError(f"no end of partition within {KAFKA_TIMEOUT}s ({isolation}); got {values}")


def _latest_offset(admin: AdminClient, topic: str, level: IsolationLevel) -> int:
    """ListOffsets(latest) of partition 0.

    librdkafka's admin ListOffsets keeps the leader epoch it cached before a broker
    restart and then fails with FENCED_LEADER_EPOCH (not flagged retriable) until its
    metadata is refreshed; ``list_topics`` refreshes it, then the call is retried.
    """
    partition = TopicPartition(topic, 0)
    deadline = time.monotonic() + KAFKA_TIMEOUT
    while True:
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        futures = admin.list_offsets(
            {partition: latest}, isolation_level=level, request_timeout=KAFKA_TIMEOUT
        )
        (future,) = futures.values()
        try:
            return int(future.result(timeout=KAFKA_TIMEOUT).offset)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            stale = isinstance(error, KafkaError) and (
                error.retriable()
                or error.code() in (KafkaError.FENCED_LEADER_EPOCH, KafkaError._NOENT)
            )
            if not stale or time.monotonic() > deadline:
                raise
            admin.list_topics(topic=topic, timeout=KAFKA_TIMEOUT)
            time.sleep(0.2)


def _end_offsets(admin: AdminClient, topic: str) -> tuple[int, int]:
    """(last stable offset, high watermark) of partition 0."""
    return (
        _latest_offset(admin, topic, IsolationLevel.READ_COMMITTED),
        _latest_offset(admin, topic, IsolationLevel.READ_UNCOMMITTED),
    )


def _wait_until_stable(admin: AdminClient, topic: str, high_watermark: int) -> None:
    """Wait for the transaction markers: committing returns before they are all written."""
    deadline = time.monotonic() + KAFKA_TIMEOUT
    offsets = _end_offsets(admin, topic)
    while offsets != (high_watermark, high_watermark):
        if time.monotonic() > deadline:
            raise AssertionError(
                f"(last stable offset, high watermark) = {offsets}, "
                f"expected both {high_watermark} within {KAFKA_TIMEOUT}s"
            )
        time.sleep(0.2)
        offsets = _end_offsets(admin, topic)


def test_kafka_transactions_isolate_aborted_records(
    kafka_bootstrap: str, admin: AdminClient, topic: str
) -> None:
    aborted = [f"aborted-{i}" for i in range(3)]
    committed = [f"committed-{i}" for i in range(3)]
    producer = _producer(kafka_bootstrap, _unique("svc-txn"))

    producer.begin_transaction()
    _produce(producer, topic, aborted)
    producer.abort_transaction(KAFKA_TIMEOUT)

    producer.begin_transaction()
    _produce(producer, topic, committed)
    producer.commit_transaction(KAFKA_TIMEOUT)
    # 6 records + 2 transaction markers; once nothing is open, LSO == high watermark.
    _wait_until_stable(admin, topic, len(aborted) + len(committed) + 2)

    # The broker filters aborted data for read_committed consumers (via the aborted
    # transaction index) while read_uncommitted ones see everything: a broker or set-up
    # that ignores isolation would give the same list twice.
    assert _consume_all(kafka_bootstrap, topic, "read_committed") == committed
    assert _consume_all(kafka_bootstrap, topic, "read_uncommitted") == aborted + committed


def test_kafka_last_stable_offset_waits_for_open_transaction(
    kafka_bootstrap: str, admin: AdminClient, topic: str
) -> None:
    producer = _producer(kafka_bootstrap, _unique("svc-txn"))
    producer.begin_transaction()
    _produce(producer, topic, ["open-0", "open-1"])

    last_stable, high_watermark = _end_offsets(admin, topic)
    assert (last_stable, high_watermark) == (0, 2)
    assert _consume_all(kafka_bootstrap, topic, "read_committed") == []

    producer.commit_transaction(KAFKA_TIMEOUT)
    _wait_until_stable(admin, topic, 3)
    assert _consume_all(kafka_bootstrap, topic, "read_committed") == ["open-0", "open-1"]


def test_kafka_keeps_committed_data_and_fences_across_broker_restart(
    native_kafka: NativeKafka, admin: AdminClient, topic: str
) -> None:
    bootstrap = native_kafka.bootstrap
    transactional_id = _unique("svc-txn")
    producer = _producer(bootstrap, transactional_id)
    producer.begin_transaction()
    _produce(producer, topic, ["before-restart"])
    producer.commit_transaction(KAFKA_TIMEOUT)
    _wait_until_stable(admin, topic, 2)

    info = native_kafka.restart()
    assert info.bootstrap == bootstrap

    assert _consume_all(bootstrap, topic, "read_committed") == ["before-restart"]
    # A new instance with the same transactional.id (a restarted writer) fences the old
    # one and can commit again on the restarted broker.
    successor = _producer(bootstrap, transactional_id)
    successor.begin_transaction()
    _produce(successor, topic, ["after-restart"])
    successor.commit_transaction(KAFKA_TIMEOUT)
    _wait_until_stable(admin, topic, 4)
    assert _consume_all(bootstrap, topic, "read_committed") == ["before-restart", "after-restart"]
    with pytest.raises(KafkaException):
        producer.begin_transaction()
        producer.produce(topic, value=b"zombie")
        producer.commit_transaction(KAFKA_TIMEOUT)
    assert _consume_all(bootstrap, topic, "read_committed") == ["before-restart", "after-restart"]
