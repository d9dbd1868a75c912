"""TLS for both servers and every client: start-up checks, SSL contexts, certificate identities.

Opt-in everywhere: nothing here runs unless a certificate is configured.

Servers (``lockd serve`` and ``resource-proxy serve``, ``--tls-cert/--tls-key [--tls-client-ca]``)
    ``check_server_files`` refuses, with one line naming the file, a private key that group or
    others may read or write (mode ``& 0o077``; ``chmod 600`` it), a certificate whose public key
    is not the key's, a certificate that has expired (or is not valid yet), and a client CA file
    without a certificate. Both CLIs turn that into exit status 2 before anything listens.
    ``server_context`` is TLS 1.2 or later; with a client CA it requires a client certificate
    signed by that CA (mTLS): a client without one, or with one from another CA, is refused at
    the handshake, before any HTTP is read.

Identities (mTLS only)
    Both servers' HTTP protocol (``lockd.common.serving.tls_protocol``) puts the ASGI TLS extension
    in every request scope: ``scope["extensions"]["tls"]["client_cert_name"]``, the RFC 4514
    subject of the client's certificate (``None`` without one). ``CertRoles`` maps such subjects to the roles API
    keys grant (``"client"``: what a client API key allows; ``"admin"``: what an admin key allows,
    force-release included). Subjects are compared after parsing (``CN=a, O=b`` equals
    ``CN=a,O=b``); attribute order matters, as in RFC 4514.

Clients
    ``client_context(verify, cert)`` builds what httpx takes as ``verify=``: a CA file (or
    ``True`` for the system's CAs, ``False`` for no check, or your own ``ssl.SSLContext``) and an
    optional client certificate ``(cert_file, key_file)`` or one PEM file holding both.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import ssl
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # cryptography is imported where used: clients never load x509
    from cryptography import x509

__all__ = [
    "CertRoles",
    "TLSConfigError",
    "VerifyTypes",
    "CertTypes",
    "check_server_files",
    "client_context",
    "parse_subjects",
    "server_context",
]

VerifyTypes = ssl.SSLContext | str | os.PathLike[str] | bool
CertTypes = tuple[str | os.PathLike[str], str | os.PathLike[str]] | str | os.PathLike[str] | None


class TLSConfigError(ValueError):
    """A TLS file is unusable; the message is one line naming the file and the reason."""


# --- server start-up checks --------------------------------------------------------------------


def _read(path: str | os.PathLike[str], what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise TLSConfigError(f"cannot read TLS {what} {path}: {exc.strerror or exc}") from None


def _certificates(path: str | os.PathLike[str], what: str) -> list[x509.Certificate]:
    from cryptography import x509

    try:
        certs = x509.load_pem_x509_certificates(_read(path, what))
    except ValueError:
        certs = []
    if not certs:
        raise TLSConfigError(f"TLS {what} {path} holds no PEM certificate")
    return certs


def check_server_files(cert: str | os.PathLike[str], key: str | os.PathLike[str],
                       client_ca: str | os.PathLike[str] | None = None, *,
                       now: dt.datetime | None = None) -> x509.Certificate:
    """Check a server's TLS files before it listens; return the (leaf) certificate.

    Raises ``TLSConfigError`` (one line) for: a key file group or others may access, a key that
    is not PEM (or is encrypted), a certificate that does not match the key, a certificate
    outside its validity period at ``now`` (default: the current UTC time), or a client CA
    file with no certificate.
    """
    from cryptography.hazmat.primitives import serialization

    try:
        mode = stat.S_IMODE(os.stat(key).st_mode)
    except OSError as exc:
        raise TLSConfigError(f"cannot read TLS key {key}: {exc.strerror or exc}") from None
    if mode & 0o077:
        raise TLSConfigError(f"TLS key {key} is readable by others (mode {mode:04o}); "
                             f"chmod 600 it")
    try:
        private = serialization.load_pem_private_key(_read(key, "key"), password=None)
    except TypeError:
        raise TLSConfigError(f"TLS key {key} is encrypted; give an unencrypted PEM key") from None
    except ValueError:
        raise TLSConfigError(f"TLS key {key} is not a PEM private key") from None
    leaf = _certificates(cert, "certificate")[0]
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if leaf.public_key().public_bytes(der, spki) != private.public_key().public_bytes(der, spki):
        raise TLSConfigError(f"TLS certificate {cert} does not match the key {key}")
    now = now or dt.datetime.now(dt.UTC)
    if leaf.not_valid_after_utc <= now:
        raise TLSConfigError(f"TLS certificate {cert} expired on "
                             f"{leaf.not_valid_after_utc:%Y-%m-%d %H:%M:%S} UTC")
    if leaf.not_valid_before_utc > now:
        raise TLSConfigError(f"TLS certificate {cert} is not valid before "
                             f"{leaf.not_valid_before_utc:%Y-%m-%d %H:%M:%S} UTC")
    if client_ca is not None:
        _certificates(client_ca, "client CA")
    return leaf


def server_context(cert: str | os.PathLike[str], key: str | os.PathLike[str],
                   client_ca: str | os.PathLike[str] | None = None) -> ssl.SSLContext:
    """A server ``SSLContext`` (TLS ≥ 1.2); with ``client_ca``, client certificates signed by
    that CA are required (mTLS)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert), str(key))
    if client_ca is not None:
        ctx.load_verify_locations(cafile=str(client_ca))
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


