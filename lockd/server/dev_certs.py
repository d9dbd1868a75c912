"""``lockd dev certs DIR``: a development CA and the certificates to try TLS and mTLS locally.

Writes into ``DIR`` (created if missing; existing files are refused, not overwritten):

==================  ===========================================================================
``ca.pem``          the CA certificate: clients trust it (``--ca``), servers trust it for
                    client certificates (``--tls-client-ca``)
``ca.key``          its private key (mode 600; needed only to issue more)
``server.pem/.key`` a server certificate for ``127.0.0.1``, ``::1`` and ``localhost``
``client.pem/.key`` a client certificate, subject ``CN=client-1,OU=clients,O=lockd-dev``
==================  ===========================================================================

Keys are ECDSA P-256 (``cryptography``, already a dependency); certificates last 30 days. For a
local try only: a CA whose key sits next to its certificate protects nothing.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["FILES", "CLIENT_SUBJECT", "make_dev_certs", "usage"]

FILES = ("ca.pem", "ca.key", "server.pem", "server.key", "client.pem", "client.key")
CLIENT_SUBJECT = "CN=client-1,OU=clients,O=lockd-dev"
_DAYS = 30


def _name(**parts: str) -> x509.Name:
    oids = {"CN": NameOID.COMMON_NAME, "OU": NameOID.ORGANIZATIONAL_UNIT_NAME,
            "O": NameOID.ORGANIZATION_NAME}
    return x509.Name([x509.NameAttribute(oids[k], v) for k, v in parts.items()])


def _issue(subject: x509.Name, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
           signer: ec.EllipticCurvePrivateKey, *, ca: bool,
           extensions: list[tuple[x509.ExtensionType, bool]]) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5))
               .not_valid_after(now + dt.timedelta(days=_DAYS))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(signer, hashes.SHA256())


def _write(path: Path, data: bytes, private: bool = False) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    fd = os.open(path, flags, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _key_bytes(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_dev_certs(directory: Path) -> list[Path]:
    """Write the files of ``FILES`` into ``directory``; returns their paths. Raises
    ``FileExistsError`` (nothing written) if any of them is there already."""
    directory.mkdir(parents=True, exist_ok=True)
    taken = [directory / f for f in FILES if (directory / f).exists()]
    if taken:
        raise FileExistsError(f"{taken[0]} exists (lockd dev certs never overwrites)")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(CN="lockd dev CA", O="lockd-dev")
    usage_ca = x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                             content_commitment=False, key_encipherment=False,
                             data_encipherment=False, key_agreement=False,
                             encipher_only=False, decipher_only=False)
    ca = _issue(ca_name, ca_key, ca_name, ca_key, ca=True, extensions=[
        (usage_ca, True),
        (x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)])
    server_key, client_key = ec.generate_private_key(ec.SECP256R1()), \
        ec.generate_private_key(ec.SECP256R1())
    alt = x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                       x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                       x509.IPAddress(ipaddress.ip_address("::1"))])
    authority = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    server = _issue(_name(CN="localhost", O="lockd-dev"), server_key, ca_name, ca_key, ca=False,
                    extensions=[(alt, False), (authority, False), (x509.ExtendedKeyUsage(
                        [ExtendedKeyUsageOID.SERVER_AUTH]), False)])
    client = _issue(_name(CN="client-1", OU="clients", O="lockd-dev"), client_key, ca_name,
                    ca_key, ca=False, extensions=[(authority, False), (x509.ExtendedKeyUsage(
                        [ExtendedKeyUsageOID.CLIENT_AUTH]), False)])
    pem = serialization.Encoding.PEM
    for name, data, private in (("ca.pem", ca.public_bytes(pem), False),
                                ("ca.key", _key_bytes(ca_key), True),
                                ("server.pem", server.public_bytes(pem), False),
                                ("server.key", _key_bytes(server_key), True),
                                ("client.pem", client.public_bytes(pem), False),
                                ("client.key", _key_bytes(client_key), True)):
        _write(directory / name, data, private)
    return [directory / f for f in FILES]


def usage(directory: Path) -> str:
    """How to use the files (printed by ``lockd dev certs``)."""
    d = str(directory)
    return "\n".join([
        f"wrote {', '.join(FILES)} into {d} (valid {_DAYS} days; for local tries only)",
        "lockd over https, asking clients for a certificate (mTLS):",
        f"  lockd serve --tls-cert {d}/server.pem --tls-key {d}/server.key "
        f"--tls-client-ca {d}/ca.pem",
        "a client:",
        f"  lockctl --url https://127.0.0.1:7070 --ca {d}/ca.pem --cert {d}/client.pem "
        f"--key {d}/client.key status demo",
        f"  LockClient('https://127.0.0.1:7070', verify='{d}/ca.pem', "
        f"cert=('{d}/client.pem', '{d}/client.key'))",
        f"the client's subject (for LOCKD_CERT_CLIENTS or an access file): {CLIENT_SUBJECT}",
    ])
