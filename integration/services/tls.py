"""Certificates for the secured test services, made once with the ``openssl`` command.

Under ``<state>/tls`` (kept across starts; made again only when a file is missing or a
certificate expires within 30 days):

* ``ca.pem`` / ``ca.key``: the test CA that signs everything below;
* ``server.pem`` / ``server.key``: PostgreSQL's and Kafka's server certificate, for
  ``localhost`` and ``127.0.0.1`` (so ``sslmode=verify-full`` and librdkafka's default
  ``ssl.endpoint.identification.algorithm=https`` check the name);
* ``kafka-keystore.pem``: the server key and certificate in one PEM file (Kafka's
  ``ssl.keystore.type=PEM``);
* ``client.pem`` / ``client.key``: a client certificate for the PostgreSQL role
  :data:`CLIENT_CN`; the key is encrypted with :data:`CLIENT_KEY_PASSWORD` (libpq's
  ``sslpassword``), so that a secret the sinks must never show is in play;
* ``other-ca.pem``: a second CA that signed nothing here: ``sslrootcert`` (or
  ``ssl.ca.location``) pointing to it must fail verification.

Standard library plus the ``openssl`` command (Debian package ``openssl``).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from pathlib import Path
from typing import Final

__all__ = ["CLIENT_CN", "CLIENT_KEY_PASSWORD", "TlsFiles", "ensure_tls"]

#: The common name of the client certificate: PostgreSQL's ``cert`` authentication maps it
#: to the role of the same name.
CLIENT_CN: Final = "eos_cert"
#: The passphrase of ``client.key`` (libpq ``sslpassword``). A test value, but treated as
#: a secret everywhere: the secret-grep test looks for it in every output.
CLIENT_KEY_PASSWORD: Final = "eos-client-key-pass-4Rk"
_DAYS: Final = 825
_RENEW_S: Final = 30 * 86400


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def server_cert(self) -> Path:
        return self.directory / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.directory / "server.key"

    @property
    def kafka_keystore(self) -> Path:
        return self.directory / "kafka-keystore.pem"

    @property
    def client_cert(self) -> Path:
        return self.directory / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.directory / "client.key"

    @property
    def other_ca(self) -> Path:
        return self.directory / "other-ca.pem"

    def all(self) -> tuple[Path, ...]:
        return (self.ca, self.ca_key, self.server_cert, self.server_key, self.kafka_keystore,
                self.client_cert, self.client_key, self.other_ca)


class TlsError(RuntimeError):
    """The certificates could not be made (the message says why)."""


def _openssl(*args: str, cwd: Path) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise TlsError("the `openssl` command is missing (Debian package `openssl`)")
    proc = subprocess.run([binary, *args], cwd=cwd, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise TlsError(f"openssl {args[0]} failed: {proc.stderr.strip()[-800:]}")


def _valid(cert: Path) -> bool:
    binary = shutil.which("openssl")
    if binary is None or not cert.exists():
        return False
    proc = subprocess.run([binary, "x509", "-checkend", str(_RENEW_S), "-noout", "-in",
                           str(cert)], capture_output=True, timeout=60, check=False)
    return proc.returncode == 0


def _ca(directory: Path, name: str, cn: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", str(_DAYS),
             "-subj", f"/O=connectors tests/CN={cn}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)


def _leaf(directory: Path, name: str, cn: str, ext: str, passphrase: str | None) -> None:
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-keyout", f"{name}.key.tmp", "-out", f"{name}.csr",
             "-subj", f"/O=connectors tests/CN={cn}", cwd=directory)
    (directory / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", str(_DAYS), "-sha256", "-extfile", f"{name}.ext",
             "-out", f"{name}.pem", cwd=directory)
    # PKCS#8 (what libpq, librdkafka and Java read alike); encrypted with AES when asked.
    pkcs8 = ["pkcs8", "-topk8", "-in", f"{name}.key.tmp", "-out", f"{name}.key"]
    pkcs8 += (["-nocrypt"] if passphrase is None
              else ["-v2", "aes-256-cbc", "-passout", "env:EOS_TLS_PASS"])
    env_backup = os.environ.get("EOS_TLS_PASS")
    if passphrase is not None:
        os.environ["EOS_TLS_PASS"] = passphrase  # never on a command line
    try:
        _openssl(*pkcs8, cwd=directory)
    finally:
        if env_backup is None:
            os.environ.pop("EOS_TLS_PASS", None)
        else:
            os.environ["EOS_TLS_PASS"] = env_backup
    for leftover in (f"{name}.key.tmp", f"{name}.csr", f"{name}.ext"):
        (directory / leftover).unlink(missing_ok=True)


def ensure_tls(directory: Path) -> TlsFiles:
    """The test certificates under ``directory``, made when missing or expiring."""
    files = TlsFiles(directory)
    if all(p.exists() for p in files.all()) and all(
        _valid(c) for c in (files.ca, files.server_cert, files.client_cert)
    ):
        return files
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    for path in files.all():
        path.unlink(missing_ok=True)
    _ca(directory, "ca", "connectors test CA")
    _ca(directory, "other-ca", "another CA (signs nothing here)")
    (directory / "other-ca.key").unlink(missing_ok=True)
    _leaf(directory, "server", "localhost",
          "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
          "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n", None)
    _leaf(directory, "client", CLIENT_CN,
          "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
          "extendedKeyUsage=clientAuth\n", CLIENT_KEY_PASSWORD)
    files.kafka_keystore.write_text(files.server_key.read_text()
                                    + files.server_cert.read_text())
    for path in files.all():
        path.chmod(0o600 if path.suffix == ".key" or path == files.kafka_keystore else 0o644)
    (directory / "ca.srl").unlink(missing_ok=True)
    return files
