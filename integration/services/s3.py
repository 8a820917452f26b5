"""S3: moto's server mode with the test bucket; start, stop, restart and status."""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from integration.services.config import (
    HOST,
    S3_LOG_ROTATE_BYTES,
    SERVICES,
    S3Info,
    ServiceError,
    _s3_dir,
    service_timeout,
)
from integration.services.ports import stable_port
from integration.services.process import (
    _children,
    _load_state,
    _locked,
    _log_excerpt,
    _proc_alive,
    _refresh_env_file,
    _rotate,
    _save_state,
    _section,
    _terminate,
    _wait,
)

log = logging.getLogger("connectors.services")


# ------------------------------------------------------------------------------- S3


def s3_answers(host: str, port: int, timeout: float = 3.0) -> bool:
    """True when an S3 API answers ``GET /`` (ListBuckets) at ``http://host:port``.

    Plain HTTP, no signature: moto lists its buckets; a server that wants signed requests
    answers with an S3 ``<Error>`` document, which counts as answering too.
    """
    url = f"http://{host}:{port}/"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy
    try:
        with opener.open(url, timeout=timeout) as response:
            body = response.read(64 * 1024)
    except urllib.error.HTTPError as exc:
        body = exc.read(64 * 1024)
    except (OSError, ValueError):
        return False
    return b"<ListAllMyBucketsResult" in body or b"<Error>" in body


def _s3_pid() -> int | None:
    """The pid of this state directory's moto server (its working directory), else None."""
    sdir = _s3_dir()
    try:
        pid = int((sdir / "s3.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None
    if b"moto.server" not in cmdline or Path(cwd) != sdir:
        return None  # pid reused by something else
    return pid if _proc_alive(pid) else None


def _s3_bucket(info: S3Info) -> bool:
    """Create the test bucket unless it exists (boto3); True when it was created."""
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError as exc:
        raise ServiceError(
            f"boto3 is missing ({exc}); it comes with moto: run scripts/bootstrap, or "
            "`pip install 'moto[s3]' flask flask-cors` into the interpreter that runs "
            "scripts/services"
        ) from exc
    client = boto3.client(
        "s3",
        endpoint_url=info.endpoint,
        region_name=info.region,
        aws_access_key_id=info.access_key,
        aws_secret_access_key=info.secret_key,
        config=Config(retries={"max_attempts": 3}, connect_timeout=5, read_timeout=30),
    )
    try:
        names = {bucket["Name"] for bucket in client.list_buckets().get("Buckets", [])}
        if info.bucket in names:
            return False
        try:
            client.create_bucket(Bucket=info.bucket)
        except ClientError as exc:  # created meanwhile by another client
            if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
                raise
            return False
    except (BotoCoreError, ClientError) as exc:
        raise ServiceError(f"cannot create the S3 bucket {info.bucket!r}: {exc}") from exc
    return True


def start_s3(*, keep_ports: bool = False) -> S3Info:
    """Start (or re-verify) moto's S3 server and create the test bucket; returns its address.

    moto keeps everything in memory: after a stop or restart the bucket is created again,
    empty.
    """
    with _locked():
        sdir = _s3_dir()
        state = _load_state()
        section = _section(state, "s3")
        pid = _s3_pid()
        timeout = service_timeout()
        started = time.monotonic()
        logs_dir = sdir / "logs"
        out_file = logs_dir / "moto.log"
        if pid is not None:
            port = section.get("port")
            if not isinstance(port, int):
                raise ServiceError(
                    f"moto runs (pid {pid}) but its port is unknown; run `scripts/services stop`"
                )
            log.info("S3 (moto) already running (pid %d, port %d); verifying", pid, port)
            server_pid, new = pid, False
        else:
            if importlib.util.find_spec("moto") is None:
                raise ServiceError(
                    f"moto is not installed in {sys.executable}; run scripts/bootstrap (the "
                    "[dev] extra), or `pip install 'moto[s3]' flask flask-cors`"
                )
            logs_dir.mkdir(parents=True, exist_ok=True)
            others = {  # the other services' kept ports, even while they are stopped
                value
                for name in SERVICES
                if name != "s3" and isinstance(state.get(name), dict)
                for key, value in state[name].items()
                if key.endswith("port") and isinstance(value, int)
            }
            port = stable_port(section, "port", False, others, keep=keep_ports)
            _save_state(state)
            _rotate(out_file, S3_LOG_ROTATE_BYTES)
            log.info("starting S3 (moto, port %d, up to %.0fs)", port, timeout)
            with open(out_file, "ab") as out:
                child = subprocess.Popen(
                    [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=sdir,
                    start_new_session=True,
                )
            _children[child.pid] = child
            (sdir / "s3.pid").write_text(f"{child.pid}\n")
            server_pid, new = child.pid, True
        info = S3Info(HOST, port)
        try:
            _wait(
                "S3 (moto)",
                lambda: s3_answers(HOST, port),
                timeout=timeout,
                alive=lambda: _proc_alive(server_pid),
                interval=0.1,
            )
            created = _s3_bucket(info)
        except ServiceError as exc:
            if new:
                _terminate(server_pid, 10.0, name="moto")
                (sdir / "s3.pid").unlink(missing_ok=True)
            raise ServiceError(f"{exc}\n{_log_excerpt(out_file, 20)}") from exc
        log.info(
            "S3 (moto) ready in %.1fs: %s, bucket %s (%s)",
            time.monotonic() - started,
            info.endpoint,
            info.bucket,
            "created" if created else "kept",
        )
        _refresh_env_file()
        return info


def stop_s3(kill: bool = False, timeout: float = 30.0) -> bool:
    """Stop moto (SIGTERM, SIGKILL after ``timeout``); its objects and buckets are lost."""
    with _locked():
        pid = _s3_pid()
        if pid is None:
            (_s3_dir() / "s3.pid").unlink(missing_ok=True)
            return False
        log.info("stopping S3 (moto, pid %d, %s)", pid, "SIGKILL" if kill else "SIGTERM")
        started = time.monotonic()
        _terminate(pid, timeout, kill=kill, name="moto")
        (_s3_dir() / "s3.pid").unlink(missing_ok=True)
        log.info("S3 (moto) stopped in %.1fs", time.monotonic() - started)
        _refresh_env_file()
        return True


def restart_s3(kill: bool = False, downtime: float = 0.0) -> S3Info:
    """Stop moto, wait ``downtime`` s, start it again.

    The port (so the endpoint) and the bucket's name are kept; the objects are not (moto
    keeps them in memory): the bucket comes back empty.
    """
    with _locked():
        stop_s3(kill=kill)
        if downtime > 0:
            time.sleep(downtime)
        return start_s3(keep_ports=True)


def _s3_status() -> tuple[S3Info | None, int | None]:
    pid = _s3_pid()
    section = _load_state().get("s3", {})
    if pid is None or not isinstance(section.get("port"), int):
        return None, pid
    return S3Info(HOST, int(section["port"])), pid
