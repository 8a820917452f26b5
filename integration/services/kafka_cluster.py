"""Kafka on the wire (a metadata request) and the KRaft cluster id kept across starts."""

from __future__ import annotations

import base64
import contextlib
import logging
import re
import socket
import struct
import uuid
from pathlib import Path
from typing import Any, Final

log = logging.getLogger("connectors.services")


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        buf += chunk
    return bytes(buf)


def _kafka_call(
    sock: socket.socket, api_key: int, api_version: int, corr: int, body: bytes
) -> bytes:
    client_id = b"eos-services"
    header = struct.pack(">hhih", api_key, api_version, corr, len(client_id)) + client_id
    message = header + body
    sock.sendall(struct.pack(">i", len(message)) + message)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    response = _recv_exact(sock, size)
    (got,) = struct.unpack_from(">i", response, 0)
    if got != corr:
        raise ConnectionError(f"correlation id {got} != {corr}")
    return response[4:]


def kafka_metadata_ok(host: str, port: int, timeout: float = 3.0) -> bool:
    """True when the broker answers ApiVersions and a Metadata request listing itself.

    Raw Kafka protocol (no client library): a broker that only accepts TCP
    connections, or that is not yet registered/unfenced, gives False.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            body = _kafka_call(sock, 18, 0, 1, b"")  # ApiVersions v0
            (error,) = struct.unpack_from(">h", body, 0)
            if error != 0:
                return False
            (count,) = struct.unpack_from(">i", body, 2)
            versions: dict[int, tuple[int, int]] = {}
            for index in range(count):
                key, low, high = struct.unpack_from(">hhh", body, 6 + 6 * index)
                versions[key] = (low, high)
            if 3 not in versions:
                return False
            low, high = versions[3]
            version = max(low, 4)
            if version > min(high, 8):
                return True  # only flexible Metadata versions left: ApiVersions must do
            request = struct.pack(">ib", 0, 0)  # topics: [] (brokers only), no auto-create
            if version >= 8:
                request += struct.pack(">bb", 0, 0)
            body = _kafka_call(sock, 3, version, 2, request)
            (brokers,) = struct.unpack_from(">i", body, 4)  # after throttle_time_ms
            offset = 8
            ports = []
            for _ in range(brokers):
                _node, host_len = struct.unpack_from(">ih", body, offset)
                offset += 6 + host_len
                (broker_port,) = struct.unpack_from(">i", body, offset)
                ports.append(broker_port)
                offset += 4
                (rack_len,) = struct.unpack_from(">h", body, offset)
                offset += 2 + max(rack_len, 0)
            return len(ports) > 0
    except (OSError, ConnectionError, struct.error):
        return False


def _meta_cluster_id(data_dir: Path) -> str | None:
    """The cluster id of already formatted storage (so a lost state.json is harmless)."""
    with contextlib.suppress(OSError):
        for line in (data_dir / "meta.properties").read_text().splitlines():
            if line.startswith("cluster.id="):
                return line.split("=", 1)[1].strip()
    return None


#: A KRaft cluster id as ``kafka-storage random-uuid`` prints it: 16 random bytes in
#: URL-safe base64 without padding (22 characters), never beginning with ``-``.
_CLUSTER_ID: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{21}")


def _new_cluster_id() -> str:
    """A new KRaft cluster id that no command line can take for an option.

    One random UUID in 64 encodes to a string beginning with ``-``, which
    ``kafka-storage format --cluster-id <id>`` (argparse4j) reads as an option; Kafka's own
    ``Uuid.randomUuid()`` draws again in that case, and so does this.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if _CLUSTER_ID.fullmatch(cluster_id):
            return cluster_id


def _cluster_id_for_start(section: dict[str, Any], data_dir: Path) -> str:
    """The cluster id to format the storage with: the kept one (``state.json``, else the
    formatted storage's), or a new one kept in ``section``.

    A kept id beginning with ``-`` (made before ids were drawn again, it failed the format
    and so every later start of that checkout) is replaced while the storage is not yet
    formatted; formatted storage keeps its own id (the format reads no id then).
    """
    cluster_id = section.get("cluster_id") or _meta_cluster_id(data_dir)
    if isinstance(cluster_id, str) and _CLUSTER_ID.fullmatch(cluster_id):
        return cluster_id
    if isinstance(cluster_id, str) and (data_dir / "meta.properties").exists():
        return cluster_id
    if cluster_id:
        log.warning("replacing the kept Kafka cluster id %r (not a valid id to format with)",
                    cluster_id)
    cluster_id = _new_cluster_id()
    section["cluster_id"] = cluster_id
    return cluster_id
