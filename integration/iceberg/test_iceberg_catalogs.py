"""IcebergSink on the catalogs users run, each proved by real kills: a JDBC catalog on the test
PostgreSQL, a Hadoop catalog on the S3 service (``s3a://``, the ledger as objects beside the
table) and a REST catalog (Iceberg's own REST catalog server, from Maven Central).

Each test runs ``examples/stream_to_iceberg.py`` as a driver (files source: one file per
micro-batch), SIGKILLs it right after batch 1's snapshot committed and before the ledger
recorded it (``after_decision``: the catalog's table holds the batch, the ledger only its
intent), and restarts it on the same checkpoint: the restart settles batch 1 from the
table's snapshots, read through that catalog, and writes it nowhere again. The table is then
read back WITHOUT Spark, by pyiceberg's own client of the catalog (``SqlCatalog`` on the same
PostgreSQL tables as Java's ``JdbcCatalog``; ``RestCatalog`` over HTTP) or from the newest
metadata object on S3 (``StaticTable``), and compared with the input row by row: nothing
missing, nothing twice, one tagged snapshot per batch, the ledger beside the table (found
from the location the catalog gives) with every batch and no intent left.

Secrets never reach a command line nor a log: the JDBC password (a role and database of the
test's own, the password random) goes to the driver as ``$ICEBERG_JDBC_PASSWORD`` and onto
the running session; the S3 keys as ``AWS_*`` variables. While the drivers run, every
process's command line on the machine is watched for them.
"""

from __future__ import annotations

import os
import secrets
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from connectors.sdk import CrashPoint
from examples.stream_to_files import make_input_files
from integration.iceberg._support import ledger_keys, rows_of, tags_of
from integration.support._delta import input_rows
from integration.support._driver import (
    REPO,
    SEED,
    DriverRun,
    KillJob,
    finished_batches,
    kill_at_each,
    kill_at_random,
    spark_batches,
)
from integration.support._standalone import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.iceberg]

SINK = "events-iceberg"
FILES, ROWS = 4, 100
#: Killed with batch 1 in the table and not in the ledger: the restart must settle it from
#: the table's snapshots, through the catalog.
PLAN = [(CrashPoint.AFTER_DECISION, SINK, 1)]


class CommandLineWatch:
    """The command lines (``/proc/<pid>/cmdline``) of the drivers this test starts and of
    everything they start, read every 0.2 s while open: did one hold any of ``secrets``? A
    JVM's arguments stand for its whole life. Only this process's descendants in sessions
    of their own count (``run_driver`` starts each driver in a new session): not another
    pytest worker's processes, nor the in-process test session's JVM, whose S3 confs are the
    test infrastructure's (``integration/conftest.py``), not the example's."""

    def __init__(self, *secrets_: str) -> None:
        self.secrets = [s.encode() for s in secrets_ if s]
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self.scans = 0

    @staticmethod
    def _drivers() -> list[Path]:
        """``/proc/<pid>`` of this process's descendants outside its own session."""
        parent: dict[int, int] = {}
        session: dict[int, int] = {}
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            parent[int(proc.name)], session[int(proc.name)] = int(fields[1]), int(fields[3])
        me, mine = os.getpid(), os.getsid(0)
        out = []
        for pid in parent:
            at, seen = pid, 0
            while at in parent and at != me and seen < 64:
                at, seen = parent[at], seen + 1
            if at == me and pid != me and session.get(pid) != mine:
                out.append(Path(f"/proc/{pid}"))
        return out

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            for proc in self._drivers():
                try:
                    line = (proc / "cmdline").read_bytes()
                except OSError:
                    continue
                if any(s in line for s in self.secrets):
                    self.seen.add(line.split(b"\0", 1)[0].decode(errors="replace"))
            self.scans += 1

    def __enter__(self) -> CommandLineWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


