"""The targets' public admin modules (issue 50): documented, their names resolve, and what
moved out of the command line (the gids of ``pg_prepared_xacts`` decoded, secrets refused)
works without a service. The services' cases run through the command in
``integration/cli/``."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import pytest

from connectors.core.naming import TransactionId

ADMIN_MODULES = {
    "connectors.postgres.admin": ("psycopg", ["DEFAULT_LEDGER_TABLE", "PostgresAdmin",
                                              "PreparedTransaction", "column_values",
                                              "conninfo_has_secret"]),
    "connectors.kafka.admin": ("confluent_kafka", ["KafkaAdmin", "OpenTransaction",
                                                   "check_topic", "is_secret_key"]),
    "connectors.delta.admin": ("deltalake", ["DeltaAdmin", "is_secret_option"]),
    "connectors.iceberg.admin": ("json", ["IcebergAdmin"]),
}


@pytest.mark.parametrize("name", sorted(ADMIN_MODULES))
def test_an_admin_module_is_documented_and_its_names_resolve(name: str) -> None:
    client, names = ADMIN_MODULES[name]
    pytest.importorskip(client)
    module = importlib.import_module(name)
    assert module.__doc__ and "Example" in module.__doc__
    assert sorted(module.__all__) == sorted(names)
    for public in module.__all__:
        obj = getattr(module, public)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        assert (obj.__doc__ or "").strip(), f"{name}.{public} has no docstring"
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if inspect.isfunction(member) and not attr.startswith("_"):
                    assert (member.__doc__ or "").strip(), f"{name}.{public}.{attr}"


def test_postgres_admin_decodes_the_gids_and_leaves_other_applications_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("psycopg")
    from connectors.postgres._gid import gid_of
    from connectors.postgres.admin import PostgresAdmin

    mine = TransactionId("pg-a", "0123abcd", 7, 3)
    other = TransactionId("pg-b", "0123abcd", 2, 0)
    rows = [(gid_of(mine), 12.5), (gid_of(other), 1.0), ("another application's gid", 99.0),
            ("1_AAAA_AAAA", 5.0)]  # a well-formed gid of another XA format id
    admin = PostgresAdmin("host=nowhere.invalid dbname=x password=hunter2")
    monkeypatch.setattr(admin, "_rows", lambda *a, **k: rows)
    assert [(p.transaction_id, p.age_s) for p in admin.prepared()] == [(mine, 12.5),
                                                                         (other, 1.0)]
    assert [p.transaction_id for p in admin.prepared("pg-a")] == [mine]
    assert "hunter2" not in admin.describe() + repr(admin)
    admin.close()


def test_postgres_admin_names_the_ledger_table_setting_it_refuses() -> None:
    pytest.importorskip("psycopg")
    from connectors.core.errors import ConfigurationError
    from connectors.postgres.admin import PostgresAdmin

    with pytest.raises(ConfigurationError, match="--ledger-table"):
        PostgresAdmin("dbname=x", "a.b.c", what="--ledger-table")


@pytest.mark.parametrize(("module", "function", "secret", "plain"), [
    ("connectors.postgres.admin", "conninfo_has_secret", "host=h password=p", "host=h"),
    ("connectors.postgres.admin", "conninfo_has_secret", "postgresql://u:p@h/db",
     "postgresql://u@h/db"),
    ("connectors.kafka.admin", "is_secret_key", "sasl.password", "sasl.username"),
    ("connectors.delta.admin", "is_secret_option", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"),
])
def test_the_secret_predicates(module: str, function: str, secret: str, plain: str) -> None:
    pytest.importorskip(ADMIN_MODULES[module][0])
    check: Any = getattr(importlib.import_module(module), function)
    assert check(secret) is True and check(plain) is False
