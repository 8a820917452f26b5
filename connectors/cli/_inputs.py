"""Where the operator commands read their targets' settings: never a secret as an argument.

Every process's command line is visible to every user of the machine (``ps``), so:

- ``--postgres-env VAR`` / ``--postgres-file FILE``: the libpq connection string from an
  environment variable or a file (its text stripped; newlines count as spaces), as an
  alternative to ``--postgres CONNINFO``. A secret in ``--postgres CONNINFO`` (a
  password, ``sslpassword``...) still works, with a warning on stderr; libpq's own
  ``PGPASSWORD`` and ``~/.pgpass`` work as always.
- ``--mariadb-env VAR`` / ``--mariadb-file FILE``: the same for MariaDB's address
  (``mariadb://user:password@host:3306/database``), as an alternative to ``--mariadb URL``,
  which warns on stderr when it holds a password.
- ``--kafka-config-env VAR`` / ``--kafka-config-file FILE``: librdkafka settings, either
  a JSON object (text starting with ``{``) or properties lines (``KEY=VALUE``; blank
  lines and lines starting with ``#`` or ``!`` ignored), e.g. ``client.properties``
  holding ``sasl.password=...``. ``--kafka-config KEY=VALUE`` refuses a secret key
  (:func:`connectors.kafka.admin.is_secret_key`) and names these flags instead. Later
  sources win: the file, then the variable, then ``--kafka-config``; ``--kafka BOOTSTRAP``
  is optional when the settings have ``bootstrap.servers``.
- ``--storage-option KEY=VALUE`` (Delta) refuses a secret: it belongs in the environment.

An error names the flag and the variable or file, never what it holds.

Example::

    >>> kafka_settings(["linger.ms=5"], env="", file="", environ={})
    {'linger.ms': '5'}
    >>> kafka_settings(["sasl.password=hunter2"], env="", file="", environ={})
    Traceback (most recent call last):
    ...
    connectors.core.errors.ConfigurationError: --kafka-config sasl.password=... would put a \
secret on the command line, where `ps` shows it to every user of the machine: put it in a \
file (--kafka-config-file FILE) or an environment variable (--kafka-config-env VAR)
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from connectors.core.errors import ConfigurationError

__all__ = ["connection_text", "kafka_settings", "mariadb_url", "postgres_conninfo",
           "storage_options"]


def _read(flag: str, env: str, file: str, environ: Mapping[str, str]) -> str | None:
    """The text of ``--<flag>-env VAR`` or ``--<flag>-file FILE`` (``None``: neither)."""
    if env and file:
        raise ConfigurationError(f"give --{flag}-env or --{flag}-file, not both")
    if env:
        text = environ.get(env, "")
        if not text.strip():
            raise ConfigurationError(f"--{flag}-env {env}: the environment variable {env} "
                                     "is not set or empty")
        return text
    if file:
        try:
            return Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"--{flag}-file {file}: cannot read the file "
                                     f"({type(exc).__name__})") from None
    return None


def connection_text(flag: str, arg: str | None, *, env: str | None, file: str | None,
                    has_secret: Callable[[str], bool], instead: str,
                    environ: Mapping[str, str] | None = None) -> str | None:
    """The connection string of ``--<flag>``, ``--<flag>-env`` or ``--<flag>-file``
    (``None``: none given; a file's or variable's text stripped, newlines as spaces); warns
    on stderr when ``--<flag>`` holds a secret (``has_secret``), naming ``instead``."""
    text = _read(flag, env or "", file or "", os.environ if environ is None else environ)
    if text is not None and arg:
        raise ConfigurationError(f"give one of --{flag}, --{flag}-env and --{flag}-file")
    if text is not None:
        text = " ".join(text.split())
        if not text:
            raise ConfigurationError(f"--{flag}-file {file}: the file is empty")
        return text
    if arg and has_secret(arg):
        print(f"connectors: warning: --{flag} carries a secret (a password) on the command "
              f"line, where `ps` shows it to every user of the machine: use --{flag}-env "
              f"VAR or --{flag}-file FILE{instead}", file=sys.stderr)
    return arg or None


def postgres_conninfo(arg: str | None, *, env: str | None, file: str | None,
                      environ: Mapping[str, str] | None = None) -> str | None:
    """The connection string of ``--postgres``, ``--postgres-env`` or ``--postgres-file``
    (``None``: no PostgreSQL target); warns on stderr when ``--postgres`` holds a secret.
    The ``postgres`` extra is imported only when a conninfo is given: the other targets'
    commands run without psycopg."""
    def has_secret(conninfo: str) -> bool:
        from connectors.postgres.admin import conninfo_has_secret

        return conninfo_has_secret(conninfo)

    return connection_text("postgres", arg, env=env, file=file, environ=environ,
                           has_secret=has_secret, instead=" (or PGPASSWORD, ~/.pgpass)")


def mariadb_url(arg: str | None, *, env: str | None, file: str | None,
                environ: Mapping[str, str] | None = None) -> str | None:
    """The address of ``--mariadb``, ``--mariadb-env`` or ``--mariadb-file`` (``None``: no
    MariaDB target); warns on stderr when ``--mariadb`` holds a password. The ``mariadb``
    extra is imported only when an address is given: the other targets' commands run
    without PyMySQL."""
    def has_secret(url: str) -> bool:
        from connectors.mariadb.admin import address_has_secret

        return address_has_secret(url)

    return connection_text("mariadb", arg, env=env, file=file, environ=environ,
                           has_secret=has_secret, instead="")


def _parse_settings(text: str, where: str) -> dict[str, Any]:
    """A JSON object, or ``KEY=VALUE`` lines; errors name ``where`` and a line number."""
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"{where}: not a JSON object of librdkafka settings "
                                     f"({exc.msg} at line {exc.lineno})") from None
        if not isinstance(data, dict):  # pragma: no cover - a text starting with '{'
            raise ConfigurationError(f"{where}: not a JSON object")
        return {str(k): v for k, v in data.items()}
    settings: dict[str, Any] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"{where}: line {number} is not KEY=VALUE (nor a "
                                     "comment); a JSON object starts with '{'")
        settings[key.strip()] = value.strip()
    return settings


def _pair(flag: str, pair: str) -> tuple[str, str]:
    """``KEY=VALUE`` of a repeatable ``flag`` (the key stripped); the error shows no value."""
    key, sep, value = pair.partition("=")
    if not sep or not key.strip():
        raise ConfigurationError(f"{flag} takes KEY=VALUE (an argument had no '=' or no key)")
    return key.strip(), value


def kafka_settings(pairs: Sequence[str], *, env: str | None, file: str | None,
                   environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The librdkafka settings of ``--kafka-config-file``, ``--kafka-config-env`` and
    ``--kafka-config`` (see the module docstring)."""
    from connectors.kafka.admin import is_secret_key

    environ = os.environ if environ is None else environ
    settings: dict[str, Any] = {}
    if file:
        settings.update(_parse_settings(_read("kafka-config", "", file, environ) or "",
                                        f"--kafka-config-file {file}"))
    if env:
        settings.update(_parse_settings(_read("kafka-config", env, "", environ) or "",
                                        f"--kafka-config-env {env}"))
    for pair in pairs:
        key, value = _pair("--kafka-config", pair)
        if is_secret_key(key):
            raise ConfigurationError(
                f"--kafka-config {key}=... would put a secret on the command line, where "
                "`ps` shows it to every user of the machine: put it in a file "
                "(--kafka-config-file FILE) or an environment variable (--kafka-config-env "
                "VAR)")
        settings[key] = value
    return settings


def storage_options(pairs: Sequence[str]) -> dict[str, str]:
    """``--storage-option KEY=VALUE`` pairs; a secret is refused (``ps`` shows every
    process's arguments to every user): it belongs in the environment."""
    from connectors.delta.admin import is_secret_option

    options: dict[str, str] = {}
    for pair in pairs:
        key, value = _pair("--storage-option", pair)
        if is_secret_option(key):
            raise ConfigurationError(
                f"--storage-option {key}=... would put a secret on the command line, where "
                f"`ps` shows it to every user of the machine: set the environment variable "
                f"{key.upper()} instead (delta-rs and the ledger's store read it from there)")
        options[key] = value
    return options