class CatalogJob(KillJob):
    """The example driver into catalog ``lake`` (``catalog_args``), ``env`` added to each
    run; ``table()`` loads the table with pyiceberg, without Spark."""

    module = "examples.stream_to_iceberg"

    def __init__(self, root: Path, warehouse: str, catalog_args: list[str],
                 table: Callable[[], Any], *, env: dict[str, str] | None = None,
                 files: int = FILES, ledger_options: dict[str, str] | None = None) -> None:
        super().__init__(root, sink_id=SINK, cwd=REPO)
        self.input = root / "in"
        self.warehouse = warehouse
        self.catalog_args = catalog_args
        self.table = table
        self.env = dict(env or {})
        self.batches = files
        self.total = make_input_files(self.input, files, ROWS)
        self.ledger_options = ledger_options
        self.runs: list[DriverRun] = []

    def args(self) -> list[str]:
        return ["--source", "files", "--input", str(self.input), "--checkpoint",
                str(self.checkpoint), "--warehouse", self.warehouse, "--sink-id", SINK,
                *self.catalog_args]

    def run(self, *extra: str, **kwargs: Any) -> DriverRun:
        kwargs["env"] = {**self.env, **kwargs.get("env", {})}
        run = super().run(*extra, **kwargs)
        self.runs.append(run)
        return run

    def ledger(self, folder: str) -> list[int]:
        return ledger_keys(self.table().location(), SINK, folder, self.ledger_options)

    def after_kill(self, point: CrashPoint, sink: str, batch: int, run: DriverRun) -> None:
        """At ``after_decision`` of batch 1: the table has batches 0 and 1 once each, the
        ledger batch 0 and batch 1's intent."""
        assert (point, batch) == (CrashPoint.AFTER_DECISION, 1)
        assert tags_of(self.table(), SINK) == {0: 1, 1: 1}
        assert self.ledger("decisions") == [0]
        assert self.ledger("intents") == [1]

    def assert_exact(self) -> None:
        """Row by row, one tagged snapshot per batch, the ledger complete, no intent left,
        and the restart settled batch 1 from the table's snapshots."""
        table = self.table()
        want = input_rows(self.total)
        got = rows_of(table)
        assert len(got) == len(want), (len(got), len(want))
        assert got == want, "the table differs from the input row by row"
        # Spark's micro-batches, not the files: a kill can put two files in one batch.
        batches = finished_batches(self.checkpoint)
        assert 0 < batches <= self.batches, (batches, self.batches)
        assert tags_of(table, SINK) == dict.fromkeys(range(batches), 1)
        assert self.ledger("decisions") == list(range(batches))
        assert self.ledger("intents") == [], "intents of recorded batches are pruned"
        settled = [r for r in self.runs if "batch 1: the table's snapshots say committed"
                   in r.output]
        assert settled, "the restart settled batch 1 from the table's snapshots"

    def assert_secret_kept(self, watch: CommandLineWatch, *secret: str) -> None:
        assert watch.scans > 0
        assert not watch.seen, f"a command line held a secret: {watch.seen}"
        for run in self.runs:
            assert not any(s in run.output for s in secret), "a driver's output held a secret"


# ---------------------------------------------------------------- JDBC catalog, PostgreSQL


@dataclass(frozen=True)
class PgCatalog:
    """A database and role of the test's own on the test PostgreSQL, for a JDBC catalog."""

    host: str
    port: int
    database: str
    user: str
    password: str

    @property
    def jdbc_uri(self) -> str:
        return f"jdbc:postgresql://{self.host}:{self.port}/{self.database}"

    @property
    def sqlalchemy_uri(self) -> str:  # pyiceberg's SqlCatalog, through psycopg 3
        return (f"postgresql+psycopg://{quote(self.user)}:{quote(self.password, safe='')}"
                f"@{self.host}:{self.port}/{self.database}")

    def conninfo(self) -> str:
        return (f"host={self.host} port={self.port} dbname={self.database} user={self.user} "
                f"password={self.password}")