# --- clients -----------------------------------------------------------------------------------


def client_context(verify: VerifyTypes = True, cert: CertTypes = None) -> ssl.SSLContext | bool:
    """What httpx takes as ``verify=``, from a client's ``verify``/``cert`` arguments.

    ``verify``: ``True`` (the system's CAs; returned unchanged when there is no ``cert``, so
    httpx keeps its own default), ``False`` (no server check: tests only), a CA bundle path, or
    an ``ssl.SSLContext`` (used as is; ``cert`` is loaded into it). ``cert``: ``(cert_file,
    key_file)`` or one PEM file with both, presented when the server asks (mTLS). Raises
    ``OSError``/``ssl.SSLError`` for unreadable or invalid files.
    """
    if isinstance(verify, ssl.SSLContext):
        ctx = verify
    elif verify is True:
        if cert is None:
            return True
        ctx = ssl.create_default_context()
    elif verify is False:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx = ssl.create_default_context(cafile=os.fspath(verify))
    if cert is not None:
        if isinstance(cert, tuple):
            ctx.load_cert_chain(os.fspath(cert[0]), os.fspath(cert[1]))
        else:
            ctx.load_cert_chain(os.fspath(cert))
    return ctx


# --- identities --------------------------------------------------------------------------------


_RDN_GAP = re.compile(r"(?<!\\),\s+")  # "CN=a, O=b": blanks after a separating comma


def parse_subjects(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """RFC 4514 subjects from ``;``- or newline-separated text (commas belong to a subject),
    normalised (``CN=a, O=b`` → ``CN=a,O=b``). Raises ``ValueError`` for one that does not parse."""
    from cryptography import x509

    if value is None:
        return ()
    items = value.replace("\n", ";").split(";") if isinstance(value, str) else list(value)
    subjects = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        try:
            name = x509.Name.from_rfc4514_string(_RDN_GAP.sub(",", item))
        except ValueError:
            name = None
        if name is None or not len(name):
            raise ValueError(f"not an RFC 4514 subject (like CN=alice,O=Acme): {item!r}")
        subjects.append(name.rfc4514_string())
    return tuple(subjects)


class CertRoles:
    """Certificate subjects that stand for roles: ``clients`` (what a client API key grants) and
    ``admins`` (what an admin key grants). Subjects as ``parse_subjects`` returns them."""

    __slots__ = ("clients", "admins")

    def __init__(self, clients: Iterable[str] = (), admins: Iterable[str] = ()):
        self.clients = frozenset(parse_subjects(list(clients)))
        self.admins = frozenset(parse_subjects(list(admins)))

    def __bool__(self) -> bool:
        return bool(self.clients or self.admins)

    def role(self, scope: Any) -> str | None:
        """``"admin"``, ``"client"`` or ``None`` for the client certificate of ``scope``."""
        tls = (scope.get("extensions") or {}).get("tls") or {}
        subject = tls.get("client_cert_name")
        if subject is None:
            return None
        if subject in self.admins:
            return "admin"
        if subject in self.clients:
            return "client"
        return None
