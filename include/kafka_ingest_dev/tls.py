"""The secure local stack's certificates and credentials, made here, never downloaded.

A private CA signs one server certificate for ``127.0.0.1`` and ``localhost`` that the
Kafka ``SASL_SSL`` listener and Postgres both present; clients verify it against the CA
(``ssl.ca.location``, ``sslrootcert`` with ``sslmode=verify-full``). Passwords for the SCRAM
users are random. Every file is written 0600 in ``<state>/tls``; nothing is regenerated
while it exists, so restarts keep the same identities.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID_DAYS = 3650
HOSTS = ("localhost",)
ADDRESSES = ("127.0.0.1",)


@dataclass(frozen=True)
class TlsFiles:
    """Where the secure stack's material lives."""

    root: Path

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def server_cert(self) -> Path:
        return self.root / "server.crt"

    @property
    def server_key(self) -> Path:
        return self.root / "server.key"

    @property
    def server_pem(self) -> Path:
        """Key and certificate in one PEM file: Kafka's ``ssl.keystore.type=PEM``."""
        return self.root / "server-keystore.pem"

    @property
    def credentials(self) -> Path:
        return self.root / "credentials.json"


def _write_private(path: Path, data: bytes) -> None:
    """Create ``path`` 0600 from the start (never world-readable, not even briefly)."""
    tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    tmp.replace(path)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kafka-ingest local stack"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _issue(files: TlsFiles) -> None:
    now = dt.datetime.now(tz=dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("kafka-ingest local CA"))
          .issuer_name(_name("kafka-ingest local CA")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=_VALID_DAYS))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(h) for h in HOSTS]
    names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ADDRESSES]
    cert = (x509.CertificateBuilder().subject_name(_name("localhost"))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=_VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    _write_private(files.ca_key, _pem_key(ca_key))
    _write_private(files.ca_cert, ca_pem)
    _write_private(files.server_key, _pem_key(key))
    _write_private(files.server_cert, cert_pem + ca_pem)
    _write_private(files.server_pem, _pem_key(key) + cert_pem + ca_pem)


def ensure(root: Path) -> TlsFiles:
    """The CA, the server certificate and the credentials, made once."""
    files = TlsFiles(root)
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    if not (files.server_pem.is_file() and files.ca_cert.is_file()):
        _issue(files)
    if not files.credentials.is_file():
        _write_private(files.credentials, json.dumps({
            "kafka_user": "kafka-ingest",
            "kafka_password": secrets.token_urlsafe(24),
            "pg_app_password": secrets.token_urlsafe(24),
        }, indent=2).encode())
    return files


def credentials(files: TlsFiles) -> dict[str, str]:
    stored: dict[str, str] = json.loads(files.credentials.read_text())
    return stored
