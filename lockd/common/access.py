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
they may touch everything. Each server adds its own rules as parameters: ``check_item`` (one
scope item), ``all_item`` (the item meaning "everything": the identity becomes unscoped) and
``name_re`` (the names it accepts). An identity's ``key_id`` is what
``lockd.common.middleware`` puts in ``scope[KEY_ID]`` for the same credential, so a server maps
an authenticated request to its identity without seeing the secret again; ``AccessFile.by_key``
and ``by_subject`` find the identity of a credential (the key in constant time).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lockd.common.tls import parse_subjects

__all__ = ["AccessFile", "AccessFileError", "Identity", "load_access", "parse_access"]

_HEX64 = re.compile(r"[0-9a-f]{64}")
_CREDENTIALS = ("key", "key_sha256", "subject")


class AccessFileError(ValueError):
    """The access file cannot be used; the message is one line naming the file and why."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who sent a request: ``name`` (for refusals, audit lines and metrics; never a secret),
    ``role`` (``"client"`` or ``"admin"``), ``key_id`` (the stable identity of its key or
    certificate, as ``KeySet.identify`` gives it), ``scope``: the scope field's items (lockd:
    lock-name prefixes; the proxy: tables), ``None`` for everything (an admin, a key of the
    servers' key settings, or ``all_item``). ``digest``: SHA-256 of its key and ``subject``: its
    normalised RFC 4514 subject, for identities of an access file (``None`` otherwise).
    ``more``: the server's further scope fields (the proxy: ``buckets``), ``(field, items)``
    pairs, read with ``scope_of``; ``None`` for an identity no access-file client entry scopes
    (an admin, a key of the servers' key settings)."""

    name: str
    role: str
    key_id: str
    scope: tuple[str, ...] | None = None
    digest: bytes | None = field(default=None, repr=False)
    subject: str | None = None
    more: tuple[tuple[str, tuple[str, ...] | None], ...] | None = None

    def scope_of(self, field_name: str) -> tuple[str, ...] | None:
        """The items of a further scope field: ``None`` (everything) for an identity no client
        entry scopes or a list holding ``all_item``; ``()`` (nothing) for a client whose entry
        leaves the field out."""
        if self.more is None:
            return None
        return dict(self.more).get(field_name, ())


def subject_key_id(subject: str) -> str:
    """The ``key_id`` of a certificate subject (``parse_subjects`` form)."""
    return "cert:" + hashlib.sha256(subject.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class AccessFile:
    """The identities of one access file (``clients`` then ``admins``, in file order)."""

    path: str
    identities: tuple[Identity, ...]
    _subjects: dict[str, Identity] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_subjects", {i.subject: i for i in self.identities
                                               if i.subject is not None})

    def __bool__(self) -> bool:
        return bool(self.identities)

    def by_key(self, presented: bytes | None) -> Identity | None:
        """The identity whose key is ``presented``; ``None`` if none. Compares the key's
        SHA-256 with EVERY digest in constant time, like ``KeySet``."""
        if presented is None or not self.identities:
            return None
        digest = hashlib.sha256(presented).digest()
        found = None
        for identity in self.identities:
            if identity.digest is not None and hmac.compare_digest(identity.digest, digest):
                found = identity
        return found

    def by_subject(self, subject: str | None) -> Identity | None:
        """The identity of a (verified) client-certificate subject, in ``parse_subjects`` form."""
        return None if subject is None else self._subjects.get(subject)

    def subjects(self, role: str) -> list[str]:
        """The certificate subjects of the identities of ``role``, in file order."""
        return [i.subject for i in self.identities if i.role == role and i.subject is not None]


Check = Callable[[str], str | None]
"""Why one value is refused (``None``: fine)."""


def load_access(path: str | Path, *, scope_field: str, check_item: Check | None = None,
                all_item: str | None = None, name_re: re.Pattern[str] | None = None,
                name_rule: str = "a non-empty string",
                more_scopes: dict[str, Check | None] | None = None) -> AccessFile:
    """Read and check the YAML access file at ``path`` (``parse_access``). Raises
    ``AccessFileError`` for an unreadable file, bad YAML or any rule of the module docstring."""
    import yaml  # here: a server without an access file does not load it at start

    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise AccessFileError(f"access file {path}: cannot be read: {exc}") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise AccessFileError(f"access file {path}: not valid YAML{line}") from None
    return parse_access(doc, source=str(path), scope_field=scope_field, check_item=check_item,
                        all_item=all_item, name_re=name_re, name_rule=name_rule,
                        more_scopes=more_scopes)


