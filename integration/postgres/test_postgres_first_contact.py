"""A sink's first connection to PostgreSQL meets a server that is restarting (issue 40;
found by the chaos soak): the TCP connection opens, the server answers the SSL request and
the handshake is cut short ("SSL error: unexpected eof while reading", what a server going
down in ``immediate`` mode does to a ``sslmode=prefer`` client). That names no setting, so
it must not end the batch as a TLS configuration error: PQping finds no server, the batch
waits (``outage_timeout``), and lands once the real server answers at that address.

The address is a listener of the test's: it cuts handshakes for a while, then the same
listener forwards to the real server. (It once closed and a proxy bound the port again: under
load the close raced the accepting thread, the bind failed in a thread nobody watched, and the
batch met "connection refused" until its outage bound.)"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from pyspark.sql import SparkSession

from connectors.postgres import PostgresSink
from integration.postgres.test_postgres_errors import ROWS, events, pg  # noqa: F401
from integration.support._pg import PgTarget
from integration.support._proxy import forward

pytestmark = [pytest.mark.integration]

CUT_FOR = 8.0


class HandshakeCutter:
    """Listens on a port; answers every SSL request and closes the connection, until
    :meth:`forward_to` is called: from then on the same listener forwards to the server."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.cut = 0
        self.upstream: tuple[str, int] | None = None
        self.open: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def forward_to(self, host: str, port: int) -> None:
        self.upstream = (host, port)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.upstream is not None:
                self.open += forward(conn, self.upstream)
                continue
            with contextlib.suppress(OSError):
                conn.recv(8)  # the SSLRequest
                conn.sendall(b"S")
                self.cut += 1
            conn.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self.sock.close()
        for conn in self.open:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


@pytest.fixture
def cutter() -> Iterator[HandshakeCutter]:
    c = HandshakeCutter()
    yield c
    c.close()


def test_a_first_connection_cut_in_its_tls_handshake_waits_for_the_server(
        spark: SparkSession, pg: PgTarget, cutter: HandshakeCutter) -> None:  # noqa: F811
    pg.create_table()
    params = psycopg.conninfo.conninfo_to_dict(pg.conninfo)
    via = psycopg.conninfo.make_conninfo("", **{**params, "host": "127.0.0.1",
                                                "port": str(cutter.port), "sslmode": "prefer"})

    def server_back() -> None:  # the real server answers at that address from now on
        time.sleep(CUT_FOR)
        cutter.forward_to(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))

    sink = PostgresSink(via, pg.table, sink_id=pg.sink_id, ledger_table=pg.ledger,
                        connect_timeout=5)
    back = threading.Thread(target=server_back, daemon=True)
    started = time.monotonic()
    back.start()
    try:
        sink(events(spark), 0)
        took = time.monotonic() - started
    finally:
        back.join()
        sink.close()
    assert cutter.cut >= 1, "no handshake was cut: the test proved nothing"
    assert took >= CUT_FOR, took
    assert sink.last_metrics is not None
    assert int(sink.last_metrics.extra.get("batch_restarts", 0)) >= 1
    pg.assert_exact(ROWS)
