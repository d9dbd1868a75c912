"""Who may use which lock: the access file, and the ONE function that decides (``authorize``).

The access file (``lockd serve --access-file FILE``, ``LOCKD_ACCESS_FILE``) is YAML::

    clients:
      - name: billing                 # 1-64 of A-Za-z0-9._-; in problems, audit lines, metrics
        key_sha256: 9f86d08...        # or key: <the key itself>, or subject: CN=billing,O=Acme
        prefixes: ["billing/"]        # lock-name prefixes it may use; [""] means every lock
    admins:
      - name: oncall
        subject: CN=oncall,O=Acme     # admins use every lock and may force-release

Each entry has exactly one of ``key`` (at least 8 characters), ``key_sha256`` (64 hex digits:
the key's SHA-256, so the file need not hold the secret) or ``subject`` (a client-certificate
subject, RFC 4514; needs mTLS). An unknown field, a duplicate name, key or subject, an empty or
missing ``prefixes`` of a client, or ``prefixes`` on an admin is refused at start
(``AccessFileError``, one line; ``lockd serve`` exits 2). Keys of ``LOCKD_API_KEYS`` /
``LOCKD_ADMIN_KEYS`` and ``LOCKD_CERT_*`` subjects stay valid as unscoped identities.

Decisions are made by name only: ``authorize`` answers 403 ``forbidden_lock`` for a lock outside
the caller's prefixes whether or not the lock exists, so ``GET /v1/locks/{name}`` answers 403
too (not 404): the answer depends only on the name and the caller's own scope, which the caller
already knows, so it tells nothing about other teams' locks. Lists and event streams are
narrowed to the caller's prefixes (``visible_prefixes``, ``covers``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lockd.common.keys import Identity, IdentityTable
from lockd.common.middleware import IDENTITY
from lockd.common.tls import parse_subjects
from lockd.server.errors import ForbiddenLock
from lockd.server.schemas import PREFIX_RE

__all__ = ["AccessFileError", "access_file_problem", "authorize", "covers", "identity_name", "load_access_file",
           "visible_prefixes"]

_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_SHA256_RE = re.compile(r"^[0-9a-fA-F]{64}$")
_FIELDS = {"clients": {"name", "key", "key_sha256", "subject", "prefixes"},
           "admins": {"name", "key", "key_sha256", "subject"}}
ANONYMOUS = "anonymous"
"""The identity name of a request to a lockd that needs no key."""


class AccessFileError(ValueError):
    """The access file cannot be used; the message is one line naming the file and the entry."""


def load_access_file(path: str | Path) -> IdentityTable:
    """The identities of the access file at ``path`` (see the module docstring). Raises
    ``AccessFileError`` for an unreadable file or any entry that breaks the rules."""
    import yaml  # here: a lockd without an access file does not load it at start

    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise AccessFileError(f"cannot read access file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise AccessFileError(f"access file {path} is not valid YAML{where}") from None
    return parse_access(doc or {}, str(path))


def access_file_problem(path: str | Path | None) -> str | None:
    """The one line saying why the access file at ``path`` is unusable; ``None`` if it is
    usable or there is none (the CLI prints it and exits 2 before starting)."""
    if path is None:
        return None
    try:
        load_access_file(path)
    except AccessFileError as exc:
        return str(exc)
    return None


def parse_access(doc: Any, source: str = "access file") -> IdentityTable:
    """The identities of a parsed access document (``load_access_file`` without the reading)."""
    def fail(message: str) -> AccessFileError:
        return AccessFileError(f"{source}: {message}")

    if not isinstance(doc, dict):
        raise fail("must be a mapping with clients: and/or admins:")
    unknown = sorted(set(doc) - set(_FIELDS))
    if unknown:
        raise fail(f"unknown field {unknown[0]!r} (expected clients, admins)")
    keys: list[tuple[bytes, Identity]] = []
    subjects: list[tuple[str, Identity]] = []
    names: set[str] = set()
    seen_keys: set[bytes] = set()
    for section, role in (("clients", "client"), ("admins", "admin")):
        entries = doc.get(section) or []
        if not isinstance(entries, list):
            raise fail(f"{section} must be a list")
        for n, entry in enumerate(entries, 1):
            where = f"{section}[{n}]"
            if not isinstance(entry, dict):
                raise fail(f"{where} must be a mapping")
            extra = sorted(set(entry) - _FIELDS[section])
            if extra:
                raise fail(f"{where}: unknown field {extra[0]!r}")
            name = entry.get("name")
            if not isinstance(name, str) or not _NAME_RE.match(name):
                raise fail(f"{where}: name must be 1-64 characters of A-Za-z0-9._-")
            where = f"{section} entry {name!r}"
            if name in names:
                raise fail(f"duplicate name {name!r}")
            names.add(name)
            prefixes = _prefixes(entry, role, fail, where)
            given = [f for f in ("key", "key_sha256", "subject") if f in entry]
            if len(given) != 1:
                raise fail(f"{where}: needs exactly one of key, key_sha256, subject "
                           f"(got {', '.join(given) or 'none'})")
            value = entry[given[0]]
            if not isinstance(value, str):
                raise fail(f"{where}: {given[0]} must be a string")
            if given[0] == "subject":
                try:
                    (subject,) = parse_subjects([value])
                except ValueError as exc:
                    raise fail(f"{where}: {exc}") from None
                if subject in dict(subjects):
                    raise fail(f"{where}: duplicate subject")
                key_id = "cert:" + hashlib.sha256(subject.encode()).hexdigest()[:16]
                subjects.append((subject, Identity(name, role, key_id, prefixes)))
                continue
            if given[0] == "key":
                if len(value) < 8:
                    raise fail(f"{where}: key must be at least 8 characters long")
                digest = hashlib.sha256(value.encode()).digest()
            else:
                if not _SHA256_RE.match(value):
                    raise fail(f"{where}: key_sha256 must be 64 hex digits")
                digest = bytes.fromhex(value)
            if digest in seen_keys:
                raise fail(f"{where}: duplicate key (another entry has the same key)")
            seen_keys.add(digest)
            keys.append((digest, Identity(name, role, digest.hex()[:16], prefixes)))
    return IdentityTable(keys, subjects)


def _prefixes(entry: dict[str, Any], role: str, fail: Any, where: str) -> tuple[str, ...] | None:
    if role == "admin":
        return None
    prefixes = entry.get("prefixes")
    if not isinstance(prefixes, list) or not prefixes:
        raise fail(f"{where}: prefixes must be a non-empty list ([\"\"] for every lock)")
    for prefix in prefixes:
        if not isinstance(prefix, str) or not PREFIX_RE.fullmatch(prefix):
            raise fail(f"{where}: prefix {prefix!r} is not 0-255 characters of A-Za-z0-9._:/-")
    if "" in prefixes:
        return None
    return tuple(sorted(set(prefixes)))


# --- decisions -----------------------------------------------------------------------------------


def authorize(scope: Any, locks: str | Iterable[str]) -> None:
    """Raise ``ForbiddenLock`` (403) unless the request's identity may use every lock of
    ``locks`` (one name or several: a set is all or nothing, the first lock outside is named).
    Unscoped identities and requests without one pass with one dict lookup."""
    identity: Identity | None = scope.get(IDENTITY)
    if identity is None or identity.prefixes is None:
        return
    prefixes = identity.prefixes
    for lock in (locks,) if isinstance(locks, str) else locks:
        if not lock.startswith(prefixes):
            raise ForbiddenLock(
                f"identity {identity.name!r} may not use lock {lock!r}: it is outside its "
                f"prefixes", lock=lock, identity=identity.name)


def covers(scope: Any, lock: str) -> bool:
    """Whether the request's identity may see ``lock`` (see ``authorize``)."""
    identity: Identity | None = scope.get(IDENTITY)
    return identity is None or identity.prefixes is None or lock.startswith(identity.prefixes)


def visible_prefixes(scope: Any, prefix: str) -> tuple[str, ...]:
    """The prefixes to list for a request for names starting with ``prefix``, narrowed to the
    identity's scope: disjoint (none is a prefix of another) and sorted, so their name ranges
    follow each other in name order and one cursor pages through all of them."""
    identity: Identity | None = scope.get(IDENTITY)
    if identity is None or identity.prefixes is None:
        return (prefix,)
    if prefix.startswith(identity.prefixes):
        return (prefix,)
    inside = sorted(p for p in identity.prefixes if p.startswith(prefix))
    kept: list[str] = []
    for p in inside:
        if not kept or not p.startswith(kept[-1]):
            kept.append(p)
    return tuple(kept)


def identity_name(scope: Any) -> str:
    """The name of the request's identity (``anonymous`` on a lockd that needs no key)."""
    identity: Identity | None = scope.get(IDENTITY)
    return identity.name if identity is not None else ANONYMOUS
