"""A set of the test services of its own: for the tests that restart, stop or kill one.

The shared services (``scripts/services``, ``<repo>/.services``) serve every test at once,
so a test that restarts one would cut the others' connections. Such a test gets its own
PostgreSQL, Kafka broker, S3 API or MariaDB instead, started on demand in a directory of its own
(new ports, its own env file), and stopped and removed afterwards: it runs beside the
others, on any pytest-xdist worker. Measured on the CI machine: PostgreSQL answers 1.4 s
after the start, Kafka 6.4 s, moto 1.4 s.

The services' functions (:func:`integration.services.start_postgres`, ``restart_kafka``,
``status``, ...) act on this instance within :meth:`ServiceInstance.active`;
:meth:`ServiceInstance.environ` gives a child process (``scripts/services``) the same.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from integration.services.config import (
    ENV_SERVICES_DIR,
    ENV_SERVICES_ENV_FILE,
    KafkaInfo,
    MariaDBInfo,
    PostgresInfo,
    S3Info,
    ServiceError,
    Status,
    _fallback_pg_root,
    routed_to,
)
from integration.services.control import status, stop
from integration.services.kafka import start_kafka
from integration.services.mariadb import start_mariadb
from integration.services.postgres import start_postgres
from integration.services.s3 import start_s3

__all__ = ["ServiceInstance"]


class ServiceInstance:
    """Services in a temporary directory of their own, stopped and removed by :meth:`close`."""

    def __init__(self, label: str = "private") -> None:
        self.state = Path(tempfile.mkdtemp(prefix=f"eos-services-{label}-"))
        # PostgreSQL and MariaDB run as the unprivileged service user, which must reach its data
        # directory under here (mkdtemp makes it 0700).
        self.state.chmod(0o755)
        self.env = self.state / "services.env"

    def __repr__(self) -> str:
        return f"ServiceInstance({str(self.state)!r})"

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The services' functions act on this instance within the block (this thread)."""
        with routed_to(self.state, self.env):
            yield

    def environ(self) -> dict[str, str]:
        """``os.environ`` for a child process (``scripts/services ...``) acting on it."""
        return {**os.environ, ENV_SERVICES_DIR: str(self.state),
                ENV_SERVICES_ENV_FILE: str(self.env)}

    def postgres(self) -> PostgresInfo:
        """Its PostgreSQL, started unless it runs."""
        with self.active():
            return start_postgres()

    def kafka(self) -> KafkaInfo:
        """Its Kafka broker, started unless it runs."""
        with self.active():
            return start_kafka()

    def s3(self) -> S3Info:
        """Its S3 API (moto) with the bucket, started unless it runs."""
        with self.active():
            return start_s3()

    def mariadb(self) -> MariaDBInfo:
        """Its MariaDB server, started unless it runs."""
        with self.active():
            return start_mariadb()

    def status(self) -> Status:
        """What of it runs."""
        with self.active():
            return status()

    def close(self) -> None:
        """Stop whatever of it runs and remove its files."""
        with self.active():
            fallback = _fallback_pg_root().parent
            try:
                stop()
            except ServiceError as exc:  # teardown must not hide the test's result
                print(f"warning: could not stop the services in {self.state}: {exc}")
        shutil.rmtree(self.state, ignore_errors=True)
        shutil.rmtree(fallback, ignore_errors=True)
