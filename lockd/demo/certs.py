"""Throwaway certificates for ``python -m lockd.demo --tls``, made at run time with
``cryptography`` (a dependency of lockd already) and deleted with the demo's temporary directory.

``make_demo_tls(dir)`` writes a CA valid for one day, a server certificate for ``127.0.0.1`` and
``localhost`` (both servers use it), and one client certificate ``CN=lockd-demo-worker`` that the
workers, the proxy (towards lockd) and the demo itself present under mTLS. Keys are mode 600,
as ``lockd serve`` and ``resource-proxy serve`` demand. Not a way to run a real PKI.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["DemoTLS", "make_demo_tls"]


@dataclass(frozen=True)
class DemoTLS:
    """Paths of the demo's PEM files."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    @property
    def client(self) -> tuple[str, str]:
        return str(self.client_cert), str(self.client_key)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "lockd demo"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))


def _leaf(ca_key: ec.EllipticCurvePrivateKey, ca_name: x509.Name, common_name: str,
          sans: list[x509.GeneralName], usage: x509.ObjectIdentifier,
          now: dt.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert, key


def make_demo_tls(directory: Path) -> DemoTLS:
    """Write the demo's CA, server and client certificates into ``directory`` (created)."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("lockd demo CA")
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, key_cert_sign=True, crl_sign=True,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    server, server_key = _leaf(ca_key, ca_name, "127.0.0.1", [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")],
        ExtendedKeyUsageOID.SERVER_AUTH, now)
    client, client_key = _leaf(ca_key, ca_name, "lockd-demo-worker", [
        x509.DNSName("lockd-demo-worker")], ExtendedKeyUsageOID.CLIENT_AUTH, now)
    pem = serialization.Encoding.PEM
    tls = DemoTLS(directory / "ca.pem", directory / "server.pem", directory / "server.key",
                  directory / "client.pem", directory / "client.key")
    tls.ca.write_bytes(ca.public_bytes(pem))
    tls.server_cert.write_bytes(server.public_bytes(pem))
    _write_key(tls.server_key, server_key)
    tls.client_cert.write_bytes(client.public_bytes(pem))
    _write_key(tls.client_key, client_key)
    return tls
