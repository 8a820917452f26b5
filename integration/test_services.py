"""The test services really provide what the exactly-once sinks rely on.

PostgreSQL: two-phase commit (prepared transactions that another connection finishes,
that stay invisible until committed and survive a crash). Kafka: transactions with
read_committed isolation, enforced by the broker, and a last stable offset that trails
the high watermark while a transaction is open. S3 (moto), through obstore as the Delta
ledger uses it: create-only puts, puts conditional on the current ETag, a list that sees
a write at once, multipart uploads; and a restart keeps the endpoint and the bucket.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import obstore
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
from obstore.exceptions import AlreadyExistsError, PreconditionError
from obstore.store import S3Store
from psycopg import sql

from integration import services as _services
from integration.services import process as _process
from integration.services.instance import ServiceInstance
from integration.support._fixtures_services import NativeKafka, NativePostgres, NativeS3, S3Service

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

KAFKA_TIMEOUT = 30.0


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


# =========================================================================== PostgreSQL


def _table(conninfo: str) -> Iterator[str]:
    """A fresh table; afterwards leftover prepared transactions on it are rolled back."""
    table = _unique("svc_tpc")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text NOT NULL)").format(
                sql.Identifier(table)
            )
        )
    yield table
    with psycopg.connect(conninfo, autocommit=True) as conn:
        # A forgotten prepared transaction would hold its locks (and block DROP) forever.
        for xid in conn.tpc_recover():
            if table in xid.gtrid:
                conn.tpc_rollback(xid)
        conn.execute("SET lock_timeout = '10s'")
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


@pytest.fixture
def pg_table(postgres_conninfo: str) -> Iterator[str]:
    """A fresh table on the shared PostgreSQL."""
    yield from _table(postgres_conninfo)


@pytest.fixture
def own_pg_table(native_postgres: NativePostgres) -> Iterator[str]:
    """A fresh table on the module's own PostgreSQL (the one the tests restart)."""
    yield from _table(native_postgres.conninfo)


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
    native_postgres: NativePostgres, own_pg_table: str
) -> None:
    conninfo, pg_table = native_postgres.conninfo, own_pg_table
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


#: SIGKILL / immediate restarts per service in the address tests below: the move they
#: guard against (a port that still looked taken) was a race, so one restart proves little.
ADDRESS_RESTARTS = 3


def _kept_ports(instance: ServiceInstance, service: str) -> dict[str, int]:
    with instance.active():
        section = _process._load_state()[service]
    return {key: value for key, value in section.items() if key.endswith("port")}


@pytest.mark.timeout(600)
def test_postgres_immediate_restarts_keep_the_address(
    native_postgres: NativePostgres, own_pg_table: str
) -> None:
    """``scripts/services restart --only postgres --mode immediate``, several times: the
    port stays, and a client with the conninfo from before connects and writes."""
    conninfo, pg_table, instance = (native_postgres.conninfo, own_pg_table,
                                    native_postgres.instance)
    ports = _kept_ports(instance, "postgres")
    for attempt in range(ADDRESS_RESTARTS):
        restarted = _services_cli(instance, "restart", "--only", "postgres", "--mode",
                                  "immediate")
        assert restarted.returncode == 0, restarted.stdout + restarted.stderr
        assert "choosing a new one" not in restarted.stderr
        assert _kept_ports(instance, "postgres") == ports
        current = instance.status().postgres
        assert current is not None and current.conninfo == conninfo
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, 'after a restart')").format(
                sql.Identifier(pg_table)), (attempt,))
    assert _count(conninfo, pg_table) == ADDRESS_RESTARTS


# ================================================================================ Kafka


@pytest.fixture
def admin(kafka_bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_bootstrap})


def _topic(admin: AdminClient) -> Iterator[str]:
    name = _unique("svc-topic")
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=1, replication_factor=1)], request_timeout=KAFKA_TIMEOUT
    )
    futures[name].result(timeout=KAFKA_TIMEOUT)
    yield name
    admin.delete_topics([name], request_timeout=KAFKA_TIMEOUT)[name].result(timeout=KAFKA_TIMEOUT)


@pytest.fixture
def topic(admin: AdminClient) -> Iterator[str]:
    """A fresh topic on the shared broker."""
    yield from _topic(admin)


