"""``connectors status --watch`` against real services, read as an operator reads it.

PostgreSQL: the watch runs in a pseudo-terminal and its screen is read back; a driver
SIGKILLed before its decision leaves prepared transactions: the lingering count rises in
the table and in an HTTP scrape of ``--prometheus-port``, and after ``connectors recover``
both fall to 0. The watch reaches PostgreSQL through a TCP proxy the test cuts and
restores (the shared server is never restarted): the row shows the error, the watch goes
on, the row recovers. Ctrl-C ends it with exit 0 and the cursor shown again.

Kafka and Delta: one ``--watch --json`` lists a Kafka sink (its ledger and marker topics,
an open transaction in the marker topic counted as lingering, then aborted) and a Delta
sink (a delta-rs table with the sink's file ledger beside it), one JSON document per line.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import termios
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from connectors.cli._gauges import LAG, LINGERING, TARGET_UP
from connectors.cli._watch_loop import CLEAR_HOME, SHOW_CURSOR
from connectors.sdk import CrashPoint
from integration.cli.test_cli_postgres import leaks
from integration.postgres.test_postgres_kill import CRASH_BATCH, PgJob
from integration.support._driver import REPO, run_cli
from integration.support._pg import DRIVER_PGOPTIONS, PgTarget
from integration.support._proxy import Proxy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WAIT = 120.0  # seconds a screen may take to show what the test waits for (not asserted)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CONNECTORS_CRASH_AT"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def _take_terminal() -> None:
    """In the child, after setsid: make the pseudo-terminal its controlling terminal, so
    Ctrl-C typed into it is a SIGINT to the watch."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """``python -m connectors ARGS`` in a pseudo-terminal; what it drew, read back."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        master, slave = os.openpty()
        self.master = master
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "connectors", *args], cwd=REPO, env=env, stdin=slave,
            stdout=slave, stderr=slave, start_new_session=True, preexec_fn=_take_terminal)
        os.close(slave)
        self.output = ""
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: the child closed the terminal
                return
            if not data:
                return
            with self._lock:
                self.output += data.decode(errors="replace").replace("\r", "")

    def screens(self) -> list[str]:
        """Every complete screen drawn so far (the text between two clear-and-home)."""
        with self._lock:
            return self.output.split(CLEAR_HOME)[1:-1]

    def wait_for(self, what: str, predicate: Callable[[str], bool]) -> str:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            for screen in reversed(self.screens()[-3:]):
                if predicate(screen):
                    return screen
            time.sleep(0.2)
        last = (self.screens() or [self.output])[-1]
        raise AssertionError(f"the watch never showed {what}; last screen:\n{last}")

    def ctrl_c(self) -> int:
        os.write(self.master, b"\x03")
        return self.proc.wait(60)

    def wait_for_end(self) -> None:
        """Until the reader has everything the ended process wrote."""
        self._reader.join(30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        os.close(self.master)


def row(screen: str, kind: str, sink_id: str) -> dict[str, str] | None:
    """The table's row of a sink: column -> cell (``error`` the rest of the line)."""
    names = ["target", "sink", "last committed", "lag", "unfinished", "lingering", "oldest s"]
    for line in screen.splitlines():
        cells = line.split(None, len(names))
        if cells[:2] == [kind, sink_id] and len(cells) == len(names) + 1:
            return {**dict(zip(names, cells, strict=False)), "error": cells[-1]}
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def gauge(text: str, name: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_gauge(port: int, name: str, value: float, **labels: str) -> None:
    deadline = time.monotonic() + WAIT
    seen = None
    while time.monotonic() < deadline:
        seen = gauge(scrape(port), name, **labels)
        if seen == value:
            return
        time.sleep(0.3)
    raise AssertionError(f"{name}{labels} stayed {seen}, never {value}")


@pytest.fixture
def pg(postgres_conninfo: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[PgTarget]:
    monkeypatch.setenv("EOS_POSTGRES_CONNINFO", postgres_conninfo)  # the driver reads it
    monkeypatch.setenv("PGOPTIONS", DRIVER_PGOPTIONS)
    target = PgTarget(postgres_conninfo, prefix="watch")
    target.create_table()
    yield target
    target.cleanup()


def test_watch_in_a_terminal_shows_lingering_rise_and_fall_and_rides_out_an_outage(
    tmp_path: Path, pg: PgTarget
) -> None:
    params = psycopg.conninfo.conninfo_to_dict(pg.conninfo)
    proxy = Proxy(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
    via_proxy = psycopg.conninfo.make_conninfo(pg.conninfo, host="127.0.0.1",
                                               port=str(proxy.port))
    job = PgJob(tmp_path, pg)
    port = free_port()
    sid, labels = pg.sink_id, {"sink_id": pg.sink_id, "target": "postgres"}
    term = Terminal(["status", "--watch", "--interval", "1", "--postgres-env", "WATCH_PG",
                     "--ledger-table", pg.ledger, "--sink-id", sid, "--checkpoint",
                     str(job.checkpoint), "--prometheus-port", str(port)],
                    _env(WATCH_PG=via_proxy))
    try:
        # ---- the sink is in the table before anything ran: nothing committed, nothing left
        term.wait_for("the sink", lambda s: (r := row(s, "postgres", sid)) is not None
                      and r["lingering"] == "0" and r["error"] == "-")
        wait_gauge(port, LINGERING, 0, **labels)

        # ---- a driver SIGKILLed before its decision leaves prepared transactions
        run = job.run(crash=f"{CrashPoint.BEFORE_DECISION.value}:batch={CRASH_BATCH}")
        assert run.returncode == -9, run.tail()
        left = len(pg.prepared())
        assert left > 0
        screen = term.wait_for(f"{left} lingering", lambda s: (r := row(
            s, "postgres", sid)) is not None and r["lingering"] == str(left))
        r = row(screen, "postgres", sid)
        assert r is not None and r["last committed"] == str(CRASH_BATCH - 1)
        assert r["lag"] == "1"  # Spark planned CRASH_BATCH, the sink committed up to -1
        assert r["oldest s"] != "-" and float(r["oldest s"]) >= 0
        wait_gauge(port, LINGERING, left, **labels)
        assert gauge(scrape(port), LAG, **labels) == 1

        # ---- PostgreSQL unreachable for the watch: the row says so, the watch goes on
        proxy.cut()
        screen = term.wait_for("the error", lambda s: (r := row(
            s, "postgres", sid)) is not None and r["error"] != "-")
        wait_gauge(port, TARGET_UP, 0, target="postgres")
        assert term.proc.poll() is None
        proxy.restore()
        term.wait_for("the row back", lambda s: (r := row(s, "postgres", sid)) is not None
                      and r["error"] == "-" and r["lingering"] == str(left))
        wait_gauge(port, TARGET_UP, 1, target="postgres")

        # ---- recover rolls them back: 0 in the table and in the scrape
        code, data, err = run_cli("recover", "--postgres", pg.conninfo, "--ledger-table",
                                  pg.ledger, "--sink-id", sid, "--abort-undecided",
                                  "--min-age", "0")
        assert code == 0, (data, err)
        term.wait_for("0 lingering", lambda s: (r := row(s, "postgres", sid)) is not None
                      and r["lingering"] == "0" and r["oldest s"] == "-")
        wait_gauge(port, LINGERING, 0, **labels)

        # ---- Ctrl-C: exit 0, the cursor shown again; no password on a screen or a gauge
        assert not leaks(pg.conninfo, scrape(port))
        assert term.ctrl_c() == 0
        term.wait_for_end()
        assert term.output.rstrip("\n").endswith(SHOW_CURSOR)
        assert "Traceback" not in term.output
        assert not leaks(pg.conninfo, term.output)
    finally:
        term.close()
        proxy.close()



# --------------------------------------------------------------------- Kafka and Delta


def delta_sink(root: Path, sink_id: str, batches: int) -> Path:
    """A Delta table with ``batches`` commits tagged as the sink's, recorded in the sink's
    file ledger beside it (``<table>/_connectors/<sink_id>``), as DeltaSink leaves them."""
    deltalake = pytest.importorskip("deltalake")
    import pyarrow as pa

    from connectors.core.ledgers.file_ledger import FileLedger
    from connectors.core.ledgers.ledger import LedgerEntry
    from connectors.core.states import BatchState
    from connectors.delta import CommitTag

    table = root / "events"
    for b in range(batches):
        tag = CommitTag(sink_id, sink_id, b, "q-watch", "r1")
        deltalake.write_deltalake(str(table), pa.table({"id": [b]}), mode="append",
                                  commit_properties=deltalake.CommitProperties(
                                      custom_metadata={"userMetadata": tag.to_json()}))
    ledger = FileLedger(table / "_connectors" / sink_id, sink_id=sink_id)
    ledger.bind_query("q-watch")
    for b in range(batches):
        ledger.decide(LedgerEntry(sink_id, b, "r1", BatchState.DECIDED))
        ledger.mark_committed(b)
    ledger.close()
    return table


class JsonLines:
    """``connectors status --watch --json`` as a script reads it: line by line."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "connectors", "status", "--watch", "--json", *args],
            cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True)
        self.docs: list[dict[str, Any]] = []

    def next_until(self, what: str, predicate: Callable[[dict[str, Any]], bool]) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()  # flushed per refresh: no waiting for more
            if not line:
                break
            self.docs.append(json.loads(line))
            if predicate(self.docs[-1]):
                return
        raise AssertionError(f"no line showed {what}; last: {self.docs[-1:]}")


def by_target(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["target"]: s for s in doc["sinks"]}


def test_watch_json_lists_kafka_and_delta_sinks_and_a_kafka_open_transaction(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    from confluent_kafka import Producer

    from integration.support._kafka import KafkaTarget

    kafka = KafkaTarget(kafka_bootstrap, prefix="watch")
    sid = kafka.sink_id  # the same sink id in both targets: one --sink-id for the watch
    kafka.create(kafka.ledger_topic, partitions=1, config={"cleanup.policy": "compact"})
    kafka.create(kafka.marker_topic, partitions=1)
    table = delta_sink(tmp_path, sid, batches=3)
    producer = Producer({"bootstrap.servers": kafka_bootstrap,
                         "transactional.id": f"watch-test-{sid}"})
    watch = JsonLines(["--interval", "1", "--kafka", kafka_bootstrap, "--delta", str(table),
                       "--sink-id", sid])
    try:
        watch.next_until("both sinks", lambda d: set(by_target(d)) == {"kafka", "delta"}
                         and all(s["error"] is None for s in d["sinks"]))
        doc = by_target(watch.docs[-1])
        assert doc["delta"]["sink_id"] == sid and doc["delta"]["last_committed"] == 2
        assert doc["delta"]["query_id"] == "q-watch" and doc["delta"]["lingering"] == 0
        assert doc["kafka"]["sink_id"] == sid and doc["kafka"]["lingering"] == 0

        # an open transaction in the sink's marker topic: lingering where status says so
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(kafka.marker_topic, b"open")
        producer.flush(30)
        watch.next_until("the open transaction",
                         lambda d: by_target(d)["kafka"]["lingering"] == 1)
        producer.abort_transaction(30)
        watch.next_until("it aborted", lambda d: by_target(d)["kafka"]["lingering"] == 0)
        assert len(watch.docs) >= 3
        assert all(isinstance(d["time"], float) for d in watch.docs)
        watch.proc.send_signal(signal.SIGINT)
        assert watch.proc.wait(60) == 0
    finally:
        if watch.proc.poll() is None:
            watch.proc.kill()
            watch.proc.wait(30)
        kafka.cleanup()
