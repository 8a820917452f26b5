"""MariaDB's fixtures, resolved as the other services' (``_fixtures_services.py``).

``mariadb_url`` (session): ``$EOS_MARIADB_URL`` when set (must answer), else the same key of
``.services.env`` when it answers, else ``docker/docker-compose.yml``'s ``mariadb`` when a
Docker engine answers, else the native server of :mod:`integration.services.mariadb`,
started here (stopped at session end only when this session started it). A MariaDB that
cannot be had fails the test under ``CI=true`` and skips it elsewhere.

``native_mariadb``: a MariaDB of the test module's own (its :class:`ServiceInstance`), to
restart (``mode="immediate"``: SIGKILL) or stop while the shared one serves the others.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from integration import services as _services
from integration.services.instance import ServiceInstance
from integration.support._fixtures_services import ServiceResolver, _private

__all__ = ["NativeMariaDB", "mariadb_url", "native_mariadb"]


@pytest.fixture(scope="session")
def mariadb_url(eos_services: ServiceResolver) -> str:
    """``mariadb://eos:eos@host:port/eos``: the sink's least-privilege user on MariaDB
    >= 10.11 (prepared XA kept across disconnects and restarts, ``local_infile`` on)."""
    return eos_services.get("mariadb")


@dataclass(frozen=True)
class NativeMariaDB:
    """A MariaDB of the test module's own; its address stays valid across restarts."""

    info: _services.MariaDBInfo
    instance: ServiceInstance

    @property
    def url(self) -> str:
        return self.info.url

    def restart(self, mode: _services.PgStopMode = "fast",
                downtime: float = 0.0) -> _services.MariaDBInfo:
        """``fast``: SIGTERM (a clean shutdown); ``immediate``: SIGKILL (a crash)."""
        with self.instance.active():
            return _services.restart_mariadb(mode=mode, downtime=downtime)

    def stop(self, mode: _services.PgStopMode = "fast") -> None:
        with self.instance.active():
            _services.stop_mariadb(mode)

    def start(self) -> _services.MariaDBInfo:
        """Start it after :meth:`stop`, at the same address."""
        with self.instance.active():
            return _services.start_mariadb(keep_ports=True)

    def status(self) -> _services.Status:
        return self.instance.status()


@pytest.fixture
def native_mariadb(private_services: ServiceInstance) -> Iterator[NativeMariaDB]:
    """A MariaDB of this module's own to restart. After the test it is started again if
    the test left it stopped."""
    info = _private("MariaDB", private_services.mariadb)
    yield NativeMariaDB(info, private_services)
    private_services.mariadb()  # idempotent: started again only if the test left it stopped