@pytest.fixture
def own_admin(native_kafka: NativeKafka) -> AdminClient:
    """An admin client of the module's own broker (the one the tests restart)."""
    return AdminClient({"bootstrap.servers": native_kafka.bootstrap})


@pytest.fixture
def own_topic(own_admin: AdminClient) -> Iterator[str]:
    """A fresh topic on the module's own broker."""
    yield from _topic(own_admin)


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
    native_kafka: NativeKafka, own_admin: AdminClient, own_topic: str
) -> None:
    bootstrap, admin, topic = native_kafka.bootstrap, own_admin, own_topic
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


@pytest.mark.timeout(600)
def test_kafka_sigkill_restarts_keep_the_address(
    native_kafka: NativeKafka, own_topic: str
) -> None:
    """``scripts/services restart --only kafka --kill``, several times (the broker was
    not started by the restarting process, as from the command line): every port stays,
    and a producer made before the first restart, with the old bootstrap address, goes
    on producing; a consumer with that address reads it all."""
    bootstrap, topic, instance = native_kafka.bootstrap, own_topic, native_kafka.instance
    ports = _kept_ports(instance, "kafka")
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True})
    sent = ["before the restarts"]
    _produce(producer, topic, sent)
    for attempt in range(ADDRESS_RESTARTS):
        restarted = _services_cli(instance, "restart", "--only", "kafka", "--kill")
        assert restarted.returncode == 0, restarted.stdout + restarted.stderr
        assert "choosing a new one" not in restarted.stderr
        assert _kept_ports(instance, "kafka") == ports
        current = instance.status().kafka
        assert current is not None and current.bootstrap == bootstrap
        sent.append(f"after restart {attempt}")
        _produce(producer, topic, sent[-1:])
    assert _consume_all(bootstrap, topic, "read_committed") == sent


# =================================================================================== S3


def _s3_store(service: S3Service) -> S3Store:
    return S3Store(
        service.bucket,
        endpoint=service.endpoint,
        access_key_id=service.access_key,
        secret_access_key=service.secret_key,
        region=service.region,
        client_options={"allow_http": True},
        virtual_hosted_style_request=False,
    )


@pytest.fixture
def s3_store(s3_service: S3Service) -> S3Store:
    return _s3_store(s3_service)


@pytest.fixture
def s3_prefix(s3_service: S3Service, request: pytest.FixtureRequest) -> str:
    """This test's own key prefix in the bucket (the path part of ``s3_service.prefix``)."""
    url = s3_service.prefix(request.node.name)
    assert url.startswith(f"s3a://{s3_service.bucket}/{request.node.name[:20]}")
    return url.removeprefix(f"s3a://{s3_service.bucket}/")


def _s3_read(store: S3Store, key: str) -> bytes:
    return bytes(obstore.get(store, key).bytes())


def test_s3_put_create_succeeds_once(s3_store: S3Store, s3_prefix: str) -> None:
    key = f"{s3_prefix}/_ledger/00000000000000000001.json"
    first = obstore.put(s3_store, key, b"first writer", mode="create")
    assert first["e_tag"]
    with pytest.raises(AlreadyExistsError):
        obstore.put(s3_store, key, b"second writer", mode="create")
    assert _s3_read(s3_store, key) == b"first writer"


def test_s3_put_conditional_on_the_current_etag(s3_store: S3Store, s3_prefix: str) -> None:
    key = f"{s3_prefix}/_ledger/state.json"
    stale = obstore.put(s3_store, key, b"v1", mode="create")["e_tag"]
    assert stale is not None
    current = obstore.put(s3_store, key, b"v2", mode={"e_tag": stale})["e_tag"]
    assert current is not None
    assert current != stale
    with pytest.raises(PreconditionError):
        obstore.put(s3_store, key, b"lost update", mode={"e_tag": stale})
    assert _s3_read(s3_store, key) == b"v2"
    obstore.put(s3_store, key, b"v3", mode={"e_tag": current})
    assert _s3_read(s3_store, key) == b"v3"


def test_s3_list_right_after_a_write_sees_it(s3_store: S3Store, s3_prefix: str) -> None:
    written: list[str] = []
    for index in range(5):
        key = f"{s3_prefix}/_delta_log/{index:020d}.json"
        obstore.put(s3_store, key, f"commit {index}".encode(), mode="create")
        written.append(key)
        listed = sorted(m["path"] for m in obstore.list(s3_store, prefix=s3_prefix).collect())
        assert listed == written