@pytest.fixture
def pg_catalog(postgres_conninfo: str) -> Iterator[PgCatalog]:
    """A role with a random password and a database it owns, on the test PostgreSQL (the
    host and port of ``$EOS_POSTGRES_CONNINFO``); dropped after the test. The catalog's
    tables (Java's ``iceberg_tables``, ``iceberg_namespace_properties``) are its alone."""
    import psycopg
    from psycopg import sql

    params = psycopg.conninfo.conninfo_to_dict(postgres_conninfo)
    name = f"iceberg_cat_{uuid.uuid4().hex[:10]}"
    pg = PgCatalog(str(params.get("host") or "localhost"), int(params.get("port") or 5432),
                   name, name, secrets.token_urlsafe(18))
    with psycopg.connect(postgres_conninfo, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(name), sql.Literal(pg.password)))
        admin.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
            sql.Identifier(name), sql.Identifier(name)))
    try:
        yield pg
    finally:
        with psycopg.connect(postgres_conninfo, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def test_jdbc_catalog_on_postgresql_killed_after_the_commit_then_exact(
        tmp_path: Path, pg_catalog: PgCatalog) -> None:
    """A JDBC catalog (Java's ``JdbcCatalog``, schema V1) in PostgreSQL, the data files in a
    local warehouse; read back by pyiceberg's ``SqlCatalog`` on the same tables."""
    import psycopg
    from pyiceberg.catalog.sql import SqlCatalog

    def table() -> Any:
        return SqlCatalog("lake", uri=pg_catalog.sqlalchemy_uri).load_table("db.events")

    job = CatalogJob(tmp_path, str(tmp_path / "wh"),
                     ["--jdbc-uri", pg_catalog.jdbc_uri, "--jdbc-user", pg_catalog.user],
                     table, env={"ICEBERG_JDBC_PASSWORD": pg_catalog.password})
    with CommandLineWatch(pg_catalog.password) as watch:
        kill_at_each(job, PLAN, after_kill=job.after_kill)
    job.assert_exact()
    assert "jars for postgres-jdbc: org.postgresql:postgresql:" in job.runs[0].output
    job.assert_secret_kept(watch, pg_catalog.password)
    # The catalog is the PostgreSQL rows Java's JdbcCatalog wrote: one table, its current
    # metadata the one pyiceberg read, under the local warehouse.
    with psycopg.connect(pg_catalog.conninfo()) as conn:
        rows = conn.execute("SELECT catalog_name, table_namespace, table_name, "
                            "metadata_location, iceberg_type FROM iceberg_tables").fetchall()
    assert len(rows) == 1 and rows[0][:3] == ("lake", "db", "events"), rows
    assert rows[0][3] == table().metadata_location
    assert rows[0][3].startswith(str(tmp_path / "wh")), rows[0][3]
    assert rows[0][4] == "TABLE", "schema V1: the row says what it is"


# ---------------------------------------------------------------- Hadoop catalog on S3


def _s3_table(warehouse: str, props: dict[str, str]) -> Any:
    """The table under an ``s3a://`` Hadoop warehouse, from its newest metadata object
    (``version-hint.text``), read with pyiceberg's own S3 client (pyarrow's)."""
    from pyiceberg.io import load_file_io
    from pyiceberg.table import StaticTable

    meta = f"{warehouse}/db/events/metadata"
    with load_file_io(props, meta).new_input(f"{meta}/version-hint.text").open() as f:
        version = int(f.read().decode().strip())
    return StaticTable.from_metadata(f"{meta}/v{version}.metadata.json", properties=props)


def test_hadoop_catalog_on_s3_killed_after_the_commit_then_at_random_then_exact(
        tmp_path: Path, s3_service: Any, request: pytest.FixtureRequest) -> None:
    """A Hadoop catalog on ``s3a://`` (the ledger beside the table as S3 objects, written
    with conditional writes): killed after batch 1's commit, then at a random moment, then
    exact, read back from the S3 objects by pyiceberg."""
    warehouse = f"{s3_service.prefix(request.node.name)}/wh"
    props = {"s3.endpoint": s3_service.endpoint, "s3.region": s3_service.region,
             "s3.access-key-id": s3_service.access_key,
             "s3.secret-access-key": s3_service.secret_key,
             "s3.force-virtual-addressing": "false"}
    # The endpoint and path style as s3a confs; the keys as AWS_* variables (S3A's default
    # credential chain, and the ledger's client): nothing secret on a command line.
    confs = [x for k, v in s3_service.hadoop_confs().items()
             if not k.endswith((".access.key", ".secret.key")) for x in ("--conf", f"{k}={v}")]
    env = {"AWS_ACCESS_KEY_ID": s3_service.access_key,
           "AWS_SECRET_ACCESS_KEY": s3_service.secret_key, "AWS_REGION": s3_service.region}
    job = CatalogJob(tmp_path, warehouse, confs, lambda: _s3_table(warehouse, props), env=env,
                     files=6, ledger_options=s3_service.storage_options())
    with CommandLineWatch(s3_service.secret_key) as watch:
        first = job.run(crash=f"after_decision:batch=1:sink={SINK}")
        assert first.returncode == -9, first.tail()
        assert job.reached(CrashPoint.AFTER_DECISION, 1), first.tail()
        job.after_kill(CrashPoint.AFTER_DECISION, SINK, 1, first)
        # The restart settles batch 1, then is killed a random moment after Spark committed
        # a batch (its commit log, a local file: cheap to poll), while it writes the next.
        kill_at_random(job, progress=lambda: len(spark_batches(job.checkpoint)[1]), runs=1,
                       max_delay=1.0, seed=SEED)
    assert job.runs[1].returncode == -9, "the random kill landed"
    job.assert_exact()
    job.assert_secret_kept(watch, s3_service.secret_key)
    assert job.table().location().startswith("s3a://"), job.table().location()


# ---------------------------------------------------------------- REST catalog


@pytest.fixture
def rest_catalog(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """Iceberg's REST catalog server (``integration/iceberg/_rest.py``) on a free port:
    its URI and its warehouse directory. Its jars come from Maven Central; without Maven
    or Java the test fails under ``CI=true`` and skips elsewhere."""
    from integration.iceberg._rest import rest_catalog_server, rest_jars

    try:
        rest_jars()
    except (RuntimeError, OSError) as exc:
        if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
            pytest.fail(f"no REST catalog server: {exc}", pytrace=False)
        pytest.skip(f"no REST catalog server: {exc}")
    root = tmp_path / "rest"
    with rest_catalog_server(root, free_port()) as uri:
        yield uri, root / "warehouse"


def test_rest_catalog_killed_after_the_commit_then_exact(
        tmp_path: Path, rest_catalog: tuple[str, Path]) -> None:
    """A REST catalog (Iceberg's ``RESTCatalogServer``, its catalog in SQLite, the tables in
    its warehouse); Spark's REST client writes, pyiceberg's ``RestCatalog`` reads back."""
    from pyiceberg.catalog.rest import RestCatalog

    uri, server_warehouse = rest_catalog

    def table() -> Any:
        return RestCatalog("lake", uri=uri).load_table("db.events")

    job = CatalogJob(tmp_path / "job", str(server_warehouse), ["--rest-uri", uri], table)
    kill_at_each(job, PLAN, after_kill=job.after_kill)
    job.assert_exact()
    assert table().location().startswith(str(server_warehouse)), table().location()