def parse_access(doc: Any, *, source: str, scope_field: str, check_item: Check | None = None,
                 all_item: str | None = None, name_re: re.Pattern[str] | None = None,
                 name_rule: str = "a non-empty string",
                 more_scopes: dict[str, Check | None] | None = None) -> AccessFile:
    """The identities of an access document (already parsed YAML/JSON; ``None``: empty).
    ``scope_field``: the clients' list field (``prefixes``, ``tables``); ``check_item(value)``
    says why one item of it is refused; a list holding ``all_item`` makes the client unscoped
    (``scope`` None); ``name_re``: the names accepted (``name_rule`` says which, in the
    refusal). ``more_scopes``: further list fields a client may give (field -> its item check),
    each read like the scope field; with them, a client gives at least one of all its scope
    fields, and one it leaves out scopes it to nothing of that kind. Raises
    ``AccessFileError``."""

    def fail(message: str) -> AccessFileError:
        return AccessFileError(f"access file {source}: {message}")

    doc = {} if doc is None else doc
    if not isinstance(doc, dict):
        raise fail("must be a mapping with 'clients' and/or 'admins'")
    unknown = [str(k) for k in doc if k not in ("clients", "admins")]
    if unknown:
        raise fail(f"{_unknown(unknown)} (expected clients, admins)")
    rules = _Rules(scope_field, check_item, all_item, name_re, name_rule, fail,
                   dict(more_scopes or {}))
    identities: list[Identity] = []
    seen_names: set[str] = set()
    seen_credentials: dict[bytes | str, str] = {}
    for role, section in (("client", "clients"), ("admin", "admins")):
        entries = doc.get(section) or []
        if not isinstance(entries, list):
            raise fail(f"'{section}' must be a list of identities")
        for index, entry in enumerate(entries):
            where = f"{section}[{index}]"
            identity = _identity(entry, role, where, rules)
            where = f"{where} ({identity.name})"
            if identity.name in seen_names:
                raise fail(f"{where}: the name {identity.name!r} is used twice")
            seen_names.add(identity.name)
            credential: bytes | str = identity.digest or identity.subject or ""
            if credential in seen_credentials:
                what = "key" if identity.digest is not None else "subject"
                raise fail(f"{where}: duplicate {what} (the same {what} as "
                           f"{seen_credentials[credential]!r})")
            seen_credentials[credential] = identity.name
            identities.append(identity)
    return AccessFile(source, tuple(identities))


@dataclass(frozen=True, slots=True)
class _Rules:
    scope_field: str
    check_item: Check | None
    all_item: str | None
    name_re: re.Pattern[str] | None
    name_rule: str
    fail: Callable[[str], AccessFileError]
    more: dict[str, Check | None] = field(default_factory=dict)


def _unknown(fields: list[str]) -> str:
    return ("unknown field " if len(fields) == 1 else "unknown fields ") + ", ".join(
        repr(f) for f in sorted(fields))


def _identity(entry: Any, role: Literal["client", "admin"], where: str, rules: _Rules) -> Identity:
    fail = rules.fail
    if not isinstance(entry, dict):
        raise fail(f"{where}: each identity is a mapping with name and key/key_sha256/subject")
    allowed = {"name", *_CREDENTIALS,
               *((rules.scope_field, *rules.more) if role == "client" else ())}
    unknown = [str(k) for k in entry if k not in allowed]
    if unknown:
        raise fail(f"{where}: {_unknown(unknown)} (expected {', '.join(sorted(allowed))})")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip() or (
            rules.name_re is not None and not rules.name_re.fullmatch(name)):
        raise fail(f"{where}: name must be {rules.name_rule}")
    where = f"{where} ({name})"
    given = [f for f in _CREDENTIALS if f in entry]
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
    scope: tuple[str, ...] | None = None
    more: list[tuple[str, tuple[str, ...] | None]] | None = None
    if role == "client":
        fields = (rules.scope_field, *rules.more)
        if rules.more and not any(f in entry for f in fields):
            raise fail(f"{where}: give at least one of {', '.join(fields)}")
        scope = (_scope(entry.get(rules.scope_field), where, rules, rules.scope_field,
                        rules.check_item)
                 if rules.scope_field in entry or not rules.more else ())
        more = [(f, _scope(entry[f], where, rules, f, check))
                for f, check in rules.more.items() if f in entry]
    key_id = digest.hex()[:16] if digest is not None else subject_key_id(subject or "")
    return Identity(name, role, key_id, scope, digest, subject,
                    tuple(more) if more is not None else None)


def _scope(items: Any, where: str, rules: _Rules, field_name: str,
           check_item: Check | None) -> tuple[str, ...] | None:
    fail = rules.fail
    if not isinstance(items, list) or not items:
        every = f" ([{rules.all_item!r}] for all)" if rules.all_item is not None else ""
        raise fail(f"{where}: {field_name} must be a non-empty list{every}")
    for item in items:
        if not isinstance(item, str):
            raise fail(f"{where}: {field_name} must list strings (got {item!r})")
        problem = check_item(item) if check_item is not None else None
        if problem:
            raise fail(f"{where}: {field_name}: {problem}")
    if rules.all_item is not None and rules.all_item in items:
        return None
    return tuple(dict.fromkeys(items))