def test_s3_multipart_upload_reads_back_whole(s3_store: S3Store, s3_prefix: str) -> None:
    data = random.Random(42).randbytes(12 * 1024 * 1024)
    key = f"{s3_prefix}/part-00000.parquet"
    result = obstore.put(
        s3_store, key, data, use_multipart=True, chunk_size=5 * 1024 * 1024
    )
    # An S3 multipart ETag is "<md5 of the parts' md5s>-<parts>": 5 + 5 + 2 MiB.
    assert str(result["e_tag"]).strip('"').endswith("-3"), result
    assert obstore.head(s3_store, key)["size"] == len(data)
    assert _s3_read(s3_store, key) == data


def test_s3_settings_for_spark_and_delta_rs(s3_service: S3Service) -> None:
    confs = s3_service.hadoop_confs()
    assert confs == {
        "spark.hadoop.fs.s3a.endpoint": s3_service.endpoint,
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.access.key": s3_service.access_key,
        "spark.hadoop.fs.s3a.secret.key": s3_service.secret_key,
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
    }
    options = s3_service.storage_options()
    assert options["AWS_ENDPOINT_URL"] == s3_service.endpoint
    assert options["AWS_ALLOW_HTTP"] == "true"
    assert options["AWS_S3_ALLOW_UNSAFE_RENAME"] == "true"
    assert options["AWS_REGION"] == "us-east-1"
    first, second = s3_service.prefix("test_x[a/b c]"), s3_service.prefix("test_x[a/b c]")
    assert first != second
    assert first.startswith(f"s3a://{s3_service.bucket}/test_x-a-b-c-")


def test_s3_storage_options_reach_delta_rs(s3_service: S3Service, s3_prefix: str) -> None:
    deltalake = pytest.importorskip("deltalake")
    pyarrow = pytest.importorskip("pyarrow")
    uri = f"s3://{s3_service.bucket}/{s3_prefix}/table"
    options = s3_service.storage_options()
    deltalake.write_deltalake(uri, pyarrow.table({"id": [1, 2]}), storage_options=options)
    deltalake.write_deltalake(
        uri, pyarrow.table({"id": [3]}), mode="append", storage_options=options
    )
    table = deltalake.DeltaTable(uri, storage_options=options)
    assert table.version() == 1
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == [1, 2, 3]


def _services_cli(instance: ServiceInstance, *args: str) -> subprocess.CompletedProcess[str]:
    """``scripts/services ARGS`` (its Python module) acting on ``instance``."""
    return subprocess.run(
        [sys.executable, "-m", "integration.services", *args],
        cwd=_services.REPO_ROOT,
        env=instance.environ(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_s3_restart_only_s3_brings_it_back_with_the_bucket(
    native_s3: NativeS3, native_postgres: NativePostgres, native_kafka: NativeKafka
) -> None:
    """(The module's own PostgreSQL and Kafka run too: the restart must leave them be.)"""
    service, instance = native_s3.service, native_s3.instance
    store = _s3_store(service)
    key = f"restart-{uuid.uuid4().hex}/object"
    obstore.put(store, key, b"before the restart", mode="create")
    before = instance.status()
    assert before.s3 is not None
    assert before.s3.endpoint == service.endpoint
    kafka_pid, postgres = before.kafka_pid, before.postgres
    assert kafka_pid is not None and postgres is not None

    restarted = _services_cli(instance, "restart", "--only", "s3")
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert "s3:       running" in restarted.stdout
    assert _services_cli(instance, "status", "--only", "s3").returncode == 0

    after = instance.status()
    assert after.s3 == before.s3  # same endpoint (kept port) and bucket
    assert after.s3_pid is not None
    assert after.s3_pid != before.s3_pid  # a new moto process
    assert (after.kafka_pid, after.postgres) == (kafka_pid, postgres)  # the others untouched
    with instance.active():
        env = _services.read_env_file()
    assert env[_services.ENV_S3_ENDPOINT] == service.endpoint
    assert env[_services.ENV_S3_BUCKET] == service.bucket
    # moto keeps objects in memory: the bucket is back, empty, and usable at once.
    assert obstore.list(store, prefix=key).collect() == []
    obstore.put(store, key, b"after the restart", mode="create")
    assert _s3_read(store, key) == b"after the restart"
