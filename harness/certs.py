"""Certificates made at test time with ``trustme`` (nothing private is committed).

``make_pki(dir)`` writes one CA, a server certificate for ``127.0.0.1``/``localhost`` (key mode
600, as the servers demand), a client certificate
``CN=client-1,OU=clients,O=lockd-tests`` signed by that
CA, an admin client ``CN=admin-1,OU=admins,O=lockd-tests``, and a client certificate from ANOTHER CA with
the very same subject (a server must refuse it at the handshake all the same).
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path

import trustme

__all__ = ["Pki", "Pair", "make_pki"]

CLIENT_SUBJECT = "CN=client-1,OU=clients,O=lockd-tests"
ADMIN_SUBJECT = "CN=admin-1,OU=admins,O=lockd-tests"


@dataclass(frozen=True)
class Pair:
    """A certificate chain file and its key file."""

    cert: Path
    key: Path

    @property
    def tuple(self) -> tuple[str, str]:
        return str(self.cert), str(self.key)


@dataclass(frozen=True)
class Pki:
    dir: Path
    ca: Path  # the CA both servers trust for clients, and clients trust for servers
    server: Pair  # 127.0.0.1 / localhost
    client: Pair  # CLIENT_SUBJECT, signed by ca
    admin: Pair  # ADMIN_SUBJECT, signed by ca
    stranger: Pair  # CLIENT_SUBJECT, signed by another CA
    other_ca: Path
    authority: trustme.CA

    def issue(self, name: str, *identities: str, key_mode: int = 0o600,
              not_before: dt.datetime | None = None,
              not_after: dt.datetime | None = None) -> Pair:
        """Another leaf of ``ca`` (e.g. an expired one), written as ``name.pem``/``name.key``."""
        return _write(self.dir, name, self.authority.issue_cert(
            *(identities or ("127.0.0.1", "localhost")), not_before=not_before,
            not_after=not_after), key_mode)


def _write(directory: Path, name: str, leaf: trustme.LeafCert, key_mode: int = 0o600) -> Pair:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    key.write_bytes(leaf.private_key_pem.bytes())
    os.chmod(key, key_mode)
    return Pair(cert, key)


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca, other = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    other.cert_pem.write_to_path(str(directory / "other-ca.pem"))
    return Pki(
        dir=directory, ca=directory / "ca.pem", other_ca=directory / "other-ca.pem",
        server=_write(directory, "server", ca.issue_cert("127.0.0.1", "localhost")),
        client=_write(directory, "client", ca.issue_cert(
            "client-1.test", common_name="client-1", organization_name="lockd-tests",
            organization_unit_name="clients")),
        admin=_write(directory, "admin", ca.issue_cert(
            "admin-1.test", common_name="admin-1", organization_name="lockd-tests",
            organization_unit_name="admins")),
        stranger=_write(directory, "stranger", other.issue_cert(
            "client-1.test", common_name="client-1", organization_name="lockd-tests",
            organization_unit_name="clients")),
        authority=ca,
    )
