"""Session fixtures of the secured listeners: PostgreSQL over TLS, Kafka over SASL_SSL.

They come from the native services (``scripts/services``, :mod:`integration.services.secured`):
``$EOS_POSTGRES_TLS_CONNINFO`` and friends when set, else ``.services.env``. The plain
fixtures are resolved first (so a session that starts the services starts these too). A
missing secured listener fails the test under ``CI=true`` and skips it elsewhere (the
Docker compose file has none).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from integration import services as _services
from integration.services import secured as _secured
from integration.services.tls import TlsFiles
from integration.support._fixtures_services import _unavailable

__all__ = ["KafkaSasl", "PgTls", "kafka_sasl", "pg_tls"]


def _value(name: str) -> str:
    value = os.environ.get(name) or _services.read_env_file().get(name)
    if not value:
        _unavailable(f"${name} is not set and .services.env has none: run "
                     "`scripts/services start` (the secured listeners are native only)")
    return value


@dataclass(frozen=True)
class PgTls:
    """The TLS roles' conninfos, the superuser's (plain) conninfo and the certificates."""

    cert_conninfo: str
    scram_conninfo: str
    admin_conninfo: str
    tls: TlsFiles
    schema: str = _secured.PG_SCHEMA

    def table(self, prefix: str) -> str:
        return f"{self.schema}.{prefix}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class KafkaSasl:
    """The least-privilege users' librdkafka configs and the (plain, super) bootstrap."""

    config: dict[str, str]
    reader_config: dict[str, str]
    plain_bootstrap: str
    tls: TlsFiles

    @property
    def bootstrap(self) -> str:
        return self.config["bootstrap.servers"]

    def sink_id(self, name: str) -> str:
        return f"{_secured.SECURE_PREFIX}-{name}-{uuid.uuid4().hex[:6]}"

    def topic(self, name: str) -> str:
        return f"{_secured.SECURE_TOPIC_PREFIX}{name}.{uuid.uuid4().hex[:6]}"

    def input_topic(self, name: str) -> str:
        return f"{_secured.SECURE_INPUT_PREFIX}{name}.{uuid.uuid4().hex[:6]}"

    def user_config(self, user: str, password: str) -> dict[str, str]:
        return {**self.config, "sasl.username": user, "sasl.password": password}

    def add_user(self, user: str, password: str, acls: list[tuple[str, str, str]]) -> None:
        """A SCRAM user holding ``acls`` (see :func:`integration.services.secured.sink_acls`)."""
        _secured.add_users(self.plain_bootstrap, [(user, password)],
                           _secured.acl_bindings(user, acls))


def _tls_dir(ca: str) -> TlsFiles:
    """The certificates beside the CA file a secured setting names."""
    tls = TlsFiles(Path(ca).parent)
    if not tls.ca.exists():
        _unavailable(f"the test certificates are missing under {tls.directory}")
    return tls


@pytest.fixture(scope="session")
def pg_tls(postgres_conninfo: str) -> PgTls:
    cert = _value(_secured.ENV_POSTGRES_TLS_CONNINFO)
    scram = _value(_secured.ENV_POSTGRES_TLS_SCRAM_CONNINFO)
    import psycopg

    tls = _tls_dir(str(psycopg.conninfo.conninfo_to_dict(cert)["sslrootcert"]))
    return PgTls(cert, scram, postgres_conninfo, tls)


@pytest.fixture(scope="session")
def kafka_sasl(kafka_bootstrap: str) -> KafkaSasl:
    config = json.loads(_value(_secured.ENV_KAFKA_SASL_CONFIG))
    reader = json.loads(_value(_secured.ENV_KAFKA_SASL_READER_CONFIG))
    return KafkaSasl(config, reader, kafka_bootstrap, _tls_dir(config["ssl.ca.location"]))


@pytest.fixture
def secrets_env(monkeypatch: pytest.MonkeyPatch, pg_tls: PgTls,
                kafka_sasl: KafkaSasl) -> Iterator[dict[str, Any]]:
    """The drivers' environment: the secured settings in variables, never in arguments."""
    monkeypatch.setenv(_secured.ENV_POSTGRES_TLS_CONNINFO, pg_tls.cert_conninfo)
    monkeypatch.setenv(_secured.ENV_KAFKA_SASL_CONFIG, json.dumps(kafka_sasl.config))
    monkeypatch.setenv(_secured.ENV_KAFKA_SASL_READER_CONFIG,
                       json.dumps(kafka_sasl.reader_config))
    yield {"pg": pg_tls, "kafka": kafka_sasl}


def grep_secrets(*texts: str, paths: tuple[Path, ...] = ()) -> list[str]:
    """Which of the secured services' secrets appear in ``texts`` or the files under
    ``paths`` (recursively): ``secret in where`` strings, empty when none."""
    found: list[str] = []
    for n, secret in enumerate(_secured.SECRETS):
        for i, text in enumerate(texts):
            at = text.find(secret)
            if at >= 0:
                found.append(f"secret #{n} in output #{i} after "
                             f"{text[max(0, at - 80):at]!r}")
        for root in paths:
            files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
            for path in files:
                try:
                    data = path.read_bytes()
                except OSError:
                    continue
                if secret.encode() in data:
                    found.append(f"secret #{n} in {path}")
    return found
