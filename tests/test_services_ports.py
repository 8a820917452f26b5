"""A restarted test service keeps its ports (integration/services/ports.py, process.py).
No service runs here: a small Python process stands in for the broker's JVM.

The cause of the broker moving to a new port after ``restart --kill``: a SIGKILLed JVM's
thread-group leader shows ``Z`` at once, while its last thread still tears the process
down and holds the listening socket for a few dozen ms. ``_proc_alive`` took the leader's
``Z`` for "gone", and the start that followed found the port still bound.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.services import ports, process
from integration.services.config import ServiceError

#: Listens on a port, keeps it in a second thread, and ends its main thread (the leader
#: becomes a zombie, the process and its socket live on), as a dying JVM looks.
LEADER_EXITS_FIRST = """
import ctypes, socket, sys, threading, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0))
s.listen()
threading.Thread(target=time.sleep, args=(3600,)).start()
print(s.getsockname()[1], flush=True)
ctypes.CDLL(None).pthread_exit(None)
"""


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]


@pytest.fixture
def zombie_leader() -> Iterator[tuple[int, int]]:
    """``(pid, port)`` of a process whose leader is a zombie while a thread holds the port."""
    proc = subprocess.Popen([sys.executable, "-c", LEADER_EXITS_FIRST],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        while _state(proc.pid) != "Z":
            time.sleep(0.01)
        yield proc.pid, port
    finally:
        proc.kill()
        proc.wait()


def test_a_zombie_leader_with_a_live_thread_is_alive(zombie_leader: tuple[int, int]) -> None:
    pid, port = zombie_leader
    assert _state(pid) == "Z"
    assert not process._port_free(port)  # the process still holds the socket
    assert process._proc_alive(pid)  # so it is not gone yet (was: False)


def test_a_killed_process_is_gone_and_its_port_free(zombie_leader: tuple[int, int]) -> None:
    pid, port = zombie_leader
    subprocess.run(["kill", "-9", str(pid)], check=True)
    while process._proc_alive(pid):
        time.sleep(0.01)
    assert process._port_free(port)


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_the_stored_port_is_waited_for(caplog: pytest.LogCaptureFixture) -> None:
    sock = _listener()
    port = int(sock.getsockname()[1])
    threading.Timer(0.5, sock.close).start()
    section = {"port": port}
    with caplog.at_level(logging.INFO, logger=ports.log.name):
        assert ports.stable_port(section, "port", False, set(), keep=True) == port
    assert section == {"port": port}
    assert f"port {port} (port) is still taken" in caplog.text
    assert "waiting up to 60s for its release" in caplog.text


def test_a_restart_fails_rather_than_move(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EOS_SERVICES_PORT_WAIT", "0.3")
    with _listener() as sock:
        port = int(sock.getsockname()[1])
        section = {"port": port}
        with pytest.raises(ServiceError) as caught:
            ports.stable_port(section, "port", False, set(), keep=True)
    message = str(caught.value)
    assert f"port {port} (port) is still taken after 0s" in message
    assert "python" in message  # the holder, by name: this test's own process
    assert section == {"port": port}


def test_a_start_moves_with_a_warning(monkeypatch: pytest.MonkeyPatch,
                                      caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("EOS_SERVICES_PORT_WAIT", "0.3")
    with _listener() as sock, caplog.at_level(logging.WARNING, logger=ports.log.name):
        port = int(sock.getsockname()[1])
        section = {"port": port}
        moved = ports.stable_port(section, "port", False, set())
    assert moved != port
    assert section == {"port": moved}
    assert f"port {port} (port) is taken by pid" in caplog.text
