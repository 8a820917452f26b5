"""A TCP proxy a test can cut and restore: a target that goes away and comes back for one
client, without restarting the shared service the other tests use."""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
import time


class Proxy:
    """Forwards ``127.0.0.1:<port>`` to ``host:port``; :meth:`cut` refuses connections and
    drops every open one, :meth:`restore` listens again on the same port."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.port = 0
        self._listener: socket.socket | None = None
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self.restore()

    def restore(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + 10
        while True:  # the cut listener's accepting thread may hold the port a moment longer
            try:
                listener.bind(("127.0.0.1", self.port))
                break
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                    listener.close()
                    raise
                time.sleep(0.05)
        listener.listen(16)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._open.clear()

    close = cut

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            pair = forward(client, self.upstream)
            with self._lock:
                self._open += pair


def forward(client: socket.socket, upstream: tuple[str, int]) -> list[socket.socket]:
    """Connect ``client`` to ``upstream`` and pump both ways (daemon threads): the two open
    sockets, or none (``client`` closed) when ``upstream`` does not answer."""
    try:
        server = socket.create_connection(upstream, timeout=10)
    except OSError:
        client.close()
        return []
    server.settimeout(None)
    for a, b in ((client, server), (server, client)):
        threading.Thread(target=_pump, args=(a, b), daemon=True).start()
    return [client, server]


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
