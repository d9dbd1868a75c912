"""Access files: named identities (API keys or certificate subjects) and what each may touch.

Both servers read the same shape; each names its own per-client scope field (lockd:
``prefixes``, lock-name prefixes; the proxy: ``tables``)::

    clients:
      - name: billing                 # shown in refusals and logs, never the secret
        key: "s3cret-billing-key"     # or key_sha256: <64 hex digits of SHA-256(key)>
        tables: [ledger, invoices]    # the scope field: a non-empty list of strings
      - name: reports
        subject: "CN=reports,O=Acme"  # a client certificate (needs mTLS)
        tables: ["*"]
    admins:
      - name: ops
        key_sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08

Each entry has a ``name`` and exactly one of ``key``, ``key_sha256``, ``subject``. Refused
(``AccessFileError``, one line naming the file and the entry): an unknown field anywhere, a
missing or empty field, a duplicate name, a key (or digest) or subject used twice, a key under 8
characters, a client without its scope field or with an empty list. Admins have no scope field:
they may touch everything. An identity's ``key_id`` is what ``lockd.common.middleware`` puts in
``scope[KEY_ID]`` for the same credential, so a server maps an authenticated request to its
identity without seeing the secret again.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from lockd.common.tls import parse_subjects

__all__ = ["AccessFile", "AccessFileError", "Identity", "load_access", "parse_access"]

_HEX64 = re.compile(r"[0-9a-f]{64}")
_CREDENTIALS = ("key", "key_sha256", "subject")


class AccessFileError(ValueError):
    """The access file cannot be used; the message is one line naming the file and why."""


@dataclass(frozen=True, slots=True)
class Identity:
    """One named identity. ``digest``: SHA-256 of its key (None for a certificate);
    ``subject``: its normalised RFC 4514 subject (None for a key); ``scope``: the scope
    field's list (None for an admin: everything)."""

    name: str
    role: Literal["client", "admin"]
    digest: bytes | None
    subject: str | None
    scope: tuple[str, ...] | None

    @property
    def key_id(self) -> str:
        """The identity ``RequestMiddleware`` records for this credential (``scope[KEY_ID]``)."""
        if self.digest is not None:
            return self.digest.hex()[:16]
        assert self.subject is not None
        return "cert:" + hashlib.sha256(self.subject.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class AccessFile:
    """The identities of one access file (``clients`` then ``admins``, in file order)."""

    path: str
    identities: tuple[Identity, ...]

    def by_key_id(self) -> dict[str, Identity]:
        """``key_id`` -> identity, for mapping an authenticated request to its identity."""
        return {identity.key_id: identity for identity in self.identities}

    def digests(self, role: str) -> list[bytes]:
        """The key digests of the identities of ``role`` (for ``KeySet.from_digests``)."""
        return [i.digest for i in self.identities if i.role == role and i.digest is not None]

    def subjects(self, role: str) -> list[str]:
        """The certificate subjects of the identities of ``role`` (for ``CertRoles``)."""
        return [i.subject for i in self.identities if i.role == role and i.subject is not None]


def load_access(path: str | Path, *, scope_field: str,
                check_item: Callable[[str], str | None] | None = None) -> AccessFile:
    """Read and check the YAML access file at ``path`` (``parse_access``). Raises
    ``AccessFileError`` for an unreadable file, bad YAML or any rule of the module docstring."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise AccessFileError(f"access file {path}: cannot be read: {exc}") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise AccessFileError(f"access file {path}: not valid YAML{line}") from None
    return parse_access(doc, source=str(path), scope_field=scope_field, check_item=check_item)


def parse_access(doc: Any, *, source: str, scope_field: str,
                 check_item: Callable[[str], str | None] | None = None) -> AccessFile:
    """The identities of an access document (already parsed YAML/JSON). ``scope_field``: the
    clients' list field (``prefixes``, ``tables``); ``check_item(value)`` returns why one item
    of it is refused (None: fine). Raises ``AccessFileError``."""

    def fail(message: str) -> AccessFileError:
        return AccessFileError(f"access file {source}: {message}")

    if not isinstance(doc, dict):
        raise fail("must be a mapping with 'clients' and/or 'admins'")
    unknown = sorted(str(k) for k in doc if k not in ("clients", "admins"))
    if unknown:
        raise fail(f"unknown field(s) {', '.join(unknown)} (expected clients, admins)")
    identities: list[Identity] = []
    seen_names: set[str] = set()
    seen_credentials: dict[bytes | str, str] = {}
    for role, section in (("client", "clients"), ("admin", "admins")):
        entries = doc.get(section) or []
        if not isinstance(entries, list):
            raise fail(f"'{section}' must be a list of identities")
        for index, entry in enumerate(entries):
            where = f"{section}[{index}]"
            identity = _identity(entry, role, where, scope_field, check_item, fail)
            where = f"{where} ({identity.name})"
            if identity.name in seen_names:
                raise fail(f"{where}: the name {identity.name!r} is used twice")
            seen_names.add(identity.name)
            credential: bytes | str = identity.digest or identity.subject or ""
            if credential in seen_credentials:
                what = "key" if identity.digest is not None else "subject"
                raise fail(f"{where}: the same {what} as {seen_credentials[credential]!r}")
            seen_credentials[credential] = identity.name
            identities.append(identity)
    return AccessFile(source, tuple(identities))


def _identity(entry: Any, role: Literal["client", "admin"], where: str, scope_field: str,
              check_item: Callable[[str], str | None] | None,
              fail: Callable[[str], AccessFileError]) -> Identity:
    if not isinstance(entry, dict):
        raise fail(f"{where}: each identity is a mapping with name and key/key_sha256/subject")
    allowed = {"name", *_CREDENTIALS, *((scope_field,) if role == "client" else ())}
    unknown = sorted(str(k) for k in entry if k not in allowed)
    if unknown:
        raise fail(f"{where}: unknown field(s) {', '.join(unknown)} "
                   f"(expected {', '.join(sorted(allowed))})")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise fail(f"{where}: 'name' must be a non-empty string")
    where = f"{where} ({name})"
    given = [field for field in _CREDENTIALS if field in entry]
    if len(given) != 1:
        raise fail(f"{where}: give exactly one of key, key_sha256, subject")
    value = entry[given[0]]
    if not isinstance(value, str) or not value:
        raise fail(f"{where}: '{given[0]}' must be a non-empty string")
    digest = subject = None
    if given[0] == "key":
        if len(value) < 8:
            raise fail(f"{where}: keys must be at least 8 characters long")
        digest = hashlib.sha256(value.encode()).digest()
    elif given[0] == "key_sha256":
        if not _HEX64.fullmatch(value.lower()):
            raise fail(f"{where}: 'key_sha256' must be 64 hex digits (SHA-256 of the key)")
        digest = bytes.fromhex(value)
    else:
        try:
            (subject,) = parse_subjects([value])
        except ValueError as exc:
            raise fail(f"{where}: {exc}") from None
    scope = None
    if role == "client":
        scope = _scope(entry.get(scope_field), f"{where}: '{scope_field}'", check_item, fail)
    return Identity(name, role, digest, subject, scope)


def _scope(items: Any, where: str, check_item: Callable[[str], str | None] | None,
           fail: Callable[[str], AccessFileError]) -> tuple[str, ...]:
    if not isinstance(items, list) or not items:
        raise fail(f"{where} must be a non-empty list")
    for item in items:
        if not isinstance(item, str):
            raise fail(f"{where} must list strings (got {item!r})")
        problem = check_item(item) if check_item is not None else None
        if problem:
            raise fail(f"{where}: {problem}")
    return tuple(_unique(items))


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
