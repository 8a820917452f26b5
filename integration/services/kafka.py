"""Kafka: one KRaft node (broker + controller), start, stop, restart and status."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import time
from pathlib import Path

from integration.services import secured as _secured
from integration.services.config import (
    HOST,
    KafkaInfo,
    ServiceError,
    _kafka_dir,
    kafka_version,
    service_timeout,
    tls_files,
)
from integration.services.kafka_cluster import _cluster_id_for_start, kafka_metadata_ok
from integration.services.kafka_jars import _java, kafka_libs
from integration.services.ports import stable_port
from integration.services.process import (
    _children,
    _load_state,
    _locked,
    _log_excerpt,
    _proc_alive,
    _refresh_env_file,
    _run,
    _save_state,
    _section,
    _terminate,
    _wait,
)

log = logging.getLogger("connectors.services")


def _kafka_server_properties(kdir: Path, port: int, controller_port: int,
                             sasl_port: int) -> str:
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(kdir / "data"),
        "num.partitions": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "transaction.max.timeout.ms": "900000",
        "group.initial.rebalance.delay.ms": "0",
        # Topics with a size limit (the benchmarks' output topics) are trimmed every 10 s,
        # not every 5 minutes: one benchmark run writes tens of GB at 1 KB per record.
        "log.retention.check.interval.ms": "10000",
        # Tests create their topics explicitly (AdminClient); typos fail loudly.
        "auto.create.topics.enable": "false",
    }
    for key, value in _secured.kafka_properties(tls_files(), sasl_port, HOST).items():
        if key.endswith("+"):
            settings[key[:-1]] += f",{value}"
        else:
            settings[key] = value
    lines = ["# Written by integration/services/ on every start; do not edit."]
    lines += [f"{key}={value}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


_LOG4J2 = """\
# Kafka broker logging (log4j2): INFO to a size-capped file, nothing to the console.
status = warn
name = eos-kafka
appender.file.type = RollingFile
appender.file.name = FILE
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.filePattern = ${sys:kafka.logs.dir}/server.log.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 20MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = WARN
"""


def _kafka_pid() -> int | None:
    kdir = _kafka_dir()
    try:
        pid = int((kdir / "kafka.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    if b"kafka.Kafka" not in cmdline or str(kdir / "config").encode() not in cmdline:
        return None  # pid reused by something else
    return pid if _proc_alive(pid) else None


def _configured_port(path: Path, pattern: str) -> int | None:
    with contextlib.suppress(OSError):
        match = re.search(pattern, path.read_text(), re.MULTILINE)
        if match:
            return int(match.group(1))
    return None


def start_kafka(*, keep_ports: bool = False) -> KafkaInfo:
    """Start (or re-verify) the single-node KRaft broker; returns its bootstrap address.

    ``keep_ports=True`` (a restart) fails rather than move to new ports when a stored one
    stays taken (:func:`~integration.services.ports.stable_port`)."""
    with _locked():
        version = kafka_version()
        kdir = _kafka_dir()
        state = _load_state()
        section = _section(state, "kafka")
        pid = _kafka_pid()
        timeout = service_timeout()
        started = time.monotonic()
        properties = kdir / "config" / "server.properties"
        if pid is not None and properties.exists() and "SASL_SSL://" not in properties.read_text():
            log.info("Kafka runs without the SASL_SSL listener (started by an older "
                     "scripts/services): restarting it")
            stop_kafka()
            pid = None
        if pid is not None:
            port = section.get("port") or _configured_port(
                kdir / "config" / "server.properties",
                r"^advertised\.listeners=PLAINTEXT://[^:]+:(\d+)",
            )
            if not isinstance(port, int):
                raise ServiceError(
                    f"Kafka runs (pid {pid}) but its port is unknown; run `scripts/services stop`"
                )
            running_version = str(section.get("version", version))
            log.info("Kafka already running (pid %d, port %d); verifying", pid, port)
            info = KafkaInfo(HOST, port, running_version, section.get("sasl_port"))
            server_log = kdir / "logs" / "server.log"
            try:
                _wait(
                    "Kafka",
                    lambda: kafka_metadata_ok(HOST, port),
                    timeout=timeout,
                    alive=lambda: _proc_alive(pid),
                )
            except ServiceError as exc:
                raise ServiceError(f"{exc}\n{_log_excerpt(server_log)}") from exc
            _kafka_secure_setup(info, server_log)
            log.info("Kafka ready in %.1fs: %s", time.monotonic() - started, info.bootstrap)
            _refresh_env_file()
            return info

        java = _java()
        libs = kafka_libs(version)
        config_dir = kdir / "config"
        logs_dir = kdir / "logs"
        data_dir = kdir / "data"
        for directory in (config_dir, logs_dir, data_dir):
            directory.mkdir(parents=True, exist_ok=True)
        keep = keep_ports
        port = stable_port(section, "port", False, set(), keep=keep)
        controller_port = stable_port(section, "controller_port", False, {port}, keep=keep)
        sasl_port = stable_port(section, "sasl_port", False, {port, controller_port},
                                keep=keep)
        cluster_id = _cluster_id_for_start(section, data_dir)
        section["version"] = version
        _save_state(state)

        properties = config_dir / "server.properties"
        properties.write_text(_kafka_server_properties(kdir, port, controller_port, sasl_port))
        log4j = config_dir / "log4j2.properties"
        log4j.write_text(_LOG4J2)
        heap = os.environ.get("EOS_KAFKA_HEAP_OPTS", "-Xms256m -Xmx512m").split()
        jvm = [
            java,
            *heap,
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dkafka.logs.dir={logs_dir}",
            f"-Dlog4j2.configurationFile={log4j}",
            "-cp",
            f"{libs}/*",
        ]
        server_log = logs_dir / "server.log"
        if not (data_dir / "meta.properties").exists():
            log.info("formatting Kafka storage (cluster id %s)", cluster_id)
            format_log = logs_dir / "storage-format.log"
            proc = _run(
                [
                    *jvm,
                    "kafka.tools.StorageTool",
                    "format",
                    f"--cluster-id={cluster_id}",  # one argument, whatever the id looks like
                    "--config",
                    str(properties),
                    *_secured.kafka_format_args(),
                ],
                timeout=180,
                check=False,
            )
            format_log.write_text(proc.stdout)
            if proc.returncode != 0:
                raise ServiceError(
                    f"Kafka storage format failed (exit {proc.returncode}).\n"
                    f"{_log_excerpt(format_log)}"
                )

        out_file = logs_dir / "kafka.out"
        log.info(
            "starting Kafka %s (ports %d/%d, up to %.0fs)", version, port, controller_port, timeout
        )
        with open(out_file, "ab") as out:
            child = subprocess.Popen(
                [*jvm, "kafka.Kafka", str(properties)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=kdir,
                start_new_session=True,
            )
        _children[child.pid] = child
        (kdir / "kafka.pid").write_text(f"{child.pid}\n")
        info = KafkaInfo(HOST, port, version, sasl_port)
        try:
            waited = _wait(
                "Kafka",
                lambda: kafka_metadata_ok(HOST, port),
                timeout=timeout,
                alive=lambda: _proc_alive(child.pid),
            )
        except ServiceError as exc:
            _terminate(child.pid, 20.0)
            raise ServiceError(
                f"{exc}\n{_log_excerpt(server_log)}\n{_log_excerpt(out_file, 20)}"
            ) from exc
        _kafka_secure_setup(info, server_log)
        log.info(
            "Kafka ready in %.1fs (broker start %.1fs): %s",
            time.monotonic() - started,
            waited,
            info.bootstrap,
        )
        _refresh_env_file()
        return info


def _kafka_secure_setup(info: KafkaInfo, server_log: Path) -> None:
    """The SCRAM users and their ACLs (:mod:`integration.services.secured`), idempotently."""
    try:
        _secured.kafka_secure_setup(info.bootstrap)
    except ImportError as exc:
        raise ServiceError(f"the Kafka ACLs need confluent-kafka (pip install -e .[dev]): "
                           f"{exc}") from exc
    except Exception as exc:
        raise ServiceError(f"creating Kafka's SCRAM users and ACLs failed: {exc}\n"
                           f"{_log_excerpt(server_log)}") from exc


def stop_kafka(kill: bool = False, timeout: float = 60.0) -> bool:
    """Stop the broker (SIGTERM, SIGKILL after ``timeout``; ``kill=True`` = crash now)."""
    with _locked():
        pid = _kafka_pid()
        if pid is None:
            (_kafka_dir() / "kafka.pid").unlink(missing_ok=True)
            return False
        log.info("stopping Kafka (pid %d, %s)", pid, "SIGKILL" if kill else "SIGTERM")
        started = time.monotonic()
        _terminate(pid, timeout, kill=kill)
        (_kafka_dir() / "kafka.pid").unlink(missing_ok=True)
        log.info("Kafka stopped in %.1fs", time.monotonic() - started)
        _refresh_env_file()
        return True


def restart_kafka(kill: bool = False, downtime: float = 0.0) -> KafkaInfo:
    """Stop the broker (``kill=True`` simulates a crash), wait ``downtime`` s, start it again.

    The ports, cluster id and data are kept.
    """
    with _locked():
        stop_kafka(kill=kill)
        if downtime > 0:
            time.sleep(downtime)
        return start_kafka(keep_ports=True)


def _kafka_status() -> tuple[KafkaInfo | None, int | None]:
    pid = _kafka_pid()
    section = _load_state().get("kafka", {})
    if pid is None or not isinstance(section.get("port"), int):
        return None, pid
    sasl_port = section.get("sasl_port")
    return KafkaInfo(HOST, int(section["port"]), str(section.get("version", "?")),
                     sasl_port if isinstance(sasl_port, int) else None), pid
